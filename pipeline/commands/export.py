"""`pack export`: copy a built package's files a static host needs into an app's folder."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.commands.common import cli_errors, print_json, require_package_folder


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
    json_output: Annotated[bool, typer.Option("--json", help="Print what was written as JSON.")] = False,
) -> None:
    """Write the app copy of a package: manifest, loader, runtime and models, one body each; no report, no demo page."""
    from pipeline.publish.export import export_package, parse_variants

    with cli_errors():
        require_package_folder(package, "export")
        exported = export_package(package, destination, parse_variants(variants), bodies=bodies.value)
    if json_output:
        print_json({
            "destination": str(exported.destination),
            "variants": exported.variants,
            "bodies": exported.bodies,
            "bytes": exported.bytes,
            "files": [{"path": path, "bytes": size} for path, size in exported.files],
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
