"""`pack export`: the app copy of a package, only what a static host serves to the loader.

Left out: the build's reports (report.json, report.html: never in manifest.files; a package of an
earlier pack listed report.json, which is dropped too), the demo page (index.html, demo.js), the models of
variants not asked for, the runtime bundle no platform chain loads any more, and with `no_br`
every `.br` copy (for hosts that cannot serve a precompressed body with Content-Encoding: br).
The manifest is rewritten for what was kept and validated (pipeline/manifest.py) before anything
is written; the copy appears at its destination complete or not at all.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.cache import staging_folder, swap_into_place
from pipeline.errors import PackError
from pipeline.manifest import Manifest, chain_bundle, validate, variant_files, write_manifest
from pipeline.publish.upload_plan import DEMO_SCRIPT, PackagePlan, plan_package

# Files no static host serves to the loader (report.json: listed by packages of earlier pack versions).
NOT_EXPORTED = frozenset({"report.json", "index.html", DEMO_SCRIPT})


@dataclass(frozen=True)
class Exported:
    destination: Path
    manifest: Manifest
    files: list[tuple[str, int]]  # package path (".br" copies included), bytes
    variants: list[str]
    brotli: bool

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self.files)


def parse_variants(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise PackError(f"--variants {text!r}: name at least one variant, e.g. --variants fp16,fp32")
    return list(dict.fromkeys(names))


def export_manifest(plan: PackagePlan, variants: list[str] | None, brotli: bool) -> Manifest:
    """The package's manifest for the kept variants (all when None), validated."""
    manifest: dict[str, Any] = copy.deepcopy(dict(plan.manifest))
    where = plan.root / "manifest.json"
    known = list(manifest["variants"])
    keep = variants or known
    for name in keep:
        if name not in known:
            raise PackError(f"--variants: {where} has no variant {name!r} (it has {', '.join(known)})")
    dropped = [name for name in known if name not in keep]
    manifest["variants"] = {name: entry for name, entry in manifest["variants"].items() if name in keep}
    variant_for = {ep: [name for name in names if name in keep] for ep, names in manifest["variantFor"].items()}
    manifest["variantFor"] = {ep: names for ep, names in variant_for.items() if names}
    chains = {}
    for platform, chain in manifest["executionProviders"].items():
        kept = [ep for ep in chain if ep in manifest["variantFor"]]
        if not kept:
            needs = sorted({name for ep in chain for name in variant_for_of(plan.manifest, ep)})
            raise PackError(
                f"--variants {','.join(keep)}: platform {platform!r} (chain {', '.join(chain)}) would keep no variant it can run; "
                f"add {' or '.join(needs)} to --variants"
            )
        chains[platform] = kept
    manifest["executionProviders"] = chains
    bundles = {chain_bundle(chain) for chain in chains.values()}
    manifest["runtime"]["bundles"] = {key: bundle for key, bundle in manifest["runtime"]["bundles"].items() if key in bundles}
    manifest["measurements"] = [m for m in manifest["measurements"] if m.get("variant") in keep]
    if "fp16" in dropped:
        manifest.pop("fp16", None)

    needed = {path for entry in manifest["variants"].values() for path in variant_files(entry)}
    needed |= {path for bundle in manifest["runtime"]["bundles"].values() for path in (bundle["module"], bundle["wasm"])}
    dropped_files = {path for name, entry in plan.manifest["variants"].items() if name in dropped for path in variant_files(entry)}
    dropped_files |= {path for bundle in plan.manifest["runtime"]["bundles"].values() for path in (bundle["module"], bundle["wasm"])}
    files = {}
    for path, entry in manifest["files"].items():
        if path in NOT_EXPORTED or (path in dropped_files and path not in needed):
            continue
        entry = dict(entry)
        if not brotli:
            entry["encodings"] = {}
        files[path] = entry
    manifest["files"] = files
    return validate(manifest, f"{where} (exported)")


def variant_for_of(manifest: Manifest, ep: str) -> list[str]:
    return list(manifest["variantFor"].get(ep) or [])


def export_package(source: Path, destination: Path, variants: list[str] | None, brotli: bool) -> Exported:
    """Validate the package at `source`, then write its app copy to `destination`."""
    plan = plan_package(source)  # every file checked against its sha256, every .br against its file
    manifest = export_manifest(plan, variants, brotli)
    _check_destination(destination, source)
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PackError(f"{destination.parent}: cannot create it ({error.strerror or error}); give a writable folder") from None
    written: list[tuple[str, int]] = []
    with staging_folder(destination.parent, prefix=f".{destination.name}.export-") as staging:
        for path, entry in manifest["files"].items():
            names = [path] + [encoding["path"] for encoding in entry["encodings"].values()]
            for name in names:
                target = staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / name, target)
                written.append((name, target.stat().st_size))
        manifest_path = write_manifest(staging, manifest)
        written.append(("manifest.json", manifest_path.stat().st_size))
        swap_into_place(staging, destination)
    return Exported(destination, manifest, written, list(manifest["variants"]), brotli)


def _check_destination(destination: Path, source: Path) -> None:
    """Replace only an earlier export (or an empty folder): never an app's own files."""
    if source.resolve().is_relative_to(destination.resolve()) or destination.resolve().is_relative_to(source.resolve()):
        raise PackError(f"{destination}: is, holds or lies inside the package {source}; export to a folder outside it")
    if destination.is_symlink() or (destination.exists() and not destination.is_dir()):
        raise PackError(f"{destination}: exists and is not a folder; give a new folder (the copy goes to DIR itself)")
    if destination.is_dir() and any(destination.iterdir()):
        previous = destination / "manifest.json"
        try:
            is_export = previous.is_file() and "name" in json.loads(previous.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            is_export = False
        if not is_export:
            raise PackError(f"{destination}: not empty and not an earlier export (no manifest.json); give a new or empty folder")
