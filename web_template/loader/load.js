// load(): fetch the manifest, plan the attempts once (platform chain, adapter, refusals, bundle),
// choose by measurement or by the chain, open the session, and hand back { run, info, ... }.

import { PackLoadError, PackRefusedError, makeEmitter, throwIfAborted } from './errors.js';
import { Files, ProgressTracker, fetchManifest, openCache } from './files.js';
import { bundleFor, candidatesFor, chainFor, detectPlatform, normalizeChain, planAttempts, priorsFor } from './policy.js';
import { Runner, lock, serial } from './runner.js';
import { adapterInfo, loadRuntime, probeWebGpu, shippedBundleAt, threadCount } from './runtime.js';
import {
  DEFAULT_SELECT_BUDGET_MS, browserKey, decisionKey, defaultStorage, describeResults, packageHash, readDecision, runTrials,
  selectMode, trustedWithoutCheck, writeDecision,
} from './select.js';
import { prepareFeeds, readSample } from './tensors.js';
import { variantBytes } from './widen.js';

function resolveBaseUrl(baseUrl) {
  // The folder of loader.js (one level above this module) unless the app says otherwise.
  if (!baseUrl) return new URL('../', import.meta.url);
  const url = new URL(String(baseUrl), globalThis.location ? location.href : import.meta.url);
  if (!url.pathname.endsWith('/')) url.pathname += '/';
  return url;
}

const samePair = (a, b) => a.ep === b.ep && a.variant === b.variant;

/** `first`, then the attempts of `rest` in order, each pair once. */
export function withFirst(first, rest) {
  const attempts = [];
  for (const a of [first, ...rest]) if (!attempts.some((b) => samePair(a, b))) attempts.push({ ep: a.ep, variant: a.variant });
  return attempts;
}

/**
 * Load the package's model. Resolves to { run, info, session, ort, manifest, sampleFeeds, sample,
 * release }. See loader.d.ts for the options.
 */
export async function load(options = {}) {
  const { signal } = options;
  throwIfAborted(signal);
  const emit = makeEmitter(options.onEvent);
  const onSelect = makeEmitter(options.onSelect);
  const baseUrl = resolveBaseUrl(options.baseUrl);
  const manifest = await fetchManifest(baseUrl, signal);

  const nav = globalThis.navigator || {};
  const platform = detectPlatform({ userAgent: nav.userAgent || '', platform: nav.platform || '', maxTouchPoints: nav.maxTouchPoints || 0 });
  const chain = normalizeChain(options.executionProviders || chainFor(manifest, platform));
  const isolated = globalThis.crossOriginIsolated === true;
  const threads = threadCount({ numThreads: options.numThreads, isolated, platform, cores: nav.hardwareConcurrency }, emit);
  emit({ type: 'platform', platform, chain: [...chain], threads, crossOriginIsolated: isolated });

  const fallbacks = [];
  const skip = (ep, variant, error) => {
    fallbacks.push({ ep, variant, phase: 'select', error, inputShapes: null, outputShapes: null });
    emit({ type: 'fallback', from: { ep, variant }, to: null, error });
  };

  let adapter = null;
  let adapterFacts = null;
  let features = new Set();
  let usable = chain;
  if (chain.includes('webgpu')) {
    const probe = await probeWebGpu(signal);
    adapter = probe.adapter;
    adapterFacts = await adapterInfo(adapter);
    features = adapter ? new Set(adapter.features) : new Set();
    emit({ type: 'adapter', available: Boolean(adapter), attempts: probe.attempts, features: [...features].sort(), info: adapterFacts, reason: probe.reason });
    if (!adapter) {
      skip('webgpu', null, probe.reason);
      usable = chain.filter((ep) => ep !== 'webgpu');
    }
  }

  // A runtime the app chose fixes the bundle: URLs of a shipped bundle are that bundle (checked
  // and cached like any other), other URLs a custom build.
  let override = options.runtime && typeof options.runtime === 'object' ? options.runtime : null;
  const shipped = override && shippedBundleAt(manifest, baseUrl, override);
  if (shipped) override = null;
  const fixedBundle = override ? 'custom' : shipped || (typeof options.runtime === 'string' ? options.runtime : null);
  if (fixedBundle && fixedBundle !== 'custom' && !manifest.runtime.bundles[fixedBundle]) {
    throw new PackLoadError(`runtime "${fixedBundle}" is not in manifest.json runtime.bundles (${Object.keys(manifest.runtime.bundles).join(', ')})`);
  }

  // The app's own variant or runtime is its decision: no trials then.
  const forcedChoice = Boolean(options.variant || options.runtime);
  let mode = forcedChoice ? 'chain' : selectMode(options.select, manifest);
  if (forcedChoice && options.select === 'measured') {
    emit({ type: 'warning', message: 'select: "measured" is ignored when variant or runtime is given' });
  }
  const priorBundle = fixedBundle || (usable.length ? bundleFor(manifest, usable) : null);
  const priors = priorsFor(manifest, adapterFacts, priorBundle);

  const plan =
    usable.length === 0
      ? { bundle: priorBundle, attempts: [], skipped: [], unfit: [] }
      : planAttempts(manifest, {
          chain: usable, features, forced: options.variant, bundle: fixedBundle, allowRefused: Boolean(options.allowRefused),
          priors: mode === 'chain' && priors.size > 0 ? priors : null,
        });
  const { skipped } = plan;
  for (const ep of plan.unfit) {
    skip(ep, null, `no variant in manifest.json fits ${ep} on this device (adapter features: ${[...features].join(', ') || 'none'})`);
  }
  for (const entry of skipped) emit({ type: 'skip', ...entry });
  if (plan.attempts.length === 0) {
    const why = [...fallbacks.map((f) => f.error), ...skipped.map((s) => `${s.ep}/${s.variant} on the ${s.bundle} bundle: ${s.reason}`)];
    const message = `no execution provider can run here (${why.join('; ')})`;
    if (skipped.length > 0 && fallbacks.length === 0) throw new PackRefusedError(`${message}; the build refused it`, { fallbacks, skipped });
    throw new PackLoadError(message, { fallbacks, skipped });
  }
  const bundle = plan.bundle;

  const cache = options.cache === false ? null : await openCache(true, emit);
  const progress = new ProgressTracker(options.onProgress);
  const files = new Files({ baseUrl, manifest, cache, progress, emit, signal });
  const runtime = loadRuntime({ files, manifest, bundleKey: bundle, override, threads, adapter, emit });

  // Measured choice: candidates on this bundle that the build did not refuse and that can be
  // checked here (reference outputs and bounds) or were verified in a browser at build time.
  let selection = { mode, fromCache: false, choice: null, candidates: plan.attempts.map((a) => ({ ...a, priorMs: priors.get(`${a.ep}/${a.variant}`) ?? null })) };
  let attempts = plan.attempts;
  let trial = null;
  if (mode === 'measured') {
    const runnable = usable.filter((ep) => bundle !== 'wasm' || ep === 'wasm');
    const sample = await readSample(files, manifest, signal).catch((error) => {
      if (error instanceof PackLoadError && !manifest.sample) return { feeds: null, reference: null };
      throw error;
    });
    const trusted = sample.feeds ? trustedWithoutCheck(manifest, sample.reference, candidatesFor(manifest, { chain: runnable, features, bundle })) : [];
    const storage = options.storage === undefined ? defaultStorage() : options.storage;
    const key = trusted.length > 1 ? decisionKey({ packageHash: await packageHash(manifest), adapter: adapterFacts, browser: browserKey(nav) }) : null;
    const stored = key ? readDecision(storage, baseUrl.href, key, trusted) : null;
    if (trusted.length <= 1) {
      const why = trusted.length === 1 ? 'one candidate' : sample.reference ? 'no candidate can be checked on this device' : 'manifest.json has no reference outputs to check candidates with';
      selection = { ...selection, mode: trusted.length === 1 ? 'measured' : 'chain', note: why };
      if (trusted.length === 1) attempts = withFirst(trusted[0], plan.attempts);
    } else if (stored) {
      attempts = withFirst(stored.choice, [...stored.ranking, ...plan.attempts]);
      selection = { mode, fromCache: true, choice: { ...stored.choice }, candidates: stored.candidates, key, decidedAt: stored.decidedAt, budgetMs: stored.budgetMs };
    } else {
      trial = { trusted, sample, key, storage };
    }
  }

  const firstPath = manifest.variants[attempts[0].variant].model;
  files.plan(firstPath);
  if (trial) for (const c of trial.trusted) files.plan(manifest.variants[c.variant].model);
  emit({ type: 'bundle', bundle, files: runtime.planned, total: progress.total });

  // Runtime and the first model download side by side.
  const firstModel = { path: firstPath, bytes: variantBytes(files, manifest, attempts[0].variant, signal, emit) };
  firstModel.bytes.catch(() => {}); // awaited below; avoid an unhandled rejection if the runtime fails first
  const ort = await runtime.ort();
  await firstModel.bytes;

  const runner = new Runner({ ort, manifest, files, attempts, fallbacks, skipped, options, emit, bundle, platform, chain, threads, selection: null });
  if (trial) {
    const budgetMs = options.selectBudgetMs ?? DEFAULT_SELECT_BUDGET_MS;
    const modelCache = new Map();
    const modelBytes = (variant, sig) => {
      const path = manifest.variants[variant].model;
      if (path === firstPath) return firstModel.bytes;
      if (!modelCache.has(path)) modelCache.set(path, variantBytes(files, manifest, variant, sig, emit));
      return modelCache.get(path);
    };
    const started = { type: 'select', phase: 'start', candidates: trial.trusted.map(({ ep, variant }) => ({ ep, variant })), budgetMs };
    emit(started);
    onSelect(started);
    const trialEmit = (event) => {
      emit(event);
      onSelect(event);
    };
    const { results, winner, trialMs } = await runTrials({
      ort, manifest, candidates: trial.trusted, priors, first: plan.attempts[0], modelBytes, feeds: prepareFeeds(ort, manifest, trial.sample.feeds),
      reference: trial.sample.reference, watchdogMs: runner.watchdogMs, budgetMs, sessionOptions: options.sessionOptions, emit: trialEmit, signal,
    });
    const candidates = describeResults(results);
    if (!winner) {
      const why = candidates.map((c) => `${c.ep}/${c.variant}: ${c.result}${c.detail ? ` (${c.detail})` : ''}`).join('; ');
      throw new PackLoadError(`no candidate passed its trial on this device (${why})`, { fallbacks, skipped, candidates });
    }
    const ranking = results.filter((r) => r.result === 'ok').sort((a, b) => a.steadyMs - b.steadyMs).map(({ ep, variant }) => ({ ep, variant }));
    runner.attempts = withFirst(winner, [...ranking, ...plan.attempts]);
    runner.adopt(winner);
    const decidedAt = new Date().toISOString();
    const choice = { ep: winner.ep, variant: winner.variant };
    writeDecision(trial.storage, baseUrl.href, { key: trial.key, choice, ranking, candidates, decidedAt, budgetMs });
    selection = { mode, fromCache: false, choice, candidates, key: trial.key, decidedAt, budgetMs, trialMs: Math.round(trialMs) };
    const done = { type: 'select', phase: 'done', choice, fromCache: false, candidates };
    emit(done);
    onSelect(done);
  } else {
    await runner.openNext({ prewarm: runner.prewarm, signal, firstModel });
    if (mode === 'measured' && selection.fromCache) {
      const done = { type: 'select', phase: 'done', choice: selection.choice, fromCache: true, candidates: selection.candidates };
      emit(done);
      onSelect(done);
    }
  }
  if (!selection.choice) selection.choice = { ep: runner.current.ep, variant: runner.current.variant };
  runner.selection = selection;
  emit({ type: 'ready', ...runner.info() });

  const exclusive = lock();
  let released = false;
  return {
    get info() {
      return runner.info();
    },
    get session() {
      return runner.current ? runner.current.session : null;
    },
    ort,
    manifest,
    run(feeds) {
      return exclusive(() => {
        if (released) throw new PackLoadError('run(): this model was released; load() it again');
        return runner.run(feeds);
      });
    },
    sampleFeeds({ signal: sampleSignal } = {}) {
      return readSample(files, manifest, sampleSignal).then((sample) => sample.feeds);
    },
    /** { feeds, reference }: the sample inputs and the build's fp32 outputs for them (null when the manifest has none). */
    sample({ signal: sampleSignal } = {}) {
      return readSample(files, manifest, sampleSignal);
    },
    release() {
      return exclusive(async () => {
        if (released) return;
        released = true;
        const current = runner.current;
        runner.current = null;
        if (current) await serial(() => current.session.release()).catch(() => {});
      });
    },
  };
}
