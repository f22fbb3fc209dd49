"""What a built package asks the browser checks to run: its manifest and the (bundle, EP, variant) plan.

Every variant an EP can be asked for is planned, not only the ones a chain picks by default: the
loader takes any variant on any EP (`load({variant})`), so wasm x fp16 runs too, on each bundle the
package ships for a chain with that EP.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import PackError

_REQUIRED_KEYS = ("variants", "variantFor", "outputs", "sample", "runtime", "executionProviders")


@dataclass
class PlannedRun:
    bundle: str  # the runtime bundle the chain loads: 'webgpu' or 'wasm'
    ep: str
    variant: str
    platforms: list[str] = field(default_factory=list)  # the platform chains whose bundle and EP this is
    default: bool = False  # some chain picks this variant for this EP by default (variantFor)


def load_manifest(package_dir: Path) -> dict:
    path = Path(package_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise PackError(f"{path}: not found; point at a folder made by `pack build` (dist/<name>)") from None
    except ValueError as error:
        raise PackError(f"{path}: not JSON ({error}); rebuild the package") from None
    missing = [key for key in _REQUIRED_KEYS if key not in manifest]
    if missing:
        raise PackError(f"{path}: missing {', '.join(missing)}; rebuild the package with this version of pack")
    return manifest


def chain_bundle(chain: list[str]) -> str:
    """ARCHITECTURE.md: a chain with webgpu loads the webgpu bundle; a wasm-only chain the wasm bundle."""
    return "webgpu" if "webgpu" in chain else "wasm"


def plan_runs(manifest: dict) -> list[PlannedRun]:
    """One run per distinct (bundle, EP, variant) a platform chain can be asked for: webgpu bundle
    first, then webgpu EP first, then the variants in variantFor order, then the other variants."""
    runs: dict[tuple[str, str, str], PlannedRun] = {}
    for platform, chain in manifest["executionProviders"].items():
        bundle = chain_bundle(chain)
        if bundle not in manifest["runtime"].get("bundles", {}):
            raise PackError(f"manifest.json: runtime.bundles has no {bundle!r} bundle for platform {platform!r}; rebuild the package")
        for ep in chain:
            variants = manifest["variantFor"].get(ep)
            if not variants:
                raise PackError(f"manifest.json: variantFor has no variants for EP {ep!r} (platform {platform!r}); rebuild the package")
            for variant in variants:
                if variant not in manifest["variants"]:
                    raise PackError(f"manifest.json: variantFor[{ep!r}] names unknown variant {variant!r}; rebuild the package")
            others = [name for name in manifest["variants"] if name not in variants]
            for variant in [*variants, *others]:
                run = runs.setdefault((bundle, ep, variant), PlannedRun(bundle, ep, variant))
                if platform not in run.platforms:
                    run.platforms.append(platform)
                run.default = run.default or variant in variants
    order = {"webgpu": 0, "wasm": 1}
    # sorted() is stable: within one (bundle, EP) the variants keep the order above
    return sorted(runs.values(), key=lambda run: (order.get(run.bundle, 2), order.get(run.ep, 2), not run.default))
