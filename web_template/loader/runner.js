// Sessions: creation, runs and releases on one queue per page, each under the watchdog, and the
// fallback to the next attempt of the plan when a provider fails.

import { PackIntegrityError, PackLoadError, WatchdogError, isAbort, messageOf, sleep, throwIfAborted } from './errors.js';
import { variantModel } from './chunks.js';
import { verificationStatus } from './policy.js';
import { declaredShapes, prepareFeeds, prewarmFeeds, readSample, shapesOf } from './tensors.js';

export const DEFAULT_WATCHDOG_MS = 60000;
// A session whose run hung may never release; do not wait for it longer than this.
const RELEASE_GRACE_MS = 2000;

/** `promise`, or a WatchdogError naming `what` after `ms` (no limit when ms is not a positive number). */
export function withWatchdog(promise, ms, what) {
  if (!(ms > 0) || !Number.isFinite(ms)) return promise;
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new WatchdogError(`${what} took longer than ${ms} ms (watchdog)`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** A queue: tasks run one after another, a failed one does not stop the next. */
export function lock() {
  let tail = Promise.resolve();
  return (task) => {
    const result = tail.then(task);
    tail = result.catch(() => {});
    return result;
  };
}

// onnxruntime-web keeps one wasm instance per build: sessions are created, run and released one
// at a time, across every model this page loads.
export const serial = lock();

export async function releaseQuietly(session) {
  if (!session) return;
  // Not through the queue: a hung run holds it until its watchdog fires, and release must not wait on it.
  await Promise.race([Promise.resolve().then(() => session.release()).catch(() => {}), sleep(RELEASE_GRACE_MS)]);
}

export function epSpec(manifest, ep) {
  const options = (manifest.epOptions && manifest.epOptions[ep]) || {};
  if (ep === 'webgpu' && options.preferredLayout) return { name: 'webgpu', preferredLayout: options.preferredLayout };
  return ep;
}

/** Session creation for one (ep, variant) under 3 × the watchdog; resolves to { session, createMs }. */
export async function createSession({ ort, manifest, bytes, ep, variant, sessionOptions, watchdogMs }) {
  const options = { ...(sessionOptions || {}), executionProviders: [epSpec(manifest, ep)] };
  // `bytes`: the model file, or variantModel()'s { bytes, externalData } (chunks.js).
  const model = bytes instanceof Uint8Array ? { bytes } : bytes;
  if (model.externalData) options.externalData = [...(options.externalData || []), ...model.externalData];
  const started = performance.now();
  const session = await serial(() =>
    withWatchdog(ort.InferenceSession.create(model.bytes, options), 3 * watchdogMs, `${ep}/${variant} session creation`),
  );
  return { session, createMs: performance.now() - started };
}

/** One run under the watchdog, through the page's queue. */
export function runSession(session, tensors, watchdogMs, what) {
  return serial(() => withWatchdog(session.run(tensors), watchdogMs, what));
}

export class Runner {
  constructor({ ort, manifest, files, attempts, fallbacks, skipped, options, emit, bundle, platform, engine = null, chain, threads, threadsWhy = null, selection }) {
    Object.assign(this, { ort, manifest, files, attempts, fallbacks, skipped, options, emit, bundle, platform, engine, chain, threads, threadsWhy, selection });
    this.next = 0;
    this.current = null; // { ep, variant, session }
    this.ranOnce = false; // the app's first run is reported as a progress phase
    this.watchdogMs = options.watchdogMs ?? (manifest.loader && manifest.loader.watchdogMs) ?? DEFAULT_WATCHDOG_MS;
    this.prewarm = options.prewarm ?? (manifest.loader && manifest.loader.prewarm) ?? true;
    this.prewarmError = null; // { ep, variant, error, verdict }: a pre-warm error that was not the provider's
  }

  /** A progress phase of this load (the Files' tracker): returns the function that ends it. */
  phase(name, details) {
    const tracker = this.files.progress;
    return tracker ? tracker.begin(name, details) : () => {};
  }

  modelBytes(variant, signal) {
    return variantModel(this.files, this.manifest, variant, signal);
  }

  /** A session opened elsewhere (the measured choice's trial) becomes the current one. */
  adopt(current) {
    const index = this.attempts.findIndex((a) => a.ep === current.ep && a.variant === current.variant);
    if (index >= 0) this.attempts.splice(index, 1);
    this.attempts.unshift({ ep: current.ep, variant: current.variant });
    this.next = 1;
    this.current = current;
  }

  /** Opens the next attempt that works; throws PackLoadError when none is left. */
  async openNext({ prewarm, signal, firstModel }) {
    while (this.next < this.attempts.length) {
      const { ep, variant } = this.attempts[this.next++];
      const modelPath = this.manifest.variants[variant].model;
      let session = null;
      let inputShapes = null;
      try {
        throwIfAborted(signal);
        const bytes = firstModel && firstModel.path === modelPath ? await firstModel.bytes : await this.modelBytes(variant, signal);
        throwIfAborted(signal);
        const createDone = this.phase('create', { ep, variant });
        const created = await createSession({
          ort: this.ort, manifest: this.manifest, bytes, ep, variant, sessionOptions: this.options.sessionOptions, watchdogMs: this.watchdogMs,
        });
        session = created.session;
        createDone({ ms: Math.round(created.createMs) });
        this.emit({ type: 'session', ep, variant, ms: created.createMs });
        throwIfAborted(signal);
        if (prewarm) {
          const feeds = prewarmFeeds(this.ort, this.manifest);
          inputShapes = shapesOf(feeds);
          const held = { session };
          const prewarmDone = this.phase('prewarm', { ep, variant });
          try {
            await this.prewarmRun({ ep, variant, held, bytes, feeds, signal });
            prewarmDone();
          } finally {
            session = held.session; // a fresh one when the pre-warm failed (released on a failure below)
          }
        }
        this.current = { ep, variant, session };
        return this.current;
      } catch (error) {
        if (error instanceof PackIntegrityError || isAbort(error, signal)) {
          await releaseQuietly(session);
          throw error;
        }
        await this.fail({ ep, variant, session }, error, session ? (prewarm ? 'prewarm' : 'create') : 'create', inputShapes);
      }
    }
    const tried = this.fallbacks.map((f) => `${f.ep}${f.variant ? '/' + f.variant : ''}: ${f.error}`).join('; ');
    throw new PackLoadError(`no execution provider worked (${tried || 'empty chain'})`, { fallbacks: [...this.fallbacks] });
  }

  /**
   * The pre-warm run. Its feeds are made up (the sample's values on small inputs, zeros elsewhere),
   * so an error there is not yet the provider's: a fresh session (onnxruntime-web 1.30's WebGPU
   * session hangs the page on its next run after a failed one) runs the sample itself (its file
   * fetched only now), and only when that fails too does the provider fail (the error names both).
   * A watchdog timeout fails the provider at once (a hung device is not a matter of values);
   * without a sample file, the app's first run decides. `held.session` is the session to keep.
   * Throws what counts as the provider's failure.
   */
  async prewarmRun({ ep, variant, held, bytes, feeds, signal }) {
    const warmStart = performance.now();
    try {
      await runSession(held.session, feeds, this.watchdogMs, `${ep}/${variant} pre-warm run`);
      this.emit({ type: 'prewarm', ep, variant, ms: performance.now() - warmStart });
      return;
    } catch (error) {
      if (error instanceof WatchdogError || isAbort(error, signal)) throw error;
      const prewarmError = messageOf(error);
      let sample = null;
      let verdict = 'no sample file in manifest.json: the first run decides';
      if (this.manifest.sample && this.manifest.sample.file) {
        try {
          sample = await readSample(this.files, this.manifest, signal);
        } catch (sampleError) {
          if (sampleError instanceof PackIntegrityError || isAbort(sampleError, signal)) throw sampleError;
          verdict = `the sample could not be read (${messageOf(sampleError)}): the first run decides`;
        }
      }
      const failed = held.session;
      held.session = null;
      await releaseQuietly(failed);
      const created = await createSession({
        ort: this.ort, manifest: this.manifest, bytes, ep, variant, sessionOptions: this.options.sessionOptions, watchdogMs: this.watchdogMs,
      });
      held.session = created.session;
      if (sample) {
        try {
          await runSession(held.session, prepareFeeds(this.ort, this.manifest, sample.feeds), this.watchdogMs, `${ep}/${variant} sample run`);
        } catch (sampleRunError) {
          if (isAbort(sampleRunError, signal)) throw sampleRunError;
          throw new Error(`pre-warm run failed (${prewarmError}) and so did the sample run (${messageOf(sampleRunError)})`);
        }
        verdict = 'the sample ran: not a provider failure';
      }
      this.prewarmError = { ep, variant, error: prewarmError, verdict };
      const message = `${ep}/${variant} pre-warm run failed on the pre-warm feeds (${prewarmError}); ${verdict}`;
      console.warn(`[pack] ${message}`);
      this.emit({ type: 'prewarm', ep, variant, ms: performance.now() - warmStart, error: prewarmError, verdict });
      this.emit({ type: 'warning', message });
    }
  }

  /** Records a failure once (console + event), releases the session. */
  async fail({ ep, variant, session }, error, phase, inputShapes) {
    const outputShapes = declaredShapes(this.manifest.outputs);
    // Before any run the declared input shapes are the best there is.
    inputShapes = inputShapes || declaredShapes(this.manifest.inputs);
    const failure = { ep, variant, phase, error: messageOf(error), inputShapes, outputShapes };
    this.fallbacks.push(failure);
    const upcoming = this.attempts[this.next];
    const next = upcoming ? `falling back to ${upcoming.ep}/${upcoming.variant}` : 'no provider left';
    console.warn(
      `[pack] ${ep}/${variant} failed during ${phase}: ${failure.error}; ` +
        `input shapes ${JSON.stringify(inputShapes)}; output shapes ${JSON.stringify(outputShapes)}; ${next}`,
    );
    this.emit({ type: 'error', ...failure });
    this.emit({ type: 'fallback', from: { ep, variant }, to: upcoming ? { ...upcoming } : null, error: failure.error });
    if (this.current && this.current.session === session) this.current = null;
    await releaseQuietly(session);
  }

  async run(feeds) {
    const tensors = prepareFeeds(this.ort, this.manifest, feeds);
    for (;;) {
      const current = this.current || (await this.openNext({ prewarm: false, signal: null }));
      const { ep, variant, session } = current;
      // the app's first run is the last wait of a load: a progress phase of its own
      const runDone = this.ranOnce ? null : this.phase('run', { ep, variant });
      try {
        const outputs = await runSession(session, tensors, this.watchdogMs, `${ep}/${variant} run`);
        this.ranOnce = true;
        if (runDone) runDone();
        return outputs;
      } catch (error) {
        await this.fail(current, error, 'run', shapesOf(tensors));
      }
    }
  }

  info() {
    const { ep = null, variant = null } = this.current || {};
    return {
      ep,
      variant,
      bundle: this.bundle,
      platform: this.platform,
      engine: this.engine,
      chain: [...this.chain],
      threads: this.threads,
      threadsWhy: this.threadsWhy,
      verified: this.current ? verificationStatus(this.manifest, this.bundle, ep, variant) : null,
      fallbacks: this.fallbacks.map((f) => ({ ...f })),
      skipped: this.skipped.map((s) => ({ ...s, run: s.run ? { ...s.run } : s.run })),
      selection: this.selection ? JSON.parse(JSON.stringify(this.selection)) : null,
      prewarmError: this.prewarmError ? { ...this.prewarmError } : null,
    };
  }
}
