// Demo page script of a pack package (copied from web_template/demo.js). Runs the model on the
// package's sample input through loader.js, compares the outputs with the build's fp32 reference
// and draws input and output: images side by side, waveforms for audio (with players for the
// output and the reference), complex spectrum bins as a spectrum, a line plot otherwise; the
// loader's events become a timeline.
// Sets window.packDemo = { ok, ep, variant, ms, firstResultMs, fetched, verified, selection, comparison, error } at
// the first result, and packDemo.trials once the loader's background trials (if any) are done.
import { compareOutputs, load, thresholdsFor } from './loader.js';
import { numbers } from './loader/tensors.js';
import { audioLayout, describeEvent, spectrumLayout, spectrumMagnitudes, wavBytes } from './loader/present.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const started = performance.now();
const DEFAULT_SAMPLE_RATE = 16000;

function log(event) {
  const { level, text } = describeEvent(event);
  const item = document.createElement('li');
  item.className = level;
  item.dataset.type = event.type;
  const time = document.createElement('span');
  time.className = 'time';
  time.textContent = `+${Math.round(performance.now() - started)} ms`;
  item.append(time, ` ${text}`);
  $('log').append(item);
}

function megabytes(n) {
  return (n / 1e6).toFixed(1) + ' MB';
}

// ----- tensor values as plain numbers -----------------------------------------------------------

function stats(values) {
  let min = Infinity;
  let max = -Infinity;
  let sum = 0;
  let finite = 0;
  for (const v of values) {
    if (!Number.isFinite(v)) continue;
    if (v < min) min = v;
    if (v > max) max = v;
    sum += v;
    finite++;
  }
  return { min, max, mean: finite ? sum / finite : NaN, nonFinite: values.length - finite };
}

// ----- what a tensor looks like ------------------------------------------------------------------

const CHANNELS = [1, 3, 4];

/** { c, h, w, planar } for image-like dims, else null. */
function imageLayout(dims) {
  let d = dims.map(Number);
  while (d.length > 3 && d[0] === 1) d = d.slice(1);
  if (d.length === 3 && CHANNELS.includes(d[0]) && d[1] >= 8 && d[2] >= 8) return { c: d[0], h: d[1], w: d[2], planar: true };
  if (d.length === 3 && CHANNELS.includes(d[2]) && d[0] >= 8 && d[1] >= 8) return { c: d[2], h: d[0], w: d[1], planar: false };
  if (d.length === 2 && d[0] >= 8 && d[1] >= 8) return { c: 1, h: d[0], w: d[1], planar: true };
  return null;
}

function kindOf(spec, tensor) {
  const declared = spec && spec.kind;
  if (declared === 'image' || declared === 'mask') return imageLayout(tensor.dims) ? 'image' : 'tensor';
  if (declared === 'audio') return spectrumLayout(tensor.dims) ? 'spectrum' : 'audio';
  if (declared) return 'tensor';
  if (imageLayout(tensor.dims)) return 'image';
  if (audioLayout(tensor.dims)) return 'audio';
  return 'tensor';
}

// ----- drawing ----------------------------------------------------------------------------------

function byteScale({ min, max }) {
  // Common image ranges first, so a dark image stays dark; else stretch min..max.
  if (min >= -0.01 && max <= 1.01) return (v) => v * 255;
  if (min >= -1.01 && max <= 1.01) return (v) => (v + 1) * 127.5;
  if (min >= 0 && max <= 255) return (v) => v;
  const span = max - min || 1;
  return (v) => ((v - min) / span) * 255;
}

function drawImage(tensor, values, range) {
  const { c, h, w, planar } = imageLayout(tensor.dims);
  const canvas = document.createElement('canvas');
  canvas.className = 'image';
  canvas.width = w;
  canvas.height = h;
  const context = canvas.getContext('2d');
  const image = context.createImageData(w, h);
  const scale = byteScale(range);
  const plane = h * w;
  const at = (channel, pixel) => values[planar ? channel * plane + pixel : pixel * c + channel];
  for (let pixel = 0; pixel < plane; pixel++) {
    const red = scale(at(0, pixel));
    image.data[pixel * 4] = red;
    image.data[pixel * 4 + 1] = c >= 3 ? scale(at(1, pixel)) : red;
    image.data[pixel * 4 + 2] = c >= 3 ? scale(at(2, pixel)) : red;
    image.data[pixel * 4 + 3] = c === 4 ? scale(at(3, pixel)) : 255;
  }
  context.putImageData(image, 0, 0);
  return canvas;
}

function drawWave(values, { channels, length }, range) {
  const canvas = document.createElement('canvas');
  canvas.className = 'wave';
  canvas.width = 800;
  canvas.height = 160;
  const context = canvas.getContext('2d');
  const rows = Math.max(1, channels);
  const rowHeight = canvas.height / rows;
  const peak = Math.max(Math.abs(range.min), Math.abs(range.max)) || 1;
  context.fillStyle = '#2e86de';
  context.strokeStyle = '#2e86de';
  for (let channel = 0; channel < rows; channel++) {
    const middle = rowHeight * (channel + 0.5);
    if (length < canvas.width) {
      // Fewer values than pixels: a line through every value reads better than sparse dots.
      context.beginPath();
      for (let i = 0; i < length; i++) {
        const v = values[channel * length + i];
        const x = length === 1 ? canvas.width / 2 : (i * (canvas.width - 1)) / (length - 1);
        const y = middle - ((Number.isFinite(v) ? v : 0) / peak) * (rowHeight / 2);
        if (i === 0) context.moveTo(x, y);
        else context.lineTo(x, y);
      }
      context.stroke();
      continue;
    }
    for (let x = 0; x < canvas.width; x++) {
      // min/max of each pixel column's slice of samples: a waveform envelope
      const start = Math.floor((x * length) / canvas.width);
      const end = Math.max(start + 1, Math.floor(((x + 1) * length) / canvas.width));
      let low = Infinity;
      let high = -Infinity;
      // up to the next column's first sample, so neighbouring columns join into one trace
      for (let i = start; i <= end && i < length; i++) {
        const v = values[channel * length + i];
        if (v < low) low = v;
        if (v > high) high = v;
      }
      if (!Number.isFinite(low)) continue;
      const top = middle - (high / peak) * (rowHeight / 2);
      const bottom = middle - (low / peak) * (rowHeight / 2);
      context.fillRect(x, top, 1, Math.max(1, bottom - top));
    }
  }
  return canvas;
}

/** Magnitude (dB) per frequency bin of complex spectrum bins: a spectrum frame, not a sound. */
function drawSpectrum(tensor, values) {
  const magnitudes = spectrumMagnitudes(values, tensor.dims);
  const decibels = Array.from(magnitudes, (m) => 20 * Math.log10(Math.max(m, 1e-8)));
  const top = Math.max(...decibels);
  const bottom = Math.max(Math.min(...decibels), top - 100);
  const canvas = document.createElement('canvas');
  canvas.className = 'wave';
  canvas.width = 800;
  canvas.height = 160;
  const context = canvas.getContext('2d');
  context.fillStyle = '#8e44ad';
  const width = canvas.width / decibels.length;
  decibels.forEach((db, bin) => {
    const height = ((Math.max(db, bottom) - bottom) / (top - bottom || 1)) * (canvas.height - 4);
    context.fillRect(bin * width, canvas.height - height, Math.max(1, width - 0.5), height);
  });
  return canvas;
}

/** <audio> players for a tensor (and an output's fp32 reference), at one gain (the reference's peak to 0.9). */
function players(name, tensor, values, reference, sampleRate, label) {
  const layout = audioLayout(tensor.dims);
  if (!layout) return null;
  const box = document.createElement('div');
  box.className = 'players';
  const expected = reference && reference[name] ? numbers(reference[name]) : null;
  const peak = expected ? Math.max(...Array.from(expected, (v) => Math.abs(v) || 0)) : Math.max(Math.abs(stats(values).min), Math.abs(stats(values).max));
  const gain = peak > 0 ? 0.9 / peak : 1;
  const entries = [[label, values]];
  if (expected) entries.push(["build's fp32 reference", expected]);
  for (const [label, data] of entries) {
    const player = document.createElement('div');
    player.className = 'player';
    const audio = document.createElement('audio');
    audio.controls = true;
    audio.preload = 'auto';
    audio.dataset.label = label;
    audio.src = URL.createObjectURL(new Blob([wavBytes(data, layout, sampleRate, gain)], { type: 'audio/wav' }));
    player.append(`${label} (${sampleRate} Hz)`, audio);
    box.append(player);
  }
  return box;
}

function figure(name, tensor, spec, reference = null, sampleRate = DEFAULT_SAMPLE_RATE, label = 'this run') {
  const values = numbers(tensor);
  const range = stats(values);
  const kind = kindOf(spec, tensor);
  const element = document.createElement('figure');
  element.dataset.kind = kind;
  element.dataset.name = name;
  if (kind === 'image') element.append(drawImage(tensor, values, range));
  else if (kind === 'spectrum') element.append(drawSpectrum(tensor, values));
  else if (kind === 'audio') {
    element.append(drawWave(values, audioLayout(tensor.dims) || { channels: 1, length: values.length }, range));
    const sound = players(name, tensor, values, reference, sampleRate, label);
    if (sound) element.append(sound);
  } else element.append(drawWave(values, { channels: 1, length: values.length }, range));
  const caption = document.createElement('figcaption');
  const format = (v) => (Number.isFinite(v) ? Number(v.toPrecision(4)) : v);
  caption.textContent =
    `${name}: ${tensor.type} [${tensor.dims.join(', ')}] (${kind}) · min ${format(range.min)} · max ${format(range.max)} · mean ${format(range.mean)}` +
    (range.nonFinite ? ` · ${range.nonFinite} non-finite` : '');
  element.append(caption);
  return element;
}

function showInfo(rows) {
  $('info').replaceChildren(
    ...rows.map(([key, value]) => {
      const row = document.createElement('tr');
      const head = document.createElement('th');
      const cell = document.createElement('td');
      head.textContent = key;
      cell.textContent = value;
      row.append(head, cell);
      return row;
    }),
  );
}

// ----- comparison with the build's reference --------------------------------------------------

/** { passed, text, ... } for the sample run's outputs against manifest.sample.outputs; passed null when there is no reference. */
function comparison(manifest, info, outputs, reference) {
  if (!reference) {
    return { passed: null, text: 'no comparison: manifest.json has no reference outputs (sample.outputs); rebuild with a newer pack' };
  }
  const thresholds = thresholdsFor(manifest, info.ep, info.variant);
  const result = compareOutputs(manifest, reference, outputs, thresholds);
  const text =
    result.passed === true
      ? `matches the build's fp32 reference: ${result.text}`
      : result.passed === false
        ? `DIFFERS from the build's fp32 reference: ${result.text}`
        : `compared with the build's fp32 reference (manifest.json has no bounds for ${info.ep}/${info.variant}): ${result.text}`;
  return { passed: result.passed, text, outputs: result.outputs };
}

/** Bytes the load fetched so far, from the loader's download events: decoded, on the wire, and from Cache Storage. */
const fetched = { files: 0, bytes: 0, wireBytes: 0, cachedBytes: 0 };
function countBytes(event) {
  if (event.type === 'download') {
    fetched.files += 1;
    fetched.bytes += event.bytes;
    fetched.wireBytes += event.wireBytes ?? event.bytes;
  } else if (event.type === 'cache-hit') fetched.cachedBytes += event.bytes;
}
const fetchedText = (f) => `${megabytes(f.wireBytes)} on the wire (${megabytes(f.bytes)} decoded, ${f.files} files)${f.cachedBytes ? `; ${megabytes(f.cachedBytes)} from the cache` : ''}`;

function selectionText(selection) {
  if (!selection) return 'n/a';
  const times = (selection.candidates || [])
    .map((c) => `${c.ep}/${c.variant} ${c.steadyMs != null ? `${c.steadyMs} ms` : c.priorMs != null ? `~${c.priorMs} ms (build)` : ''} ${c.result && c.result !== 'ok' ? `(${c.result})` : ''}`.replace(/\s+/g, ' ').trim())
    .join(', ');
  const source =
    selection.mode !== 'measured' ? 'chain order'
      : selection.fromCache ? 'measured earlier on this device (cached decision)'
        : selection.pending ? `${selection.startedFrom} (trials after the first result)`
          : selection.trialMs ? 'measured now' : `${selection.startedFrom || 'measured now'}`;
  return `${selection.choice ? `${selection.choice.ep}/${selection.choice.variant}` : '?'} by ${source}${times ? `; candidates: ${times}` : ''}${selection.note ? ` (${selection.note})` : ''}`;
}

// ----- run --------------------------------------------------------------------------------------

// What the page waits for, as the loader's progress phases say (the waits after the downloads
// are the longest on WebGPU: compiling the kernels).
const PHASE_TEXT = {
  download: ({ loaded, total }) => `Downloading… ${megabytes(loaded)} of ${megabytes(total)}`,
  decode: ({ file }) => `Decoding ${file}…`,
  create: ({ state, ep, variant, ms }) => (state === 'start' ? `Creating the ${ep}/${variant} session…` : `Session ready in ${ms} ms`),
  prewarm: ({ state, ms }) => (state === 'start' ? 'Warming up (first run)…' : `Warmed up in ${ms} ms`),
  run: ({ state, ms }) => (state === 'start' ? 'Running…' : `First result in ${ms} ms`),
};

function options() {
  const result = {
    onProgress: (event) => {
      $('progress').max = event.total || 1;
      $('progress').value = event.loaded;
      $('status').textContent = PHASE_TEXT[event.phase](event);
    },
    onEvent: (event) => {
      countBytes(event);
      log(event);
    },
    onSelect: (event) => {
      if (event.type === 'select' && event.phase === 'start') $('status').textContent = `Measuring ${event.candidates.map((c) => `${c.ep}/${c.variant}`).join(', ')} on this device…`;
      else if (event.type === 'trial' && event.phase === 'start') $('status').textContent = `Measuring ${event.ep}/${event.variant}…`;
    },
  };
  if (params.get('ep')) result.executionProviders = params.get('ep').split(',');
  if (params.get('variant')) result.variant = params.get('variant');
  if (params.get('select')) result.select = params.get('select');
  if (params.get('prewarm') === '0') result.prewarm = false;
  if (params.get('cache') === '0') result.cache = false;
  return result;
}

/** The sample rate the build's recipe gave its audio (rendered into index.html: report.json is not
 * published by default), else 16 kHz. */
function sampleRateOf() {
  return Number(document.body.dataset.sampleRate) || DEFAULT_SAMPLE_RATE;
}

async function main() {
  const model = await load(options());
  $('status').textContent = `Running on ${model.info.ep} (${model.info.variant})…`;
  const { feeds, reference } = await model.sample();
  const started = performance.now();
  const outputs = await model.run(feeds);
  const ms = performance.now() - started;
  // From the page's start: what a visitor waits for the first result (downloads, session, run).
  const firstResultMs = performance.now();
  const firstFetched = { ...fetched };
  const info = model.info;
  const compared = comparison(model.manifest, info, outputs, reference);
  const inputSpecs = Object.fromEntries((model.manifest.inputs || []).map((s) => [s.name, s]));
  const outputSpecs = Object.fromEntries((model.manifest.outputs || []).map((s) => [s.name, s]));
  const sampleRate = sampleRateOf();
  $('inputs').replaceChildren(...Object.entries(feeds).map(([name, t]) => figure(name, t, inputSpecs[name], null, sampleRate, 'sample input')));
  $('outputs').replaceChildren(...Object.entries(outputs).map(([name, t]) => figure(name, t, outputSpecs[name], reference, sampleRate)));
  showInfo([
    ['execution provider', info.ep],
    ['variant', info.variant],
    ['verified by the build', info.verified],
    ['choice', selectionText(info.selection)],
    ['runtime bundle', info.bundle],
    ['platform', `${info.platform} (chain ${info.chain.join(' → ')}, ${info.threads} thread${info.threads === 1 ? '' : 's'})`],
    ['run time', `${ms.toFixed(1)} ms`],
    ['first result', `${firstResultMs.toFixed(0)} ms after the page opened`],
    ['fetched for it', fetchedText(firstFetched)],
    ['trials', info.selection && info.selection.pending ? 'after the first result, when the page is idle…' : 'none'],
    ['outputs', compared.text],
    ['fallbacks', info.fallbacks.length ? info.fallbacks.map((f) => `${f.ep}/${f.variant}: ${f.error}`).join('\n') : 'none'],
  ]);
  $('comparison').textContent = compared.text;
  $('comparison').className = compared.passed === false ? 'failed' : compared.passed ? 'ok' : '';
  $('status').textContent = `Done on ${info.ep} (${info.variant}) in ${ms.toFixed(1)} ms.`;
  $('progress').max = 1;
  $('progress').value = 1;
  window.packDemo = {
    ok: true, ep: info.ep, variant: info.variant, ms, firstResultMs, fetched: firstFetched, verified: info.verified, selection: info.selection,
    comparison: { passed: compared.passed, text: compared.text, outputs: compared.outputs || null }, error: null, trials: null,
  };
  // The trials never delay the first result; the choice they make serves later runs and visits.
  const selection = await model.measured;
  const trials = {
    ms: selection && selection.trialMs != null ? selection.trialMs : 0,
    ran: Boolean(selection && selection.trialMs),
    choice: selection && selection.choice,
    bundle: selection && selection.bundle,
    fetched: { files: fetched.files - firstFetched.files, bytes: fetched.bytes - firstFetched.bytes, wireBytes: fetched.wireBytes - firstFetched.wireBytes, cachedBytes: fetched.cachedBytes - firstFetched.cachedBytes },
  };
  const after = model.info;
  const rows = [...$('info').querySelectorAll('tr')].map((row) => [row.cells[0].textContent, row.cells[1].textContent]);
  const set = (key, value) => (rows.find((r) => r[0] === key) || rows[rows.push([key, '']) - 1])[1] = value;
  set('choice', selectionText(after.selection));
  set('trials', trials.ran
    ? `${trials.ms} ms in the background (${fetchedText(trials.fetched)}); later runs use ${after.ep}/${after.variant}, later visits the ${trials.bundle} bundle`
    : `none${after.selection && after.selection.note ? ` (${after.selection.note})` : ''}`);
  showInfo(rows);
  window.packDemo = { ...window.packDemo, selection: after.selection, trials };
}

main().catch((error) => {
  const message = error && error.message ? error.message : String(error);
  $('status').textContent = `Failed: ${message}`;
  $('status').className = 'failed';
  console.error(error);
  window.packDemo = { ok: false, ep: null, variant: null, ms: null, verified: null, selection: null, comparison: null, error: message };
});
