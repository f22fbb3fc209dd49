"""`pack export`: copy a built package's files a static host needs into an app's folder."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.commands.common import cli_errors, print_json, require_package_folder
from pipeline.errors import PackError


class Bodies(str, enum.Enum):
    br = "br"
    raw = "raw"


def export(
    package: Annotated[Path, typer.Argument(help="A package folder made by `pack build` (dist/<name>).")],
    destination: Annotated[Path, typer.Argument(help="The folder to write (new, empty, or an earlier export, which is replaced).")],
    variants: Annotated[
        Optional[str], typer.Option("--variants", help="Keep only these variants, comma-separated (e.g. fp16,fp32); default: all.")
    ] = None,
    bodies: Annotated[
        Bodies,
        typer.Option(
            "--bodies", envvar="PACK_EXPORT_BODIES", show_envvar=True,
            help="One body per file: br = the .br body alone where there is one (the default, about a seventh of the bytes): "
            "a host that serves X.br under X with Content-Encoding: br (pack serve, S3/R2 objects, nginx brotli_static) decodes it, "
            "and on a host that serves files as they are (GitHub Pages, python -m http.server) the loader fetches X.br and decodes it itself; "
            "raw = decoded files only, for an app that reads the files without the loader.",
        ),
    ] = Bodies.br,
    host: Annotated[
        Optional[str],
        typer.Option(
            "--host", envvar="PACK_EXPORT_HOST", show_envvar=True,
            help="Also write the host's configuration (headers, caching, Content-Encoding, COOP/COEP): netlify, cloudflare-pages, "
            "vercel, nginx, apache, serve, github-pages (S3/R2: pack publish). Where a host cannot send Content-Encoding: br, "
            "its configuration names the .br bodies as files of their own, which the loader decodes.",
        ),
    ] = None,
    url_path: Annotated[
        Optional[str],
        typer.Option("--url-path", envvar="PACK_EXPORT_URL_PATH", show_envvar=True, help="The URL path the site serves DEST under (--host); default /<DEST's name>/."),
    ] = None,
    cors: Annotated[
        Optional[list[str]],
        typer.Option(
            "--cors", envvar="PACK_EXPORT_CORS", show_envvar=True,
            help="Let pages on ORIGIN (scheme://host[:port], or *) fetch the package: CORS headers in the host's configuration "
            "(--host). Repeatable or comma-separated; several origins on nginx and Apache, one (or *) elsewhere.",
        ),
    ] = None,
    coi_shim: Annotated[
        bool,
        typer.Option("--coi-shim", help="Add coi-serviceworker.js: a service worker that makes the pages cross-origin isolated (wasm threads) on hosts that cannot send COOP/COEP (GitHub Pages)."),
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print what was written as JSON.")] = False,
) -> None:
    """Write the app copy of a package: manifest, loader, runtime and models, one body each; no report, no demo page."""
    from pipeline.publish.export import export_package, parse_variants
    from pipeline.publish.cors import validate_origins
    from pipeline.cache import atomic_write
    from pipeline.publish.hosts import COI_SHIM, NGINX_SITE, Cors, github_pages_lines, host_named, nginx_site_snippet, render, shim_bytes, url_path_of

    with cli_errors():
        require_package_folder(package, "export")
        target = host_named(host) if host is not None else None
        if target is None and url_path is not None:
            raise PackError(f"--url-path {url_path}: only a host's configuration uses it; add --host NAME")
        allowed = Cors(tuple(validate_origins(cors or [])))
        if allowed.origins and (target is None or not target.config):
            where = f"{target.title} takes no configuration" if target is not None else "only a host's configuration carries it"
            raise PackError(f"--cors {','.join(allowed.origins)}: {where}; add --host NAME (nginx, apache, serve, netlify, cloudflare-pages, vercel)")
        served_under = url_path_of(url_path if url_path is not None else destination.resolve().name)
        beside: dict[Path, bytes] = {}  # written after the export, beside it: never served from it

        def extra(manifest) -> dict[str, bytes]:
            files = {}
            if target is not None and target.config:
                text = render(target, manifest, served_under, allowed).encode()
                if target.beside:
                    beside[target.config_path(destination)] = text
                else:
                    files[target.config] = text
            if coi_shim:
                files[COI_SHIM] = shim_bytes()
            return files

        exported = export_package(package, destination, parse_variants(variants), bodies=bodies.value, extra=extra)
        if target is not None and target.name == "nginx":
            beside[destination.parent / NGINX_SITE] = nginx_site_snippet().encode()
        for path, data in beside.items():
            try:
                atomic_write(path, data)
            except OSError as error:
                raise PackError(f"{path}: cannot write it ({error.strerror or error}); give a DEST whose folder is writable") from None
    config = target.config_path(destination).resolve() if target is not None and target.config else None
    notes = []
    if target is not None and target.name == "nginx":
        notes.append(f"nginx: {(destination.parent / NGINX_SITE).resolve()} goes once in the site's server {{ }} block (include it before the packages' snippets)")
    if config is not None:
        notes.append(f"{target.title}: {config} goes in {target.place}")
    if target is not None and target.name == "github-pages":
        notes += github_pages_lines(coi_shim)
    elif coi_shim:
        notes.append(f"copy {destination / COI_SHIM} next to each page that loads the package and load it first: <script src=\"{COI_SHIM}\"></script>")
    if json_output:
        print_json({
            "destination": str(exported.destination),
            "variants": exported.variants,
            "bodies": exported.bodies,
            "bytes": exported.bytes,
            "files": [{"path": path, "bytes": size} for path, size in exported.files],
            "host": target.name if target is not None else None,
            "url_path": served_under if target is not None else None,
            "cors": list(allowed.origins),
            "config": str(config) if config is not None else None,
            "coi_shim": COI_SHIM if coi_shim else None,
            "notes": notes,
        })
        return
    encoded = sum(path.endswith(".br") for path, _ in exported.files)
    served = (
        f"{encoded} .br bodies: a host with Content-Encoding: br for X.br sends them as they are, and on any other static host the loader decodes them itself"
        if encoded else "decoded bodies: any static host serves them"
    )
    typer.echo(
        f"exported {exported.manifest['name']} to {exported.destination}: {len(exported.files)} files, {exported.bytes / 1e6:.1f} MB "
        f"(variants {', '.join(exported.variants)}; {served})"
    )
    for note in notes:
        typer.echo(f"  {note}")
