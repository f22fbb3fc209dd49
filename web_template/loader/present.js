// What a page shows of a package (the demo page uses it; apps may too): the loader's events as
// readable timeline lines, the layout of an audio output (a waveform to play, or complex spectrum
// bins to draw as a spectrum), and 16-bit WAV bytes of a waveform for an <audio> element.
// Twin of pipeline/report/figures.py's layout_of (tests/js/present.test.mjs).

const MIN_AUDIO_SAMPLES = 256;
const MAX_WAV_SECONDS = 60;

function squeezed(dims) {
  let d = dims.map(Number);
  while (d.length > 1 && d[0] === 1) d = d.slice(1);
  return d;
}

/** { bins, frames } for complex spectrum bins stored as [.., F, .., 2] (GTCRN's frame), else null. */
export function spectrumLayout(dims) {
  const d = squeezed(dims);
  if (d.length < 2 || d[d.length - 1] !== 2) return null;
  const rest = d.slice(0, -1);
  const count = rest.reduce((a, b) => a * b, 1);
  if (count <= 2) return null;
  const bins = Math.max(...rest);
  return { bins, frames: count / bins };
}

/** { channels, length } for waveform-like dims ([T], [1, T], [1, C, T] with C <= 2), else null. */
export function audioLayout(dims) {
  const d = dims.map(Number);
  const length = d[d.length - 1];
  const channels = d.slice(0, -1).reduce((a, b) => a * b, 1);
  if (length >= MIN_AUDIO_SAMPLES && channels <= 2) return { channels, length };
  return null;
}

/** Magnitude per bin of the first frame of complex bins laid out as spectrumLayout says. */
export function spectrumMagnitudes(values, dims) {
  const layout = spectrumLayout(dims);
  const d = squeezed(dims);
  const rest = d.slice(0, -1);
  const binAxis = rest.indexOf(layout.bins);
  const stride = rest.slice(binAxis + 1).reduce((a, b) => a * b, 1);
  const magnitudes = new Float64Array(layout.bins);
  for (let bin = 0; bin < layout.bins; bin++) {
    const at = bin * stride * 2;
    magnitudes[bin] = Math.hypot(values[at], values[at + 1]);
  }
  return magnitudes;
}

/** RIFF/WAVE bytes: 16-bit PCM of `values` ([channels, length], planar) times `gain`, clipped. */
export function wavBytes(values, { channels, length }, sampleRate, gain = 1) {
  const frames = Math.min(length, sampleRate * MAX_WAV_SECONDS);
  const bytes = new Uint8Array(44 + frames * channels * 2);
  const view = new DataView(bytes.buffer);
  const text = (offset, s) => [...s].forEach((c, i) => view.setUint8(offset + i, c.charCodeAt(0)));
  text(0, 'RIFF');
  view.setUint32(4, 36 + frames * channels * 2, true);
  text(8, 'WAVE');
  text(12, 'fmt ');
  view.setUint32(16, 16, true);
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, channels, true);
  view.setUint32(24, sampleRate, true);
  view.setUint32(28, sampleRate * channels * 2, true);
  view.setUint16(32, channels * 2, true);
  view.setUint16(34, 16, true);
  text(36, 'data');
  view.setUint32(40, frames * channels * 2, true);
  let offset = 44;
  for (let i = 0; i < frames; i++) {
    for (let c = 0; c < channels; c++) {
      const v = Number(values[c * length + i]) * gain;
      const clipped = Number.isFinite(v) ? Math.max(-1, Math.min(1, v)) : 0;
      view.setInt16(offset, Math.round(clipped * 32767), true);
      offset += 2;
    }
  }
  return bytes;
}

function bytesText(n) {
  if (n == null) return '? bytes';
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)} KB`;
  return `${n} B`;
}

const pair = (run) => (run ? `${run.ep}/${run.variant}` : 'nothing');
const ms = (value) => (value == null ? '?' : `${Number(value).toFixed(value >= 10 ? 0 : 1)} ms`);

/** { level: 'info' | 'warning' | 'error', text } for one loader event (load()'s onEvent). */
export function describeEvent(event) {
  switch (event.type) {
    case 'platform':
      return { level: 'info', text: `platform ${event.platform}: chain ${(event.chain || []).join(' → ')}, ${event.threads} thread${event.threads === 1 ? '' : 's'}${event.crossOriginIsolated ? '' : ' (not cross-origin isolated)'}` };
    case 'adapter': {
      if (!event.available) return { level: 'warning', text: `no WebGPU adapter${event.reason ? ` (${event.reason})` : ''}` };
      const info = event.info || {};
      const name = [info.vendor, info.architecture].filter(Boolean).join(' ') || 'unnamed';
      const f16 = (event.features || []).includes('shader-f16') ? 'shader-f16' : 'no shader-f16';
      return { level: 'info', text: `WebGPU adapter ${name} (${f16})` };
    }
    case 'skip':
      return { level: 'warning', text: `skipped ${event.ep ? `${event.ep}/` : ''}${event.variant || '-'}: ${event.reason || 'refused'}` };
    case 'bundle':
      return { level: 'info', text: `runtime bundle ${event.bundle}: ${(event.files || []).length} files, ${bytesText(event.total)} in all` };
    case 'host':
      return event.decodesBrotli === false
        ? { level: 'info', text: `this host serves .br files as they are: ${event.decoder ? `decoding them here (${event.decoder})` : 'no brotli decoder here, the decoded files move'}` }
        : { level: 'info', text: event.decodesBrotli ? 'this host sends brotli bodies with Content-Encoding: br' : `could not tell whether this host decodes brotli (${event.how}); the browser decodes what it sends` };
    case 'download':
      return { level: 'info', text: `downloaded ${event.file} (${bytesText(event.bytes)}${event.decodedBy ? `, ${bytesText(event.wireBytes)} of brotli decoded here` : ''})` };
    case 'cache-hit':
      return { level: 'info', text: `from Cache Storage: ${event.file} (${bytesText(event.bytes)})` };
    case 'session':
      return { level: 'info', text: `session ${pair(event)} created in ${ms(event.ms)}` };
    case 'prewarm':
      return event.error
        ? { level: 'warning', text: `pre-warm of ${pair(event)} failed (${event.error}); ${event.verdict || 'the sample decides'}` }
        : { level: 'info', text: `pre-warmed ${pair(event)} in ${ms(event.ms)}` };
    case 'cache':
      return { level: 'info', text: `Cache Storage holds ${event.held.files} files of this package (${bytesText(event.held.bytes)})${event.evicted.files ? `; removed ${event.evicted.files} files of an earlier version (${bytesText(event.evicted.bytes)})` : ''}` };
    case 'retry':
      return { level: 'warning', text: `retrying ${event.file} (attempt ${event.attempt}, in ${ms(event.delayMs)}): ${event.error}` };
    case 'widen':
      return { level: 'info', text: `widened ${event.variant}'s fp16 weights (${event.tensors} tensors) ${event.where === 'worker' ? 'in a worker' : 'here'} in ${ms(event.ms)}` };
    case 'select':
      return event.phase === 'start'
        ? { level: 'info', text: `measuring ${(event.candidates || []).map(pair).join(', ')} on this device` }
        : { level: 'info', text: `chose ${pair(event.choice)}${event.fromCache ? ' (decision cached earlier on this device)' : ''}` };
    case 'trial':
      return event.phase === 'start'
        ? { level: 'info', text: `trial ${pair(event)}` }
        : { level: event.result === 'ok' ? 'info' : 'warning', text: `trial ${pair(event)}: ${event.result}${event.steadyMs != null ? `, steady ${ms(event.steadyMs)}` : ''}${event.detail ? ` (${event.detail})` : ''}` };
    case 'error':
      return { level: 'error', text: `${pair(event)} failed${event.phase ? ` during ${event.phase}` : ''}: ${event.error}` };
    case 'fallback':
      return { level: 'error', text: `fell back from ${pair(event.from)} to ${pair(event.to)}: ${event.error}` };
    case 'warning':
      return { level: 'warning', text: event.message };
    case 'ready':
      return { level: 'info', text: `ready on ${pair(event)}${event.bundle ? ` (${event.bundle} bundle)` : ''}` };
    default: {
      const { type, ...rest } = event;
      return { level: 'info', text: `${type}: ${JSON.stringify(rest)}` };
    }
  }
}
