"""The `pack` command line. Each command's implementation lives in its pipeline stage;
this module only wires them into one typer app and turns PackError into exit code 2."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="pack",
    help="Turn ONNX models into verified, compressed, CDN-ready browser packages.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# --- commands (one import + one registration per command) ---
from pipeline.commands.build import build, recipes  # noqa: E402
from pipeline.commands.publish import publish  # noqa: E402
from pipeline.commands.verify import verify  # noqa: E402
from pipeline.commands.graph import diagnose, inspect  # noqa: E402

app.command()(build)
app.command()(recipes)
app.command()(publish)
app.command()(verify)
app.command()(inspect)
app.command()(diagnose)
# --- end commands ---


if __name__ == "__main__":
    app()
