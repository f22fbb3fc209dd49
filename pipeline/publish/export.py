"""`pack export`: the app copy of a package, only what a static host serves to the loader, one body per file.

Left out: the build's reports (report.json, report.html: never in manifest.files; a package of an
earlier pack listed report.json, which is dropped too), the demo page (index.html, demo.js), the models of
variants not asked for, and the runtime bundle no platform chain loads any more.

One body per file (BODIES):
- "br" (the default): the `.br` body alone wherever the build made one (the manifest entry says
  `stored: "br"`), the decoded file elsewhere; GTCRN's copy is 0.14 of its package folder. It loads
  on every static host at brotli's size: a host that serves `X.br` under `X` with
  `Content-Encoding: br` (pack serve, S3/R2 through `pack publish`, nginx `brotli_static`, a
  configured Apache) decodes it for the browser; on a host that serves files as they are (python's
  http.server, GitHub Pages-style hosting) the loader finds `X` missing, fetches `X.br` itself and
  decodes it (`DecompressionStream('brotli')`, else the package's brotli decoder: runtime.decoder).
- "raw": decoded files only, no encodings (and no decoder): for an app that serves the files
  through something other than the loader, and the default of `--host` for the hosts whose
  configuration names each file by its decoded name (Netlify, Cloudflare Pages, Vercel), at the
  decoded size (GTCRN: 0.86 of its package folder).

The manifest is rewritten for what was kept, package.json (npm) lists exactly the bodies kept,
and both are validated (pipeline/manifest.py) before anything is written; the copy appears at its
destination complete or not at all.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pipeline.assets.files import describe_file
from pipeline.cache import staging_folder, swap_into_place
from pipeline.errors import PackError
from pipeline.manifest import Manifest, chain_bundle, file_parts, stored_paths, validate, variant_files, write_manifest
from pipeline.publish.upload_plan import DEMO_SCRIPT, PackagePlan, plan_package
from pipeline.web.npm import PACKAGE_JSON, package_json

# Files no static host serves to the loader (report.json: listed by packages of earlier pack versions).
NOT_EXPORTED = frozenset({"report.json", "index.html", DEMO_SCRIPT})
# --bodies: which body of each file the copy keeps (see the module's docstring).
BODIES = ("br", "raw")


@dataclass(frozen=True)
class Exported:
    destination: Path
    manifest: Manifest
    files: list[tuple[str, int]]  # package path (".br" copies included), bytes
    variants: list[str]
    bodies: str

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


def export_manifest(plan: PackagePlan, variants: list[str] | None, bodies: str) -> Manifest:
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

    def runtime_files(bundles: dict[str, Any]) -> set[str]:  # a split .wasm: its parts
        return {part for bundle in bundles.values() for path in (bundle["module"], bundle["wasm"]) for part in file_parts(plan.manifest, path)}

    needed |= runtime_files(manifest["runtime"]["bundles"])
    dropped_files = {path for name, entry in plan.manifest["variants"].items() if name in dropped for path in variant_files(entry)}
    dropped_files |= runtime_files(plan.manifest["runtime"]["bundles"])
    decoder = manifest["runtime"].get("decoder")
    if decoder and bodies == "raw":  # no .br body left to decode
        del manifest["runtime"]["decoder"]
        dropped_files |= {decoder["module"], decoder["wasm"]}
    files = {}
    for path, entry in manifest["files"].items():
        if path in NOT_EXPORTED or (path in dropped_files and path not in needed):
            continue
        entry = dict(entry)
        if bodies == "raw":
            entry["encodings"] = {}
        elif entry["encodings"]:
            entry["stored"] = "br"
        files[path] = entry
    manifest["files"] = files
    if "split" in manifest:  # the split files whose parts were kept
        manifest["split"] = {path: whole for path, whole in manifest["split"].items() if whole["parts"][0] in files}
        if not manifest["split"]:
            del manifest["split"]
    return validate(manifest, f"{where} (exported)")


def variant_for_of(manifest: Manifest, ep: str) -> list[str]:
    return list(manifest["variantFor"].get(ep) or [])


def export_package(
    source: Path, destination: Path, variants: list[str] | None, bodies: str = "br",
    extra: Callable[[Manifest], dict[str, bytes]] | None = None,
) -> Exported:
    """Validate the package at `source`, then write its app copy to `destination`. `extra` gives
    files to write beside it (a host's configuration) from the exported manifest: they are not
    part of the package, so the manifest does not list them."""
    if bodies not in BODIES:
        raise PackError(f"--bodies {bodies!r}: not one of {', '.join(BODIES)}")
    plan = plan_package(source)  # every file checked against its sha256, every .br against its file
    manifest = export_manifest(plan, variants, bodies)
    extra_files = extra(manifest) if extra else {}
    _check_destination(destination, source)
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PackError(f"{destination.parent}: cannot create it ({error.strerror or error}); give a writable folder") from None
    written: list[tuple[str, int]] = []
    with staging_folder(destination.parent, prefix=f".{destination.name}.export-") as staging:
        for name in stored_paths(manifest):
            if name == PACKAGE_JSON:
                continue
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, target)
            written.append((name, target.stat().st_size))
        if PACKAGE_JSON in manifest["files"]:
            # The build's package.json lists the demo page and every decoded file: list what was kept.
            (staging / PACKAGE_JSON).write_bytes(package_json(manifest, []))
            manifest["files"][PACKAGE_JSON] = describe_file(staging, PACKAGE_JSON).manifest_entry()
            written.append((PACKAGE_JSON, (staging / PACKAGE_JSON).stat().st_size))
        manifest_path = write_manifest(staging, manifest)
        written.append(("manifest.json", manifest_path.stat().st_size))
        for name, data in extra_files.items():
            (staging / name).write_bytes(data)
        swap_into_place(staging, destination)
    return Exported(destination, manifest, written, list(manifest["variants"]), bodies)


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
