"""`pack inspect` and `pack diagnose`. onnx and the browser runner are imported in the command
bodies, so other commands do not load them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from pipeline.commands.common import cli_errors, print_json, progress_for
from pipeline.errors import PackError
from pipeline.runtime import DEFAULT_VERSION

if TYPE_CHECKING:  # numpy is imported where used: every `pack` command would load it otherwise
    import numpy as np

BUNDLES = ("root", "webgpu")
EPS = ("webgpu", "wasm")


def inspect(
    model_path: Annotated[Path, typer.Argument(metavar="MODEL.onnx", help="The ONNX model to inspect.")],
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Skip measuring CPU fallback in headless Chromium.")] = False,
    runtime_version: Annotated[str, typer.Option("--runtime", help="onnxruntime-web to measure with: an exact npm version (dev builds too) or a local build's folder.")] = DEFAULT_VERSION,
    gpu: Annotated[bool, typer.Option("--gpu", help="Launch Chromium with the flags for a hardware Vulkan adapter.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the inspection as JSON; no progress output.")] = False,
) -> None:
    """Opset, sizes, ops, inputs/outputs, hazards and their repairs, fp16 readiness, CPU fallback."""
    from pipeline.graph.inspection import human_lines, inspect_model, repaired
    from pipeline.precision.readiness import fp16_readiness
    from pipeline.graph.model_io import load_model

    with cli_errors():
        progress = progress_for(json_output)
        model = load_model(model_path)
        document = inspect_model(model_path, model)
        document["fp16"] = fp16_readiness(model, document["hazards"])
        document["cpu_fallback"] = None
        if not no_browser:
            from pipeline.runtime import runtime_from_option
            from pipeline.verify.engines.browser.models import BrowserModelRunner, measure_cpu_fallback

            runtime = runtime_from_option(runtime_version, "--runtime", progress)
            progress.note("Measuring node placement in headless Chromium (webgpu bundle)")
            fixed, _ = repaired(model)  # as `pack build` would ship it
            with BrowserModelRunner(runtime, gpu=gpu) as runner:
                document["cpu_fallback"] = measure_cpu_fallback(fixed, runner, "repaired model" if fixed is not model else "model as is")
    if json_output:
        print_json(document)
    else:
        for line in human_lines(document):
            typer.echo(line)


def _parse_dims(options: list[str]) -> dict[str, int]:
    dims = {}
    for option in options:
        name, _, value = option.partition("=")
        if not name or not value.isdigit() or int(value) < 1:
            raise PackError(f"--dim '{option}': expected NAME=SIZE with a positive size, e.g. --dim batch=1")
        dims[name] = int(value)
    return dims


def _load_inputs(path: Path, model) -> dict[str, np.ndarray]:
    import numpy as np

    if not path.is_file():
        raise PackError(f"--inputs {path}: no such file; give an .npz with one array per model input")
    try:
        archive = np.load(path)
    except (OSError, ValueError) as error:
        raise PackError(f"--inputs {path}: not a readable .npz ({error}); save inputs with numpy.savez") from None
    initializers = {i.name for i in model.graph.initializer}
    wanted = [v.name for v in model.graph.input if v.name not in initializers]
    missing = [name for name in wanted if name not in archive.files]
    if missing:
        raise PackError(f"--inputs {path}: no array for input(s) {', '.join(missing)}; the keys must be the model's input names")
    return {name: archive[name] for name in wanted}


def diagnose(
    model_path: Annotated[Path, typer.Argument(metavar="MODEL.onnx", help="The model that fails or disagrees in the browser.")],
    bundle: Annotated[Optional[list[str]], typer.Option("--bundle", help="onnxruntime-web bundle: root, webgpu (repeatable; default both).")] = None,
    ep: Annotated[Optional[list[str]], typer.Option("--ep", help="Execution provider: webgpu, wasm (repeatable; default both).")] = None,
    inputs: Annotated[Optional[Path], typer.Option("--inputs", help="Inputs as .npz, keys = input names (default: seeded random).")] = None,
    dim: Annotated[Optional[list[str]], typer.Option("--dim", help="NAME=SIZE for a symbolic input dimension (repeatable; default 1).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random inputs.")] = 0,
    runtime_version: Annotated[str, typer.Option("--runtime", help="onnxruntime-web to run: an exact npm version (dev builds too) or a local build's folder.")] = DEFAULT_VERSION,
    gpu: Annotated[bool, typer.Option("--gpu", help="Launch Chromium with the flags for a hardware Vulkan adapter.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the diagnosis as JSON; no progress output.")] = False,
) -> None:
    """Run the model on each bundle x EP and name the first node whose output parts from the host.

    Exit code 0 when every run agrees with onnxruntime on the host, 1 when some run parts.
    """
    from pipeline.runtime import runtime_from_option
    from pipeline.verify.engines.browser.models import BrowserModelRunner
    from pipeline.verify.diagnose import diagnose as run_diagnosis
    from pipeline.verify.diagnose import human_lines, random_feeds
    from pipeline.graph.model_io import load_model

    with cli_errors():
        bundles = bundle or list(BUNDLES)
        eps = ep or list(EPS)
        for name in bundles:
            if name not in BUNDLES:
                raise PackError(f"--bundle {name}: unknown; choose from {', '.join(BUNDLES)}")
        for name in eps:
            if name not in EPS:
                raise PackError(f"--ep {name}: unknown; choose from {', '.join(EPS)}")
        dims = _parse_dims(dim or [])
        progress = progress_for(json_output)
        model = load_model(model_path)
        feeds = _load_inputs(inputs, model) if inputs else random_feeds(model, dims, seed)
        combos = tuple((b, e) for b in bundles for e in eps)
        with BrowserModelRunner(runtime_from_option(runtime_version, "--runtime", progress), gpu=gpu) as runner:
            document = run_diagnosis(model, feeds, runner, combos, progress)
        document["model"] = model_path.name
    if json_output:
        print_json(document)
    else:
        for line in human_lines(document):
            typer.echo(line)
    raise typer.Exit(1 if document["parted"] else 0)
