// Generated from pipeline/manifest.schema.json by pipeline/manifest.py `loader_keys_module`
// (tests/test_manifest.py checks it is current): the keys a manifest must have, by where they sit.
export const REQUIRED_KEYS = Object.freeze({
  "": ["schema", "name", "files", "variants", "variantFor", "inputs", "outputs", "sample", "runtime", "executionProviders", "epOptions", "loader", "thresholds", "verification", "measurements", "license"],
  "split.*": ["sha256", "size", "mediaType", "parts"],
  "variants.*": ["precision", "model", "requires"],
  "sample": ["file", "tensors", "outputs"],
  "runtime": ["package", "version", "bundles"],
  "loader": ["watchdogMs", "prewarm", "select"],
  "verification": ["browser", "passed", "runs"],
});
