"""What a package weighs, and what a visitor's browser fetches, computed from its manifest.

- package: every file in the folder (the files the manifest lists, their `.br` copies, the
  manifest; the build's reports, which it does not list, aside), and what a host stores (one object per listed file, the `.br` body where there is one).
- first visit, per platform chain: what the loader fetches before the first result: manifest.json,
  loader.js and its modules, the runtime bundle the chain loads (`chain_bundle`), and the model
  of the chain's first choice (its first EP's first variant the build did not refuse; with its weight chunks, if any). Raw bytes, and bytes on the wire
  (the brotli body where the package has one; hosts serve those with Content-Encoding: br). With
  `select: measured` the trials fetch the sample and the other candidates' models as well. Where
  that variant needs adapter features (fp16: `shader-f16`), `without_features` is the same visit
  on an adapter without them (the first variant that needs none: fp16w, else fp32).
- repeat visit: content-hashed files come from Cache Storage (keyed by sha256), so nothing is
  downloaded; manifest.json and the loader's files (short cache) are revalidated, and only
  re-downloaded when a re-publish changed them.
"""

from __future__ import annotations

from typing import Any

from pipeline.manifest import Manifest, chain_bundle, file_parts, refused, variant_files

def _is_loader_file(path: str) -> bool:
    return path == "loader.js" or (path.startswith("loader/") and path.endswith(".js"))


def _wire(entry: dict[str, Any]) -> int:
    encoded = (entry.get("encodings") or {}).get("br")
    return int(encoded["size"]) if encoded else int(entry["size"])


def _first_variant(manifest: Manifest, chain: list[str], bundle: str, features: bool = True) -> str | None:
    """The loader's first choice on the chain (policy.js chooseVariant, no priors): the first
    variant of the first EP that has one the build did not refuse; `features`: the adapter has
    every feature a variant requires (else only variants that require none)."""
    for ep in chain:
        for variant in manifest["variantFor"].get(ep) or []:
            needs = ep == "webgpu" and manifest["variants"][variant].get("requires")
            if (features or not needs) and refused(manifest, bundle, ep, variant) is None:
                return variant
    return None


def delivery_sizes(manifest: Manifest, manifest_bytes: int) -> dict[str, Any]:
    """The sizes above; `manifest_bytes` is the size of manifest.json as written."""
    files = manifest["files"]
    raw = sum(int(entry["size"]) for entry in files.values())
    copies = sum(int(entry["encodings"]["br"]["size"]) for entry in files.values() if (entry.get("encodings") or {}).get("br"))
    package = {
        "files": len(files) + 1 + sum(1 for entry in files.values() if (entry.get("encodings") or {}).get("br")),
        "bytes": raw + copies + manifest_bytes,
        "hosted_bytes": sum(_wire(entry) for entry in files.values()) + manifest_bytes,
    }
    loader = sorted(path for path in files if _is_loader_file(path))
    first_visit: dict[str, Any] = {}
    for platform, chain in manifest["executionProviders"].items():
        bundle_key = chain_bundle(chain)
        bundle = manifest["runtime"]["bundles"][bundle_key]
        runtime = [*loader, *file_parts(manifest, bundle["module"]), *file_parts(manifest, bundle["wasm"])]

        def fetched(variant: str | None) -> dict[str, Any]:
            paths = [*runtime, *(variant_files(manifest["variants"][variant]) if variant else [])]  # graph and weight chunks
            return {
                "variant": variant,
                "files": len(paths) + 1,
                "bytes": manifest_bytes + sum(int(files[path]["size"]) for path in paths),
                "wire_bytes": manifest_bytes + sum(_wire(files[path]) for path in paths),
            }

        variant = _first_variant(manifest, chain, bundle_key)
        model = variant_files(manifest["variants"][variant]) if variant else []
        visit = {"chain": list(chain), "bundle": bundle_key, **fetched(variant)}
        plain = _first_variant(manifest, chain, bundle_key, features=False)
        if plain != variant:
            visit["without_features"] = {"lacking": list(manifest["variants"][variant].get("requires") or []), **fetched(plain)}
        if manifest["loader"].get("select") == "measured":
            runnable = [ep for ep in chain if bundle_key != "wasm" or ep == "wasm"]
            models = {path for ep in runnable for v in manifest["variantFor"].get(ep) or [] for path in variant_files(manifest["variants"][v])} - set(model)
            trial_paths = sorted(models) + (file_parts(manifest, manifest["sample"]["file"]) if manifest.get("sample") else [])
            visit["trials"] = {
                "files": len(trial_paths),
                "bytes": sum(int(files[path]["size"]) for path in trial_paths),
                "wire_bytes": sum(_wire(files[path]) for path in trial_paths),
            }
        first_visit[platform] = visit
    revalidated = ["manifest.json", *loader]
    repeat_visit = {
        "bytes": 0,
        "revalidated": revalidated,
        "bytes_after_republish": manifest_bytes + sum(int(files[path]["size"]) for path in loader),
    }
    return {"package": package, "first_visit": first_visit, "repeat_visit": repeat_visit}


def _mb(size: int) -> str:
    if size == 0:
        return "0 B"
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def delivery_lines(delivery: dict[str, Any] | None) -> list[str]:
    """The sizes for people: the package, each platform's first visit, a repeat visit."""
    if not delivery:
        return []
    package = delivery["package"]
    lines = [f"delivery: package {_mb(package['bytes'])} in {package['files']} files besides the build's reports ({_mb(package['hosted_bytes'])} stored on a host, brotli bodies replacing their files)"]
    for platform, visit in delivery["first_visit"].items():
        trials = visit.get("trials")
        extra = f"; measured choice's trials then fetch {_mb(trials['bytes'])} ({_mb(trials['wire_bytes'])} on the wire)" if trials and trials["files"] else ""
        plain = visit.get("without_features")
        if plain:
            extra += f"; without {', '.join(plain['lacking'])} the {plain['variant']} model: {_mb(plain['bytes'])}, {_mb(plain['wire_bytes'])} on the wire"
        # no variant: every one was refused on the chain's EPs, so a visit loads the runtime and stops there
        model = f"{visit['variant']} model" if visit.get("variant") else "no model: every variant is refused on this chain"
        lines.append(
            f"  first visit {platform} [{', '.join(visit['chain'])}]: {_mb(visit['bytes'])}, {_mb(visit['wire_bytes'])} on the wire "
            f"({visit['files']} files: {visit['bundle']} runtime bundle, {model}){extra}"
        )
    repeat = delivery["repeat_visit"]
    lines.append(
        f"  repeat visit: {_mb(repeat['bytes'])} (hashed files from Cache Storage; {len(repeat['revalidated'])} files revalidated, "
        f"{_mb(repeat['bytes_after_republish'])} after a re-publish changed them)"
    )
    return lines
