"""The `pack` command line. Each command's implementation lives in `pipeline/commands/`; this
module only names them. Commands are imported when they run (or when their own help is asked
for), so `pack --help` imports none of them, and a command's heavy dependencies (onnx,
onnxruntime, Playwright, boto3, numpy) load only for the command that needs them.

Exit codes: 0 success, 1 a check failed, 2 bad input or environment (one `error:` line, nothing
written), 130 / 143 stopped by Ctrl-C / SIGTERM (nothing half-written left).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}


@dataclass(frozen=True)
class CommandEntry:
    target: str  # "module:function"
    summary: str  # the one line `pack --help` shows (tests check it against the docstring)
    epilog: str = ""


# One entry per command, in the order `pack --help` lists them.
COMMANDS: dict[str, CommandEntry] = {
    "build": CommandEntry("pipeline.commands.build:build", "Build a verified, compressed browser package from a recipe or a model.", "BUILD_EXAMPLES"),
    "recipes": CommandEntry("pipeline.commands.build:recipes", "List the built-in recipes, one line each: what they ship, the source's size, licence and URL.", "RECIPES_EXAMPLES"),
    "publish": CommandEntry("pipeline.commands.publish:publish", "Publish packages to S3 or R2: hashed files, then manifest, then loader; unchanged objects are skipped.", "Example:  pack publish dist/ --bucket my-models --public-url https://models.example.com --dry-run"),
    "verify": CommandEntry("pipeline.commands.verify:verify", "Verify a built package in headless Chromium on WebGPU and WASM, and on onnxruntime's WebGPU kernels on lavapipe where installed (exit 1 when a check fails).", "Example:  pack verify dist/my-model --json > verify.json"),
    "inspect": CommandEntry("pipeline.commands.graph:inspect", "Opset, sizes, ops, inputs/outputs, hazards and their repairs, fp16 readiness, CPU fallback.", "Example:  pack inspect model.onnx --no-browser"),
    "diagnose": CommandEntry("pipeline.commands.graph:diagnose", "Run the model on each bundle x EP and name the first node whose output parts from the host.", "Example:  pack diagnose model.onnx --ep webgpu --dim batch=1"),
    "serve": CommandEntry("pipeline.commands.serve:serve", "Serve built packages locally as production does (brotli, media types, COOP/COEP); Ctrl-C stops.", "Example:  pack serve dist/ --port 8000   (then open http://127.0.0.1:8000/<name>/index.html)"),
    "export": CommandEntry("pipeline.commands.export:export", "Write the app copy of a package: manifest, loader, runtime and models, one body each; no report, no demo page.", "Example:  pack export dist/gtcrn web/public/models/gtcrn --variants fp32 --host nginx --url-path /models/gtcrn/"),
    "report": CommandEntry("pipeline.commands.report:report", "Re-render report.html of a built package: checks, pictures and sound of every output, repairs, sizes, timings.", "Example:  pack report dist/gtcrn --open"),
}


def load_command(name: str) -> click.Command:
    """The click command of one entry, built by typer from the function's signature."""
    entry = COMMANDS[name]
    module_name, function_name = entry.target.split(":")
    module = importlib.import_module(module_name)
    epilog = getattr(module, entry.epilog) if entry.epilog.isidentifier() else entry.epilog
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    single.command(name=name, epilog=epilog, context_settings=HELP_OPTIONS)(getattr(module, function_name))
    return typer.main.get_command(single)


class LazyCommands(TyperGroup):
    """Lists commands from COMMANDS and imports one only when it is invoked or its help shown."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        if ctx.resilient_parsing or getattr(ctx, "_pack_listing", False):
            # `pack --help` (and shell completion) only need the one-line summary. click is imported
            # here only: typer carries its own copy, and a command's start need not load a second.
            import click

            return click.Command(cmd_name, short_help=COMMANDS[cmd_name].summary, help=COMMANDS[cmd_name].summary)
        return load_command(cmd_name)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        ctx._pack_listing = True  # type: ignore[attr-defined]
        try:
            super().format_help(ctx, formatter)
        finally:
            ctx._pack_listing = False  # type: ignore[attr-defined]


app = typer.Typer(
    name="pack",
    cls=LazyCommands,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=HELP_OPTIONS,
)


def package_version() -> str:
    from importlib import metadata  # here, not at the top: every command would pay for it (30 ms)

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


if __name__ == "__main__":
    app()
