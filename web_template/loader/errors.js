// Errors the loader throws and the small helpers every module shares.

/** A load or run failure that is not the caller's input; `fallbacks` lists what was tried. */
export class PackLoadError extends Error {
  constructor(message, details = {}) {
    super(message);
    this.name = 'PackLoadError';
    Object.assign(this, details);
  }
}

/** A downloaded file whose bytes differ from manifest.json (size or sha256). Never falls back. */
export class PackIntegrityError extends PackLoadError {
  constructor(message, details = {}) {
    super(message, details);
    this.name = 'PackIntegrityError';
  }
}

/**
 * The app asked for a (bundle, ep, variant) the build refused (a check failed): `run` is the
 * manifest.verification.runs entry that refuses it, `run.detail` the failed check.
 */
export class PackRefusedError extends PackLoadError {
  constructor(message, details = {}) {
    super(message, details);
    this.name = 'PackRefusedError';
  }
}

export class WatchdogError extends PackLoadError {
  constructor(message) {
    super(message);
    this.name = 'WatchdogError';
  }
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export function throwIfAborted(signal) {
  if (signal && signal.aborted) {
    throw signal.reason !== undefined ? signal.reason : new DOMException('load() was aborted', 'AbortError');
  }
}

export function isAbort(error, signal) {
  return Boolean((signal && signal.aborted) || (error && error.name === 'AbortError'));
}

export function messageOf(error) {
  if (error && typeof error === 'object' && 'message' in error) return String(error.message);
  if (typeof error === 'number') return `onnxruntime error code ${error}`;
  return String(error);
}

/** An emit(event) that never lets a throwing listener break the load. */
export function makeEmitter(...listeners) {
  const active = listeners.filter((listener) => typeof listener === 'function');
  return (event) => {
    for (const listener of active) {
      try {
        listener(event);
      } catch (error) {
        console.error('[pack] an event listener threw:', error);
      }
    }
  };
}
