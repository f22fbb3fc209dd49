"""What a built package asks the browser checks to run: its manifest and the (bundle, EP, variant) plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.assets.manifest import Manifest, chain_bundle, read_manifest


@dataclass
class BrowserRun:
    bundle: str  # the runtime bundle the chain loads: 'webgpu' or 'wasm'
    ep: str
    variant: str
    platforms: list[str] = field(default_factory=list)  # the platform chains that reach this run


def load_manifest(package_dir: Path) -> Manifest:
    """The package's manifest, validated (pipeline/assets/manifest.py)."""
    return read_manifest(package_dir)


def plan_runs(manifest: Manifest) -> list[BrowserRun]:
    """One run per distinct (bundle, EP, variant) that some platform chain can reach, webgpu bundle first.
    (validate() has checked that every chain's bundle and EPs exist.)"""
    runs: dict[tuple[str, str, str], BrowserRun] = {}
    for platform, chain in manifest["executionProviders"].items():
        bundle = chain_bundle(chain)
        for ep in chain:
            for variant in manifest["variantFor"][ep]:
                run = runs.setdefault((bundle, ep, variant), BrowserRun(bundle, ep, variant))
                run.platforms.append(platform)
    order = {"webgpu": 0, "wasm": 1}
    return sorted(runs.values(), key=lambda run: (order.get(run.bundle, 2), order.get(run.ep, 2)))
