// The measured choice: on the first load on a device, each candidate (EP, variant) runs the sample
// input a few times within a time budget; a candidate whose outputs disagree with the build's fp32
// reference (beyond manifest.thresholds[ep][variant]) is dropped, the fastest is kept. The decision
// is stored per (package content hash, adapter, browser) and reused without trials.

import { PackLoadError, isAbort, messageOf, throwIfAborted } from './errors.js';
import { sha256Hex } from './files.js';
import { compareOutputs, thresholdsFor } from './compare.js';
import { adapterKey, farSlower, FAR_SLOWER, isRefused } from './policy.js';
import { createSession, releaseQuietly, runSession } from './runner.js';

export const SELECT_MODES = Object.freeze(['measured', 'chain']);
export const DEFAULT_SELECT_BUDGET_MS = 4000;
// Timed runs per candidate after the first (which is compared with the reference, not timed).
export const TRIAL_RUNS = 3;
const STORAGE_PREFIX = 'pack-select-v1:';
// Trials wait for an idle moment at most this long (requestIdleCallback's timeout).
export const IDLE_TIMEOUT_MS = 2000;
// Below this battery level, and not charging, trials wait for a later visit.
export const LOW_BATTERY = 0.2;

const pairKey = (c) => `${c.ep}/${c.variant}`;

/**
 * The pair a measured load starts on before any trial: the fastest the build measured on this
 * adapter class (`priors`) among the candidates, else the chain's first choice. { choice, from }.
 */
export function startChoice(candidates, priors, first) {
  const measured = candidates.filter((c) => priors.has(pairKey(c)));
  if (measured.length > 0) {
    const best = measured.reduce((a, b) => (priors.get(pairKey(b)) < priors.get(pairKey(a)) ? b : a));
    return { choice: { ep: best.ep, variant: best.variant }, from: 'build measurements' };
  }
  const chain = (first && candidates.find((c) => c.ep === first.ep && c.variant === first.variant)) || candidates[0];
  return { choice: { ep: chain.ep, variant: chain.variant }, from: 'chain' };
}

/**
 * The bundle a choice loads from then on: the wasm-only bundle when wasm is chosen on the webgpu
 * bundle (it is smaller, and faster on the wasm EP), unless the build refused the pair there.
 */
export function bundleForChoice(manifest, bundle, choice) {
  const bundles = (manifest.runtime && manifest.runtime.bundles) || {};
  if (choice.ep === 'wasm' && bundle === 'webgpu' && bundles.wasm && !isRefused(manifest, 'wasm', 'wasm', choice.variant)) return 'wasm';
  return bundle;
}

/**
 * Waits until trials may run: the page is visible (hidden pages never run them) and idle
 * (requestIdleCallback, at most IDLE_TIMEOUT_MS). Resolves to null, or to why they should wait
 * for a later visit (a battery the platform reports low and not charging, Save-Data).
 */
export async function trialSlot(signal, env = globalThis) {
  const doc = env.document;
  if (doc && doc.visibilityState === 'hidden') {
    await new Promise((resolve) => {
      const done = () => {
        if (doc.visibilityState === 'hidden' && !(signal && signal.aborted)) return;
        doc.removeEventListener('visibilitychange', done);
        resolve();
      };
      doc.addEventListener('visibilitychange', done);
      if (signal) signal.addEventListener('abort', done, { once: true });
    });
  }
  throwIfAborted(signal);
  const nav = env.navigator || {};
  if (nav.connection && nav.connection.saveData) return 'the browser asks to save data (Save-Data)';
  if (typeof nav.getBattery === 'function') {
    const battery = await nav.getBattery().catch(() => null);
    if (battery && !battery.charging && battery.level < LOW_BATTERY) return `battery at ${Math.round(battery.level * 100)} % and not charging`;
  }
  await new Promise((resolve) => {
    if (typeof env.requestIdleCallback === 'function') env.requestIdleCallback(() => resolve(), { timeout: IDLE_TIMEOUT_MS });
    else setTimeout(resolve, 0);
  });
  throwIfAborted(signal);
  return null;
}

/** 'measured' or 'chain': the app's option, else manifest.loader.select, else 'chain'. */
export function selectMode(option, manifest) {
  const mode = option ?? (manifest.loader && manifest.loader.select) ?? 'chain';
  if (!SELECT_MODES.includes(mode)) throw new PackLoadError(`select must be one of ${SELECT_MODES.join(', ')}, got ${JSON.stringify(mode)}`);
  return mode;
}

/**
 * The part of the package a decision depends on: what changes a candidate's speed or results (the
 * models and their weight chunks, the runtime files, the EP options). A rebuild that changes only
 * report.json, the demo page or the loader keeps every user's decision.
 */
export async function packageHash(manifest) {
  const files = manifest.files || {};
  const paths = new Set();
  for (const variant of Object.values(manifest.variants || {})) {
    paths.add(variant.model);
    for (const chunk of (variant.externalData && variant.externalData.chunks) || []) paths.add(chunk.file);
  }
  for (const bundle of Object.values((manifest.runtime && manifest.runtime.bundles) || {})) {
    for (const part of ['module', 'wasm', 'glue']) if (bundle[part]) paths.add(bundle[part]);
  }
  const lines = [...paths]
    .sort()
    .map((path) => `${path} ${(files[path] || {}).sha256 || '?'}\n`)
    .join('');
  return sha256Hex(new TextEncoder().encode(`${lines}epOptions ${JSON.stringify(manifest.epOptions || {})}\n`));
}

/** "Chromium/131", "Firefox/133", "Safari/18.1": the browser brand and major version a decision holds for. */
export function browserKey({ userAgent = '', userAgentData = null } = {}) {
  const brands = (userAgentData && userAgentData.brands) || [];
  const real = brands.filter((b) => b && b.brand && !/not.?a.?brand/i.test(b.brand));
  const named = real.find((b) => !/^Chromium$/i.test(b.brand)) || real[0];
  if (named) return `${named.brand}/${named.version}`;
  const patterns = [
    [/\bEdg\/(\d+)/, 'Microsoft Edge'],
    [/\bFirefox\/(\d+)/, 'Firefox'],
    [/\bCriOS\/(\d+)/, 'Chrome iOS'],
    [/\bChrome\/(\d+)/, 'Chromium'],
    [/\bVersion\/(\d+(?:\.\d+)?).*Safari\//, 'Safari'],
  ];
  for (const [pattern, brand] of patterns) {
    const match = userAgent.match(pattern);
    if (match) return `${brand}/${match[1]}`;
  }
  return userAgent || 'unknown';
}

/** The key a stored decision is valid for. */
export function decisionKey({ packageHash: hash, adapter, browser }) {
  return { package: hash, adapter: adapterKey(adapter), browser };
}

const sameKey = (a, b) => JSON.stringify(a) === JSON.stringify(b);

/** localStorage when it works (it throws in some private modes and sandboxed frames), else null. */
export function defaultStorage() {
  try {
    const storage = globalThis.localStorage;
    if (!storage) return null;
    const probe = `${STORAGE_PREFIX}probe`;
    storage.setItem(probe, '1');
    storage.removeItem(probe);
    return storage;
  } catch {
    return null;
  }
}

/**
 * The stored decision for this package URL when its key equals `key` and its choice is still one
 * of `candidates`; else null (a changed package, adapter or browser invalidates it).
 */
export function readDecision(storage, slot, key, candidates) {
  if (!storage) return null;
  let stored;
  try {
    stored = JSON.parse(storage.getItem(STORAGE_PREFIX + slot) || 'null');
  } catch {
    return null;
  }
  if (!stored || !sameKey(stored.key, key) || !stored.choice) return null;
  const { ep, variant } = stored.choice;
  if (!candidates.some((c) => c.ep === ep && c.variant === variant)) return null;
  return stored;
}

export function writeDecision(storage, slot, decision) {
  if (!storage) return false;
  try {
    storage.setItem(STORAGE_PREFIX + slot, JSON.stringify(decision));
    return true;
  } catch {
    return false;
  }
}

const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted.length ? sorted[Math.floor(sorted.length / 2)] : null;
};

/**
 * The order trials run in, and the candidates skipped before any trial: the plan's first choice
 * first, then by prior time; candidates the priors put more than FAR_SLOWER × the best are skipped.
 */
export function trialPlan(candidates, priors, first, last = null) {
  const slow = new Set(farSlower(candidates, priors).map((c) => `${c.ep}/${c.variant}`));
  const best = Math.min(...candidates.map((c) => priors.get(`${c.ep}/${c.variant}`) ?? Infinity));
  const skipped = [];
  const kept = [];
  candidates.forEach((c, index) => {
    const key = `${c.ep}/${c.variant}`;
    if (slow.has(key)) {
      const ratio = priors.get(key) / best;
      skipped.push({ ...c, result: 'skipped', priorMs: priors.get(key), detail: `measured ${ratio.toFixed(1)}× slower than the best on this adapter class at build time (> ${FAR_SLOWER}×)` });
    } else {
      kept.push({ ...c, index, priorMs: priors.get(key) ?? null });
    }
  });
  const is = (c, pair) => Boolean(pair) && c.ep === pair.ep && c.variant === pair.variant;
  // `last`: the pair already serving the app (background trials look for something better first).
  const rank = (c) => (is(c, first) ? -1 : c.priorMs ?? Infinity);
  kept.sort((a, b) => is(a, last) - is(b, last) || rank(a) - rank(b) || a.index - b.index);
  return { order: kept.map(({ index, ...c }) => c), skipped };
}

/** Whether a candidate can be judged on this device: it needs the reference and the build's bounds. */
export function checkable(manifest, reference, candidate) {
  return Boolean(reference && thresholdsFor(manifest, candidate.ep, candidate.variant));
}

/**
 * Run the trials. Resolves to { results, winner } where winner = { ep, variant, session } (its
 * session kept open) or null, and results lists every candidate with its figures: result 'ok',
 * 'mismatch' (outputs disagree with the reference), 'failed' (creation or run threw), 'skipped'
 * (priors) or 'budget' (four times the budget was spent before its turn).
 */
export async function runTrials({ ort, manifest, candidates, priors, first, last = null, modelBytes, feeds, reference, watchdogMs, budgetMs, sessionOptions, emit, signal, pause = null }) {
  const { order, skipped } = trialPlan(candidates, priors, first, last);
  const results = [...skipped];
  const started = performance.now();
  // The budget bounds the time spent running the sample; downloads and session creation are not
  // counted (paid once per device, and the chosen session is kept). Every candidate gets its checked
  // first run and one timed run; further timed runs stop at its equal share of the budget, and no
  // candidate starts once four times the budget is spent (a pathologically slow first candidate).
  const share = budgetMs / Math.max(order.length, 1);
  let spent = 0;
  const timed = async (task) => {
    const t = performance.now();
    try {
      return await task();
    } finally {
      spent += performance.now() - t;
    }
  };
  let best = null; // { ep, variant, session, steadyMs }
  for (const candidate of order) {
    try {
      // Between candidates: wait for the page to be visible and idle again.
      if (pause) await pause();
      throwIfAborted(signal);
    } catch (error) {
      if (best) await releaseQuietly(best.session);
      throw error;
    }
    const { ep, variant } = candidate;
    if (best && spent > 4 * budgetMs) {
      results.push({ ...candidate, result: 'budget', detail: `${Math.round(spent)} ms of trial runs spent, over four times the ${budgetMs} ms budget` });
      continue;
    }
    emit({ type: 'trial', phase: 'start', ep, variant });
    const row = { ...candidate, createMs: null, firstMs: null, steadyMs: null, runs: 0 };
    let session = null;
    try {
      const bytes = await modelBytes(variant, signal);
      const created = await createSession({ ort, manifest, bytes, ep, variant, sessionOptions, watchdogMs });
      session = created.session;
      row.createMs = created.createMs;
      const spentBefore = spent;
      let t = performance.now();
      const outputs = await timed(() => runSession(session, feeds, watchdogMs, `${ep}/${variant} trial run`));
      row.firstMs = performance.now() - t;
      if (checkable(manifest, reference, candidate)) {
        const comparison = compareOutputs(manifest, reference, outputs, thresholdsFor(manifest, ep, variant));
        row.comparison = comparison.text;
        if (!comparison.passed) {
          Object.assign(row, { result: 'mismatch', detail: `outputs disagree with the build's fp32 reference: ${comparison.text}` });
        }
      }
      if (!row.result) {
        const times = [];
        while (times.length < TRIAL_RUNS && (times.length === 0 || spent - spentBefore < share)) {
          t = performance.now();
          await timed(() => runSession(session, feeds, watchdogMs, `${ep}/${variant} trial run`));
          times.push(performance.now() - t);
        }
        Object.assign(row, { result: 'ok', runs: times.length, steadyMs: median(times) });
      }
    } catch (error) {
      if (isAbort(error, signal)) {
        await releaseQuietly(session);
        if (best) await releaseQuietly(best.session);
        throw error;
      }
      Object.assign(row, { result: 'failed', detail: messageOf(error) });
    }
    results.push(row);
    emit({ type: 'trial', phase: 'done', ...row });
    if (row.result === 'ok' && (!best || row.steadyMs < best.steadyMs)) {
      if (best) await releaseQuietly(best.session);
      best = { ep, variant, session, steadyMs: row.steadyMs };
    } else {
      await releaseQuietly(session);
    }
  }
  const trialMs = performance.now() - started;
  return { results, winner: best && { ep: best.ep, variant: best.variant, session: best.session }, trialMs, runMs: spent };
}

/** Results as info.selection.candidates: numbers rounded to 0.01 ms, in trial order. */
export function describeResults(results) {
  const round = (v) => (typeof v === 'number' ? Math.round(v * 100) / 100 : v ?? null);
  return results.map((r) => ({
    ep: r.ep,
    variant: r.variant,
    result: r.result,
    createMs: round(r.createMs),
    firstMs: round(r.firstMs),
    steadyMs: round(r.steadyMs),
    priorMs: round(r.priorMs),
    runs: r.runs || 0,
    ...(r.comparison ? { comparison: r.comparison } : {}),
    ...(r.detail ? { detail: r.detail } : {}),
  }));
}

/**
 * Candidates that may be chosen without a check on this device: the build verified them in a
 * browser. An fp32 candidate is left out where a widened one (fp16w: the fp32 graph, weights shipped
 * as fp16) is trusted on the same EP: the same kernels, so timing fp32 too would only download
 * twice the bytes; fp32 stays in the plan as the fallback.
 */
export function trustedWithoutCheck(manifest, reference, candidates) {
  const trusted = candidates.filter((c) => checkable(manifest, reference, c) || c.status === 'passed');
  const spec = (c) => (manifest.variants || {})[c.variant] || {};
  const widened = new Set(trusted.filter((c) => spec(c).widen).map((c) => c.ep));
  return trusted.filter((c) => !(widened.has(c.ep) && spec(c).precision === 'fp32' && !spec(c).widen));
}
