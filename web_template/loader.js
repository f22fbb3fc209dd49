// pack's browser loader: `import { load } from './loader.js'`. Copied into every package by
// `pack build` with the modules of ./loader/ (see docs/loader.md).
//
// It reads manifest.json beside itself at load time (publishing may replace the manifest
// atomically), picks an execution-provider chain for the platform and a model variant for each
// provider (by measurement on the device when manifest.loader.select is 'measured'), never runs a
// (bundle, EP, variant) the build refused, downloads and sha256-checks every file (Cache Storage
// keyed by hash), imports the package's own onnxruntime-web build and falls back to the next
// provider when one fails.

export { load } from './loader/load.js';
export { cacheStatus, clearCache, isCached } from './loader/cache.js';
export { PackLoadError, PackIntegrityError, PackRefusedError } from './loader/errors.js';
export {
  bundleFor, candidatesFor, chainFor, detectPlatform, isRefused, pickVariant, planAttempts, priorsFor, refusingRun, verificationStatus,
} from './loader/policy.js';
export { compareOutputs, compareTensor, formatMetrics, judge, thresholdsFor } from './loader/compare.js';
export { browserKey, packageHash } from './loader/select.js';
