"""What a built package asks the browser checks to run: its manifest and the (bundle, EP, variant) plan.

Every variant an EP can be asked for is planned, not only the ones a chain picks by default: the
loader takes any variant on any EP (`load({variant})`), so wasm x fp16 runs too, on each bundle the
package ships for a chain with that EP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.manifest import Manifest, chain_bundle, read_manifest


@dataclass
class PlannedRun:
    bundle: str  # the runtime bundle the chain loads: 'webgpu' or 'wasm'
    ep: str
    variant: str
    platforms: list[str] = field(default_factory=list)  # the platform chains whose bundle and EP this is
    default: bool = False  # some chain picks this variant for this EP by default (variantFor)


def load_manifest(package_dir: Path) -> Manifest:
    """The package's manifest, validated (pipeline/manifest.py)."""
    return read_manifest(package_dir)


def plan_runs(manifest: Manifest) -> list[PlannedRun]:
    """One run per distinct (bundle, EP, variant) a platform chain can be asked for: webgpu bundle
    first, then webgpu EP first, then the variants in variantFor order, then the other variants.
    (validate() has checked that every chain's bundle, EPs and variants exist.)"""
    runs: dict[tuple[str, str, str], PlannedRun] = {}
    for platform, chain in manifest["executionProviders"].items():
        bundle = chain_bundle(chain)
        for ep in chain:
            variants = manifest["variantFor"][ep]
            others = [name for name in manifest["variants"] if name not in variants]
            for variant in [*variants, *others]:
                run = runs.setdefault((bundle, ep, variant), PlannedRun(bundle, ep, variant))
                if platform not in run.platforms:
                    run.platforms.append(platform)
                run.default = run.default or variant in variants
    order = {"webgpu": 0, "wasm": 1}
    # sorted() is stable: within one (bundle, EP) the variants keep the order above
    return sorted(runs.values(), key=lambda run: (order.get(run.bundle, 2), order.get(run.ep, 2), not run.default))
