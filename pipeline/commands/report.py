"""`pack report DIST/NAME`: re-render the package's report.html (pipeline/report) from the package
itself: manifest.json, report.json, its sample and models, and report.data.npz."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.commands.common import cli_errors, print_json, progress_for, require_package_folder


def report(
    package: Annotated[Path, typer.Argument(help="A package folder made by `pack build` (dist/<name>).")],
    open_page: Annotated[bool, typer.Option("--open", help="Open report.html in the default browser once written.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print {\"report\": PATH} as JSON; no progress output.")] = False,
) -> None:
    """Re-render report.html of a built package: checks, pictures and sound of every output, repairs, sizes, timings."""
    with cli_errors():
        from pipeline.report.render import write_report  # matplotlib and onnxruntime load only here

        require_package_folder(package, "report")
        path = write_report(package, None, progress_for(json_output))
    if json_output:
        print_json({"report": str(path)})
    else:
        typer.echo(f"report: {path}")
    if open_page:
        import webbrowser

        if not webbrowser.open(path.resolve().as_uri()):
            typer.echo(f"warning: no browser to open {path}; open it by hand", err=True)
