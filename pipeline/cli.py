"""The `pack` command line. Each command's implementation lives in its pipeline stage;
this module only wires them into one typer app. Command modules import their heavy dependencies
(onnx, onnxruntime, Playwright) inside the command bodies, so `pack --help` stays light.

Exit codes: 0 success, 1 a check failed, 2 bad input or environment (one `error:` line, nothing
written), 130 / 143 stopped by Ctrl-C / SIGTERM (nothing half-written left).
"""

from __future__ import annotations

from importlib import metadata
from typing import Annotated, Optional

import typer

app = typer.Typer(
    name="pack",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def package_version() -> str:
    try:
        return metadata.version("pack")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        from pipeline import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"pack {package_version()}")
        raise typer.Exit(0)


@app.callback()
def main(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_print_version, is_eager=True, help="Print pack's version and exit.")] = None,
) -> None:
    """Turn ONNX models into verified, compressed, CDN-ready browser packages.

    Exit codes: 0 success, 1 a check failed, 2 bad input (one error line, nothing written), 130/143 stopped by Ctrl-C/SIGTERM.
    """


# --- commands (one import + one registration per command) ---
from pipeline.commands.build import BUILD_EXAMPLES, build, recipes  # noqa: E402
from pipeline.commands.publish import publish  # noqa: E402
from pipeline.commands.verify import verify  # noqa: E402
from pipeline.commands.graph import diagnose, inspect  # noqa: E402
from pipeline.commands.serve import serve  # noqa: E402
from pipeline.commands.report import report  # noqa: E402

app.command(epilog=BUILD_EXAMPLES)(build)
app.command(epilog="Example:  pack recipes --json")(recipes)
app.command(epilog="Example:  pack publish dist/ --bucket my-models --public-url https://models.example.com --dry-run")(publish)
app.command(epilog="Example:  pack verify dist/my-model --json > verify.json")(verify)
app.command(epilog="Example:  pack inspect model.onnx --no-browser")(inspect)
app.command(epilog="Example:  pack diagnose model.onnx --ep webgpu --dim batch=1")(diagnose)
app.command(epilog="Example:  pack serve dist/ --port 8000   (then open http://127.0.0.1:8000/<name>/index.html)")(serve)
app.command(epilog="Example:  pack report dist/gtcrn --open")(report)
# --- end commands ---


if __name__ == "__main__":
    app()
