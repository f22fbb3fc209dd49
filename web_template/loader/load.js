// load(): fetch the manifest, plan the attempts once (platform chain, adapter, refusals, bundle),
// choose by measurement or by the chain, open the session, and hand back { run, info, ... }.

import { settleAfterLoad } from './cache.js';
import { planVariant, variantModel } from './chunks.js';
import { PackLoadError, PackRefusedError, isAbort, makeEmitter, messageOf, throwIfAborted } from './errors.js';
import { Files, ProgressTracker, fetchManifest, openCache, packageBase } from './files.js';
import { bundleFor, candidatesFor, chainFor, detectEngine, detectPlatform, forEngine, isRefused, normalizeChain, planAttempts, priorsFor, wasmBundlePriors } from './policy.js';
import { Runner, lock, releaseQuietly, serial } from './runner.js';
import { adapterInfo, loadRuntime, probeWebGpu, shippedBundleAt, threadFacts, threadPlan, warnSingleThread } from './runtime.js';
import {
  DEFAULT_SELECT_BUDGET_MS, browserKey, bundleForChoice, decisionKey, defaultStorage, describeResults, packageHash, readDecision, runTrials,
  selectMode, startChoice, trialPlan, trialSlot, trustedWithoutCheck, writeDecision,
} from './select.js';
import { hasReference, prepareFeeds, readSample } from './tensors.js';

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
  const startedMs = performance.now(); // progress events' elapsedMs count from here
  const { signal } = options;
  throwIfAborted(signal);
  const emit = makeEmitter(options.onEvent);
  const onSelect = makeEmitter(options.onSelect);
  const base = packageBase(options.baseUrl);
  const baseUrl = base.url;
  const nav = globalThis.navigator || {};
  const device = { userAgent: nav.userAgent || '', platform: nav.platform || '', maxTouchPoints: nav.maxTouchPoints || 0 };
  const platform = detectPlatform(device);
  // The build's runs as this engine reads them: a pair this engine failed at build time is refused here only.
  const engine = detectEngine(device);
  const manifest = forEngine(await fetchManifest(baseUrl, signal, { how: base.how, emit }), engine);

  const chain = normalizeChain(options.executionProviders || chainFor(manifest, platform));
  // Threads need both cross-origin isolation and SharedArrayBuffer (WebKit has the first without the second).
  const { isolated, shared } = threadFacts(globalThis);
  const cores = nav.hardwareConcurrency;
  const { threads, why: threadsWhy } = threadPlan({ numThreads: options.numThreads, isolated, shared, platform, cores }, emit);
  emit({ type: 'platform', platform, engine, chain: [...chain], threads, threadsWhy, crossOriginIsolated: isolated, sharedArrayBuffer: shared });
  warnSingleThread({ threads, isolated, platform, cores, chain });

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
  let priors = priorsFor(manifest, adapterFacts, priorBundle);

  const plan =
    usable.length === 0
      ? { bundle: priorBundle, attempts: [], skipped: [], unfit: [] }
      : planAttempts(manifest, {
          chain: usable, features, forced: options.variant, bundle: fixedBundle, allowRefused: Boolean(options.allowRefused), adapter: adapterFacts,
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
  let bundle = plan.bundle;
  // The attempts a bundle can run (the wasm-only bundle has no webgpu EP), minus what it refuses.
  const onBundle = (list) => list.filter((a) => (bundle !== 'wasm' || a.ep === 'wasm') && (options.allowRefused || !isRefused(manifest, bundle, a.ep, a.variant)));

  const cache = options.cache === false ? null : await openCache(true, emit);
  const progress = new ProgressTracker(options.onProgress, { started: startedMs });
  const files = new Files({ baseUrl, manifest, cache, progress, emit, signal });

  // Measured choice: candidates on this bundle that the build did not refuse and that can be
  // checked here (reference outputs and bounds) or were verified in a browser at build time. The
  // first result never waits on trials: the load starts on the best-known pair (the build's
  // measurements on this adapter class, else the chain) and the trials run after it, when the page
  // is idle; their decision (pair and bundle) serves later runs and visits.
  let selection = { mode, fromCache: false, choice: null, candidates: plan.attempts.map((a) => ({ ...a, priorMs: priors.get(`${a.ep}/${a.variant}`) ?? null })) };
  let attempts = plan.attempts;
  let trial = null;
  if (mode === 'measured') {
    const runnable = usable.filter((ep) => bundle !== 'wasm' || ep === 'wasm');
    // What the sample holds, from the manifest alone: its file (large on image models, in parts
    // over the build's max_file_mib) is fetched only when trials run (measureLater).
    const sample = { feeds: Boolean(manifest.sample && manifest.sample.file), reference: hasReference(manifest) };
    let trusted = sample.feeds ? trustedWithoutCheck(manifest, sample.reference, candidatesFor(manifest, { chain: runnable, features, bundle, adapter: adapterFacts })) : [];
    const storage = options.storage === undefined ? defaultStorage() : options.storage;
    const key = trusted.length > 1 ? decisionKey({ packageHash: await packageHash(manifest), adapter: adapterFacts, browser: browserKey(nav) }) : null;
    const stored = key ? readDecision(storage, baseUrl.href, key, trusted) : null;
    if (trusted.length <= 1) {
      const why = trusted.length === 1 ? 'one candidate' : sample.reference ? 'no candidate can be checked on this device' : 'manifest.json has no reference outputs to check candidates with';
      selection = { ...selection, mode: trusted.length === 1 ? 'measured' : 'chain', note: why };
      if (trusted.length === 1) attempts = withFirst(trusted[0], plan.attempts);
    } else if (stored) {
      if (!fixedBundle && stored.bundle && stored.bundle !== bundle && manifest.runtime.bundles[stored.bundle]) bundle = stored.bundle;
      attempts = onBundle(withFirst(stored.choice, [...stored.ranking, ...plan.attempts]));
      selection = { mode, fromCache: true, choice: { ...stored.choice }, bundle, candidates: stored.candidates, key, decidedAt: stored.decidedAt, budgetMs: stored.budgetMs };
    } else {
      let start = startChoice(trusted, priors, plan.attempts[0]);
      let notHere = [];
      if (!fixedBundle && start.from === 'build measurements' && bundle === 'webgpu' && manifest.runtime.bundles.wasm) {
        // The decision includes the bundle: the wasm EP on the wasm-only bundle, as the build measured it there.
        const wasmPriors = wasmBundlePriors(manifest, adapterFacts);
        const wasmOnly = trustedWithoutCheck(manifest, sample.reference, candidatesFor(manifest, { chain: ['wasm'], features, bundle: 'wasm' }));
        const best = wasmOnly.length ? startChoice(wasmOnly, wasmPriors, null) : null;
        const time = (pair, map) => map.get(`${pair.ep}/${pair.variant}`);
        if (best && best.from === 'build measurements' && time(best.choice, wasmPriors) < time(start.choice, priors)) start = best;
        const next = bundleForChoice(manifest, bundle, start.choice);
        if (next !== bundle) {
          // The wasm-only bundle has no webgpu EP: those candidates wait for a visit on the webgpu bundle.
          const here = trialPlan(trusted, priors, start.choice);
          const ms = time(start.choice, wasmPriors) ?? time(start.choice, priors);
          notHere = here.skipped.filter((c) => c.ep !== 'wasm');
          notHere.push(...here.order.filter((c) => c.ep !== 'wasm').map((c) => ({ ...c, result: 'skipped', detail: `needs the webgpu bundle; the build measured ${time(c, priors) ?? '?'} ms here against ${ms} ms for ${start.choice.ep}/${start.choice.variant} on the wasm-only bundle` })));
          bundle = next;
          trusted = wasmOnly;
          priors = new Map([...priors, ...wasmPriors]);
        }
      }
      attempts = onBundle(withFirst(start.choice, plan.attempts));
      const planned = trialPlan(trusted, priors, start.choice);
      const { order } = planned;
      const slower = [...planned.skipped, ...notHere];
      const decidedAt = new Date().toISOString();
      if (order.length <= 1) {
        // Nothing left to try: the build's measurements decide (the others far slower here).
        const candidates = describeResults([...order.map((c) => ({ ...c, result: 'prior' })), ...slower]);
        const choice = { ...start.choice };
        writeDecision(storage, baseUrl.href, { key, choice, bundle, ranking: [choice], candidates, decidedAt, budgetMs: 0 });
        selection = { mode, fromCache: false, choice, bundle, candidates, key, decidedAt, budgetMs: 0, trialMs: 0, startedFrom: start.from, note: `the build's measurements on this adapter class decide: nothing else to try on the ${bundle} bundle` };
      } else {
        selection = { mode, fromCache: false, choice: { ...start.choice }, bundle, candidates: trusted.map(({ ep, variant }) => ({ ep, variant, priorMs: priors.get(`${ep}/${variant}`) ?? null })), key, startedFrom: start.from, pending: true };
        trial = { trusted, key, storage };
      }
    }
  }

  const runtime = loadRuntime({ files, manifest, bundleKey: bundle, override, threads, adapter, emit });
  const firstPath = manifest.variants[attempts[0].variant].model;
  planVariant(files, manifest, attempts[0].variant);
  emit({ type: 'bundle', bundle, files: runtime.planned, total: progress.total });

  // Runtime and the first model download side by side.
  const firstModel = { path: firstPath, bytes: variantModel(files, manifest, attempts[0].variant, signal) };
  firstModel.bytes.catch(() => {}); // awaited below; avoid an unhandled rejection if the runtime fails first
  const ort = await runtime.ort();
  await firstModel.bytes;

  const runner = new Runner({ ort, manifest, files, attempts, fallbacks, skipped, options, emit, bundle, platform, engine, chain, threads, threadsWhy, selection: null });
  await runner.openNext({ prewarm: runner.prewarm, signal, firstModel });
  if (mode === 'measured' && selection.fromCache) {
    const done = { type: 'select', phase: 'done', choice: selection.choice, fromCache: true, candidates: selection.candidates };
    emit(done);
    onSelect(done);
  }
  if (!selection.choice) selection.choice = { ep: runner.current.ep, variant: runner.current.variant };
  runner.selection = selection;
  emit({ type: 'ready', ...runner.info() });
  // An earlier version's files leave Cache Storage now, off the way to the first result ('cache' event).
  settleAfterLoad(cache, baseUrl, manifest, emit);

  const exclusive = lock();
  let released = false;
  const stopTrials = new AbortController();
  const measured = trial
    ? measureLater({ trial, runner, exclusive, isReleased: () => released, ort, manifest, files, priors, bundle, fixedBundle, baseUrl, options, emit, onSelect, signal: stopTrials.signal })
    : Promise.resolve(runner.info().selection);
  return {
    get info() {
      return runner.info();
    },
    get session() {
      return runner.current ? runner.current.session : null;
    },
    ort,
    manifest,
    /** The selection once the background trials are done (at once when there are none). */
    measured,
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
      stopTrials.abort();
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

/**
 * The trials of a measured choice, after the first result: when the page is visible and idle,
 * bounded by the budget. The winner becomes the session of later runs (swapped between runs) and
 * the stored decision (pair and bundle) of later visits. Resolves to info.selection.
 */
async function measureLater({ trial, runner, exclusive, isReleased, ort, manifest, files, priors, bundle, fixedBundle, baseUrl, options, emit, onSelect, signal }) {
  const announce = (event) => {
    emit(event);
    onSelect(event);
  };
  const finish = (fields) => {
    runner.selection = { ...runner.selection, pending: false, ...fields };
    return runner.info().selection;
  };
  try {
    const why = await trialSlot(signal);
    if (why) return finish({ note: `trials postponed to a later visit: ${why}` });
    const budgetMs = options.selectBudgetMs ?? DEFAULT_SELECT_BUDGET_MS;
    announce({ type: 'select', phase: 'start', candidates: trial.trusted.map(({ ep, variant }) => ({ ep, variant })), budgetMs });
    const current = runner.current;
    const sample = await readSample(files, manifest, signal);
    let { results, winner, trialMs } = await runTrials({
      ort, manifest, candidates: trial.trusted, priors, first: null, last: current, modelBytes: (variant, sig) => variantModel(files, manifest, variant, sig),
      feeds: prepareFeeds(ort, manifest, sample.feeds), reference: sample.reference, watchdogMs: runner.watchdogMs, budgetMs,
      sessionOptions: options.sessionOptions, emit: announce, signal, pause: () => trialSlot(signal).then(() => {}),
    });
    const candidates = describeResults(results);
    // The budget ran out before the pair serving the app was measured: the others were slow, keep it.
    const incumbent = current && results.find((r) => r.ep === current.ep && r.variant === current.variant);
    if (winner && incumbent && incumbent.result === 'budget') {
      await releaseQuietly(winner.session);
      winner = { ep: current.ep, variant: current.variant, session: current.session };
    }
    if (!winner) return finish({ candidates, trialMs: Math.round(trialMs), note: 'no candidate passed its trial on this device; staying on the first choice' });
    const choice = { ep: winner.ep, variant: winner.variant };
    const ranking = results.filter((r) => r.result === 'ok').sort((a, b) => a.steadyMs - b.steadyMs).map(({ ep, variant }) => ({ ep, variant }));
    // Later runs: the winner's session replaces the current one between two runs.
    const switched = await exclusive(async () => {
      const now = runner.current;
      if (isReleased() || (now && now.ep === winner.ep && now.variant === winner.variant)) {
        await releaseQuietly(winner.session);
        return false;
      }
      runner.attempts = withFirst(winner, [...ranking, ...runner.attempts]);
      runner.adopt(winner);
      if (now) await releaseQuietly(now.session);
      return true;
    });
    const decided = fixedBundle ? bundle : bundleForChoice(manifest, bundle, choice);
    const decidedAt = new Date().toISOString();
    writeDecision(trial.storage, baseUrl.href, { key: trial.key, choice, bundle: decided, ranking, candidates, decidedAt, budgetMs });
    const selection = finish({ choice, bundle: decided, candidates, decidedAt, budgetMs, trialMs: Math.round(trialMs), switched });
    announce({ type: 'select', phase: 'done', choice, fromCache: false, candidates });
    return selection;
  } catch (error) {
    if (isAbort(error, signal)) return finish({ note: 'trials stopped: the model was released' });
    emit({ type: 'warning', message: `background trials failed: ${messageOf(error)}` });
    return finish({ note: `trials failed: ${messageOf(error)}` });
  }
}
