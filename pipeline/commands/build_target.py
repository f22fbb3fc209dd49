"""One target of `pack build`: the flags every target of a build shares, the checks made before any
work, and the build of one target with its summary. `pack build` calls it for one target, a catalog
build (pipeline/commands/catalog.py) in one process per target."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import typer

from pipeline.commands.browsers import DEFAULT_BUDGET_S, grid_settings
from pipeline.commands.common import check_output_folder, cli_errors, open_shared_store, print_json, progress_for
from pipeline.errors import PackError


@dataclass(frozen=True)
class BuildFlags:
    """The options of `pack build` that are the same for every target of a catalog build."""

    out: Path = Path("dist")
    no_browser: bool = False
    gpu: bool = False
    no_reuse: bool = False
    lock: Optional[Path] = None
    browsers: Optional[list[str]] = None
    cdps: Optional[list[str]] = None
    require_all: bool = False
    browser_budget_s: int = DEFAULT_BUDGET_S
    remote_chromium: Optional[str] = None
    engines: str = "chromium"  # --engines: the engines of the browser checks and the default load, comma-separated
    cache_url: Optional[str] = None  # --cache-url: each target's process opens its own session on the store

    def to_data(self) -> dict:
        return {key: str(value) if isinstance(value, Path) else value for key, value in asdict(self).items()}

    @classmethod
    def from_data(cls, data: dict) -> "BuildFlags":
        return cls(**{**data, "out": Path(data["out"]), "lock": Path(data["lock"]) if data["lock"] else None})


def check_settings(settings: BuildFlags):
    """What every build checks before any work (bad input exits 2, nothing written); returns the
    remote-browser grid, or None for the local browser."""
    from pipeline.cache import check_cache_writable

    from pipeline.verify.engines.browser.default_load import parse_engines

    parse_engines(settings.engines)  # an unknown engine is bad input
    grid = grid_settings(settings.browsers, settings.cdps, require_all=settings.require_all, budget_s=settings.browser_budget_s, remote_chromium=settings.remote_chromium)
    if grid is not None and settings.no_browser:
        raise PackError("--no-browser with --browser/--cdp (or PACK_BROWSERS): choose one")
    check_output_folder(settings.out)
    check_cache_writable()
    return grid


def build_one(target: str, settings: BuildFlags, *, source: str | None = None, sha256: list[str] | None = None, name: str | None = None, inputs: Path | None = None,
              input_shapes: list[str] | None = None, json_output: bool = False) -> None:
    """One target: the package, then its summary (or report.json under --json); raises typer.Exit
    with the build's exit code. A catalog build runs this in one process per target."""
    with cli_errors(settings.out):
        if inputs is not None and not inputs.is_file():
            raise PackError(f"--inputs {inputs}: no such file; give an .npz with one array per model input")
        from pipeline.source.pins import parse_sha256_options

        graph_sha256, data_sha256 = parse_sha256_options(sha256 or [])
        grid = check_settings(settings)
        shared = open_shared_store(settings.cache_url)  # named but unusable: bad input, before any work
        from pipeline.build import BuildOptions, build as run_build
        from pipeline.verify.engines.browser.default_load import parse_engines
        from pipeline.commands.summary import print_summary

        options = BuildOptions(target=target, source=source, source_sha256=graph_sha256, source_data_sha256=data_sha256, name=name, inputs_npz=inputs, input_shapes=input_shapes or [], out_dir=settings.out,
                               browser=not settings.no_browser, gpu=settings.gpu, lock=settings.lock, reuse=not settings.no_reuse, grid=grid,
                               engines=parse_engines(settings.engines))
        result = run_build(options, progress_for(json_output, lines_when_piped=True), shared)
    if json_output:
        print_json(result.report)
    else:
        if result.reused:
            typer.echo(f"unchanged: the inputs match the stored build {result.reused[:12]}; its package is in place (--no-reuse builds again)")
        if result.shared:
            typer.echo(result.shared)
        print_summary(result.report, result.package_dir, result.lock)
    raise typer.Exit(result.exit_code)
