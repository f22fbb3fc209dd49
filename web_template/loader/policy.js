// What runs where: platform → EP chain, variant per EP, the bundle rule, the refusal rule and the
// build's measurements as priors. Pure functions of the manifest and the device's facts.

import { PackLoadError, PackRefusedError } from './errors.js';

export const KNOWN_EPS = Object.freeze(['webgpu', 'wasm']);
export const DEFAULT_CHAINS = Object.freeze({
  desktop: ['webgpu', 'wasm'],
  // iOS has had memory blow-ups with the asyncify (webgpu) build: wasm only.
  'apple-mobile': ['wasm'],
  android: ['webgpu', 'wasm'],
});
// manifest.verification.runs statuses a browser run may have; no entry is 'unverified'.
const RECORDED_STATUSES = ['passed', 'not-verifiable', 'failed'];
// A candidate whose build-time time on this adapter class is this many times the best is not tried.
export const FAR_SLOWER = 4;

/** 'apple-mobile' for iPhone, iPad and iPadOS in desktop mode; 'android'; else 'desktop'. */
export function detectPlatform({ userAgent = '', platform = '', maxTouchPoints = 0 } = {}) {
  if (/\b(iPhone|iPad|iPod)\b/.test(userAgent)) return 'apple-mobile';
  // iPadOS 13+ "desktop website" mode reports a Mac; only a touch screen tells it apart
  // (no Mac has one).
  const saysMac = /\bMacintosh\b/.test(userAgent) || platform === 'MacIntel';
  if (saysMac && Number(maxTouchPoints) > 1) return 'apple-mobile';
  if (/\bAndroid\b/.test(userAgent)) return 'android';
  return 'desktop';
}

/** The engine whose build-time runs speak where a manifest records no other (pipeline/manifest.py BUILD_ENGINE). */
export const BUILD_ENGINE = 'chromium';

/**
 * The browser engine, for the build's per-engine evidence: 'webkit' for every iOS and iPadOS
 * browser (Apple requires WebKit there: Safari, CriOS, FxiOS alike; iPadOS desktop mode too, as
 * detectPlatform tells it), else 'firefox' where the user agent names Firefox/ (Gecko), else
 * 'chromium' where it names Chrome/ or Chromium/ (Chrome, Edge, Opera, Brave, Samsung Internet),
 * else 'webkit' where it names AppleWebKit/ (Safari, Epiphany, WebKitGTK); null when none: such a
 * browser reads the build engine's runs, as every browser did before engines.
 */
export function detectEngine({ userAgent = '', platform = '', maxTouchPoints = 0 } = {}) {
  if (detectPlatform({ userAgent, platform, maxTouchPoints }) === 'apple-mobile') return 'webkit';
  if (/\bFirefox\//.test(userAgent)) return 'firefox';
  if (/\b(Chrome|Chromium|HeadlessChrome)\//.test(userAgent)) return 'chromium';
  if (/\bAppleWebKit\//.test(userAgent)) return 'webkit';
  return null;
}

/** The EP chain for a platform: manifest.executionProviders, else the built-in default. */
export function chainFor(manifest, platform) {
  const chains = (manifest && manifest.executionProviders) || {};
  const chain = chains[platform] || DEFAULT_CHAINS[platform] || chains.desktop || DEFAULT_CHAINS.desktop;
  return [...chain];
}

/** A chain the app passed: a non-empty list of known EPs, duplicates dropped. */
export function normalizeChain(chain) {
  if (!Array.isArray(chain) || chain.length === 0) {
    throw new PackLoadError(`executionProviders must be a non-empty array of ${KNOWN_EPS.join(', ')}`);
  }
  for (const ep of chain) {
    if (!KNOWN_EPS.includes(ep)) throw new PackLoadError(`execution provider "${ep}" is not supported; use ${KNOWN_EPS.join(', ')}`);
  }
  return [...new Set(chain)];
}

/** Bundle key for an effective chain: 'webgpu' if it contains webgpu, else 'wasm'. */
export function bundleFor(manifest, chain) {
  const bundles = (manifest.runtime && manifest.runtime.bundles) || {};
  const wanted = chain.includes('webgpu') ? 'webgpu' : 'wasm';
  if (bundles[wanted]) return wanted;
  // The webgpu build also runs the wasm EP; the reverse is not true.
  if (wanted === 'wasm' && bundles.webgpu) return 'webgpu';
  throw new PackLoadError(
    `manifest.json runtime.bundles has no "${wanted}" bundle, which the chain [${chain.join(', ')}] needs; ` +
      `rebuild the package with that chain in the recipe or pass executionProviders`,
  );
}

const matches = (pattern, value) => pattern === '*' || pattern === value;

const tripleOf = (run) => `${run.bundle}|${run.ep}|${run.variant}`;

/**
 * The runs that speak for `engine` (pipeline/manifest.py engine_runs): every run of no engine but
 * a browser run of the build's engine (Chromium, recorded without `engine`) where `engine` has a
 * verdict of its own (passed or failed) on the same (bundle, ep, variant); and `engine`'s own runs,
 * except a not-verifiable or skipped one where Chromium has a run. An engine without evidence keeps
 * what Chromium found; one that failed a pair refuses it there only.
 */
export function engineRuns(runs, engine = BUILD_ENGINE) {
  const wanted = engine || BUILD_ENGINE;
  const own = wanted === BUILD_ENGINE ? [] : runs.filter((run) => run.engine === wanted);
  const decided = new Set(own.filter((run) => run.status === 'passed' || run.status === 'failed').map(tripleOf));
  const build = new Set(runs.filter((run) => (run.stage || 'browser') === 'browser' && (run.engine || BUILD_ENGINE) === BUILD_ENGINE).map(tripleOf));
  return runs.filter((run) => {
    const mine = run.engine || BUILD_ENGINE;
    if (mine === BUILD_ENGINE) return !((run.stage || 'browser') === 'browser' && decided.has(tripleOf(run)));
    return mine === wanted && (decided.has(tripleOf(run)) || !build.has(tripleOf(run)));
  });
}

/**
 * `manifest` as `engine` reads it (detectEngine): the refusal rule and the verification statuses
 * then use engineRuns(…, engine). A copy; null keeps the build engine's reading.
 */
export function forEngine(manifest, engine) {
  if (!manifest || !manifest.verification) return manifest;
  return { ...manifest, verification: { ...manifest.verification, engine: engine || BUILD_ENGINE } };
}

function runsOf(manifest) {
  const runs = manifest && manifest.verification && manifest.verification.runs;
  const recorded = Array.isArray(runs) ? runs.filter((run) => run && typeof run === 'object') : [];
  return engineRuns(recorded, manifest && manifest.verification ? manifest.verification.engine : null);
}

/**
 * The runs recorded for this adapter's class in manifest.verification.adapters (the build verified
 * on several browsers): each tagged with its `adapter`. [] without an adapter.
 */
export function adapterRunsOf(manifest, adapter) {
  const entries = manifest && manifest.verification && manifest.verification.adapters;
  if (!adapter || !Array.isArray(entries)) return [];
  return entries
    .filter((entry) => entry && entry.adapter && Array.isArray(entry.runs) && sameAdapterClass(entry.adapter, adapter))
    .flatMap((entry) => entry.runs.filter((run) => run && typeof run === 'object').map((run) => ({ ...run, adapter: entry.adapter })));
}

/**
 * The refusal rule: the manifest.verification.runs entry that refuses (bundle, ep, variant), i.e.
 * any run with status 'failed' matching it ('*' matches anything), or null. With `adapter` (the
 * device's adapterInfo), a run that failed on this adapter class at build time refuses it too:
 * a variant that failed on one vendor's GPUs is not chosen there, other adapters still get it.
 */
export function refusingRun(manifest, bundle, ep, variant, adapter = null) {
  const failed = (run) => run.status === 'failed' && matches(run.bundle, bundle) && matches(run.ep, ep) && matches(run.variant, variant);
  return runsOf(manifest).find(failed) || adapterRunsOf(manifest, adapter).find(failed) || null;
}

export function isRefused(manifest, bundle, ep, variant, adapter = null) {
  return refusingRun(manifest, bundle, ep, variant, adapter) !== null;
}

/**
 * "failed its browser check at build time: rel_l2 0.47 > 0.03" for a refusing run; another
 * engine's run names it: "firefox failed webgpu/fp16 at build: …".
 */
export function refusalReason(run) {
  if (run.engine) return `${run.engine} failed ${run.ep}/${run.variant} at build${run.detail ? `: ${run.detail}` : ''}`;
  const stage = run.stage || 'browser';
  const where = run.adapter ? ` on ${[run.adapter.vendor, run.adapter.architecture || run.adapter.description].filter(Boolean).join(' ')} adapters` : '';
  return `failed its ${stage} check at build time${where}${run.detail ? `: ${run.detail}` : ''}`;
}

/**
 * What the build recorded for (bundle, ep, variant): 'failed' when refused (any stage), else the
 * status of its browser run ('passed', 'not-verifiable'), else 'unverified' (no entry: built with
 * --no-browser, an older build, or a custom runtime).
 */
export function verificationStatus(manifest, bundle, ep, variant, adapter = null) {
  if (isRefused(manifest, bundle, ep, variant, adapter)) return 'failed';
  const run = runsOf(manifest).find(
    (r) =>
      (r.stage || 'browser') === 'browser' &&
      matches(r.bundle, bundle) &&
      matches(r.ep, ep) &&
      matches(r.variant, variant) &&
      RECORDED_STATUSES.includes(r.status),
  );
  return run ? run.status : 'unverified';
}

function fitsAdapter(manifest, ep, variant, features) {
  const spec = (manifest.variants || {})[variant];
  if (!spec) return false;
  return ep !== 'webgpu' || (spec.requires || []).every((feature) => features.has(feature));
}

function defaultOrder(manifest) {
  return ['fp32', ...Object.keys(manifest.variants || {}).sort()];
}

/**
 * The recipe's variant order for an EP, fastest first where `priors` (ep/variant → ms) know. A
 * widened variant (fp16w) and fp32 run the same fp32 kernels, so they share the best of their
 * times: the recipe's order (fp16w, half the download, first) stands, and build-time noise between
 * two equal kernels never puts fp32 ahead.
 */
function variantOrder(manifest, ep, priors) {
  const order = [...new Set((manifest.variantFor && manifest.variantFor[ep]) || defaultOrder(manifest))];
  if (!priors) return order;
  const spec = (variant) => (manifest.variants || {})[variant] || {};
  const kernels = (variant) => (spec(variant).widen || spec(variant).precision === 'fp32' ? 'fp32' : variant);
  const own = (variant) => priors.get(`${ep}/${variant}`) ?? Infinity;
  const time = (variant) => Math.min(...order.filter((other) => kernels(other) === kernels(variant)).map(own));
  return order.map((variant, i) => [variant, i]).sort((a, b) => time(a[0]) - time(b[0]) || a[1] - b[1]).map(([v]) => v);
}

/**
 * The variant an EP runs and the refused variants passed over on the way: { variant, skipped:
 * [{ variant, run }] }. `forced`: a variant name or a per-EP map ({ webgpu: 'fp16' }).
 * Without `bundle` nothing is refused; with it, a refused variant is passed over (a forced one
 * too: it is reported, never run) unless `allowRefused` (the build's own verification re-runs).
 */
export function chooseVariant(manifest, ep, { features = new Set(), forced, bundle, allowRefused = false, priors = null, adapter = null } = {}) {
  const variants = manifest.variants || {};
  const refusal = (name) => (bundle && !allowRefused ? refusingRun(manifest, bundle, ep, name, adapter) : null);
  const wanted = typeof forced === 'string' ? forced : forced ? forced[ep] : undefined;
  if (wanted) {
    if (!variants[wanted]) {
      throw new PackLoadError(
        `variant "${wanted}" is not in manifest.json "variants" (${Object.keys(variants).join(', ')}); pass one of those`,
      );
    }
    const run = refusal(wanted);
    return run ? { variant: null, skipped: [{ variant: wanted, run, forced: true }] } : { variant: wanted, skipped: [] };
  }
  const skipped = [];
  const fits = (name) => {
    if (!fitsAdapter(manifest, ep, name, features)) return false;
    const run = refusal(name);
    if (run) {
      if (!skipped.some((s) => s.variant === name)) skipped.push({ variant: name, run });
      return false;
    }
    return true;
  };
  const preferred = variantOrder(manifest, ep, priors).find(fits);
  if (preferred) return { variant: preferred, skipped };
  // The recipe's order was passed over for refusals: the next EP, not an unchecked variant.
  if (skipped.length > 0) return { variant: null, skipped };
  // Nothing in the recipe's order fits this adapter: any variant that needs no feature will do.
  return { variant: defaultOrder(manifest).find(fits) || null, skipped };
}

/**
 * The variant an EP should run (see chooseVariant): webgpu: the first of variantFor.webgpu whose
 * `requires` the adapter has; wasm: the first of variantFor.wasm. With `bundle`, refused variants
 * are passed over. null when none fits.
 */
export function pickVariant(manifest, ep, features = new Set(), forced = undefined, bundle = undefined) {
  return chooseVariant(manifest, ep, { features, forced, bundle }).variant;
}

function attemptsOn(manifest, chain, bundle, choice) {
  const attempts = [];
  const skipped = [];
  const unfit = [];
  for (const ep of chain) {
    const { variant, skipped: passed } = chooseVariant(manifest, ep, { ...choice, bundle });
    for (const s of passed) skipped.push({ ep, variant: s.variant, bundle, reason: refusalReason(s.run), run: s.run, forced: Boolean(s.forced) });
    if (variant) attempts.push({ ep, variant });
    else if (passed.length === 0) unfit.push(ep);
  }
  return { attempts, skipped, unfit };
}

/**
 * The one plan of a load: { bundle, attempts: [{ ep, variant }], skipped, unfit } for the EPs of
 * `chain` that can run (webgpu only with an adapter). The bundle is the chain's; when refusals
 * leave only EPs of the other bundle (webgpu refused: wasm alone), that bundle is taken, as
 * without an adapter, unless its own refusals would cost an EP the first bundle allowed.
 * `bundle` fixes it (a runtime the app chose); `priors` order variants and attempts by time.
 */
export function planAttempts(manifest, { chain, features = new Set(), forced, bundle = null, allowRefused = false, priors = null, adapter = null }) {
  const choice = { features, forced, allowRefused, priors, adapter };
  const first = bundle || bundleFor(manifest, chain);
  let plan = { bundle: first, ...attemptsOn(manifest, chain, first, choice) };
  const kept = plan.attempts.map((a) => a.ep);
  if (!bundle && kept.length > 0) {
    const narrowed = bundleFor(manifest, kept);
    if (narrowed !== first) {
      const again = attemptsOn(manifest, kept, narrowed, choice);
      if (again.attempts.length === kept.length) {
        const skipped = [...plan.skipped.filter((s) => !kept.includes(s.ep)), ...again.skipped];
        skipped.sort((a, b) => chain.indexOf(a.ep) - chain.indexOf(b.ep));
        plan = { bundle: narrowed, attempts: again.attempts, skipped, unfit: plan.unfit };
      }
    }
  }
  if (priors) plan.attempts = orderByPriors(plan.attempts, priors);
  if (!forced) plan.attempts = withVariantFallbacks(manifest, plan.attempts, { bundle: plan.bundle, features, allowRefused, priors, adapter });
  return plan;
}

/**
 * Each EP's attempt followed by that EP's further variants the build verified in a browser
 * ('passed' on this bundle, for this adapter class where recorded) and this adapter can run, in
 * the recipe's order: a provider failure falls to the same EP's next verified variant before the
 * next EP (webgpu/fp16 → webgpu/fp32 → wasm). An unverified variant is never a fallback: it would
 * be a second download on no evidence.
 */
export function withVariantFallbacks(manifest, attempts, { bundle, features = new Set(), allowRefused = false, priors = null, adapter = null }) {
  const out = [];
  const has = (ep, variant) => out.some((a) => a.ep === ep && a.variant === variant) || attempts.some((a) => a.ep === ep && a.variant === variant);
  for (const attempt of attempts) {
    if (!out.some((a) => a.ep === attempt.ep && a.variant === attempt.variant)) out.push(attempt);
    for (const variant of variantOrder(manifest, attempt.ep, priors)) {
      if (variant === attempt.variant || has(attempt.ep, variant) || !fitsAdapter(manifest, attempt.ep, variant, features)) continue;
      if (!allowRefused && isRefused(manifest, bundle, attempt.ep, variant, adapter)) continue;
      if (verificationStatus(manifest, bundle, attempt.ep, variant, adapter) !== 'passed') continue;
      out.push({ ep: attempt.ep, variant });
    }
  }
  return out;
}

/** Attempts ordered by their prior time (stable; unmeasured ones after the measured ones). */
export function orderByPriors(attempts, priors) {
  const time = (a) => priors.get(`${a.ep}/${a.variant}`) ?? Infinity;
  return attempts.map((a, i) => [a, i]).sort((x, y) => time(x[0]) - time(y[0]) || x[1] - y[1]).map(([a]) => a);
}

/**
 * Every (ep, variant) a measured choice may try on `bundle`: the variants of variantFor[ep] that
 * the adapter can run and the build did not refuse, in chain order. `status` is what the build
 * recorded for the pair.
 */
export function candidatesFor(manifest, { chain, features = new Set(), bundle, adapter = null }) {
  const candidates = [];
  for (const ep of chain) {
    for (const variant of variantOrder(manifest, ep, null)) {
      if (!fitsAdapter(manifest, ep, variant, features) || isRefused(manifest, bundle, ep, variant, adapter)) continue;
      candidates.push({ ep, variant, status: verificationStatus(manifest, bundle, ep, variant, adapter) });
    }
  }
  return candidates;
}

const lower = (value) => String(value || '').trim().toLowerCase();

/** The adapter facts a measurement or a decision is keyed by; null without an adapter. */
export function adapterKey(info) {
  if (!info) return null;
  return { vendor: lower(info.vendor), architecture: lower(info.architecture), description: lower(info.description) };
}

/** Same adapter class: vendor and architecture (description when both lack an architecture). */
export function sameAdapterClass(a, b) {
  const x = adapterKey(a);
  const y = adapterKey(b);
  if (!x || !y) return !x && !y;
  if (x.vendor !== y.vendor) return false;
  if (x.architecture || y.architecture) return x.architecture === y.architecture;
  return x.description === y.description;
}

/**
 * Build-time steady times (ms) on this adapter class: Map 'ep/variant' → the best steadyMs
 * among manifest.measurements with a matching adapter (and bundle, when one matches), plus the
 * wasm runs of the same machine. Empty when none match: priors never come from another class of
 * device.
 */
export function priorsFor(manifest, adapter, bundle) {
  const usable = (Array.isArray(manifest.measurements) ? manifest.measurements : []).filter(
    (m) => m && typeof m.steadyMs === 'number' && Number.isFinite(m.steadyMs) && m.ep && m.variant,
  );
  // wasm runs record no adapter (adapter: null); they belong to the class of the webgpu runs that
  // the same source measured in the same browser (one machine), so the two EPs can be compared.
  const run = (m) => `${m.source}|${m.browser}`;
  const sameMachine = new Set(usable.filter((m) => m.adapter && sameAdapterClass(m.adapter, adapter)).map(run));
  const measured = usable.filter((m) => sameAdapterClass(m.adapter, adapter) || (!m.adapter && adapter && sameMachine.has(run(m))));
  const best = new Map(); // 'ep/variant' -> { rank, ms }; rank 0: measured on this bundle
  for (const m of measured) {
    const key = `${m.ep}/${m.variant}`;
    const rank = m.bundle === bundle ? 0 : 1;
    const seen = best.get(key);
    if (!seen || rank < seen.rank || (rank === seen.rank && m.steadyMs < seen.ms)) best.set(key, { rank, ms: m.steadyMs });
  }
  const priors = new Map([...best].map(([key, { ms }]) => [key, ms]));
  return priors;
}

/** The candidates the priors say are more than FAR_SLOWER × the best measured one. */
export function farSlower(candidates, priors, ratio = FAR_SLOWER) {
  const times = candidates.map((c) => priors.get(`${c.ep}/${c.variant}`)).filter((t) => t !== undefined);
  if (times.length < 2) return [];
  const best = Math.min(...times);
  return candidates.filter((c) => {
    const t = priors.get(`${c.ep}/${c.variant}`);
    return t !== undefined && t > ratio * Math.max(best, 1e-3);
  });
}

/**
 * Build-time steady times (ms) of the wasm EP on the wasm-only bundle for this adapter class (the
 * machine's webgpu runs tell its class): Map 'wasm/variant' → ms, empty when none were measured.
 */
export function wasmBundlePriors(manifest, adapter) {
  const measurements = (Array.isArray(manifest.measurements) ? manifest.measurements : []).filter((m) => m && (m.ep === 'webgpu' || m.bundle === 'wasm'));
  const all = priorsFor({ ...manifest, measurements }, adapter, 'wasm');
  return new Map([...all].filter(([key]) => key.startsWith('wasm/')));
}
