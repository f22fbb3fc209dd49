"""`pack export`: copy a built package's files a static host needs into an app's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.commands.common import cli_errors, print_json, require_package_folder


def export(
    package: Annotated[Path, typer.Argument(help="A package folder made by `pack build` (dist/<name>).")],
    destination: Annotated[Path, typer.Argument(help="The folder to write (new, empty, or an earlier export, which is replaced).")],
    variants: Annotated[
        Optional[str], typer.Option("--variants", help="Keep only these variants, comma-separated (e.g. fp16,fp32); default: all.")
    ] = None,
    no_br: Annotated[
        bool, typer.Option("--no-br", help="Leave out the .br copies (for hosts that cannot serve them with Content-Encoding: br).")
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print what was written as JSON.")] = False,
) -> None:
    """Write the app copy of a package: manifest, loader, runtime and models; no report, no demo page."""
    from pipeline.publish.export import export_package, parse_variants

    with cli_errors():
        require_package_folder(package, "export")
        exported = export_package(package, destination, parse_variants(variants), brotli=not no_br)
    if json_output:
        print_json({
            "destination": str(exported.destination),
            "variants": exported.variants,
            "brotli": exported.brotli,
            "bytes": exported.bytes,
            "files": [{"path": path, "bytes": size} for path, size in exported.files],
        })
        return
    copies = "with .br copies" if exported.brotli and any(path.endswith(".br") for path, _ in exported.files) else "no .br copies"
    typer.echo(
        f"exported {exported.manifest['name']} to {exported.destination}: {len(exported.files)} files, {exported.bytes / 1e6:.1f} MB "
        f"(variants {', '.join(exported.variants)}; {copies})"
    )
