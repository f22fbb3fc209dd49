"""Metrics that judge what a person perceives without hiding breakage."""

import numpy as np
import pytest

from pipeline.verify.judgement.metrics import compare, judge
from pipeline.verify.judgement.thresholds import threshold_for


def _image(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 1, (1, 3, 64, 64)).astype(np.float32)


def _audio(seed: int = 0) -> np.ndarray:
    t = np.arange(16000) / 16000
    envelope = np.where(t < 0.5, 1.0, 0.01)  # a loud half and a quiet half
    return (np.sin(2 * np.pi * 440 * t) * envelope + np.random.default_rng(seed).normal(0, 1e-4, t.size)).astype(np.float32)[None]


@pytest.mark.parametrize("ep", ["cpu", "webgpu"])
def test_one_pixel_off_passes_an_image_but_a_patch_of_wrong_pixels_fails(ep):
    reference = _image()
    threshold = threshold_for("image", "fp16", ep)
    one_pixel = reference.copy()
    one_pixel[0, 0, 10, 10] += 3.4 / 255 * 4  # the LaMa case, four times worse: one visible-only-zoomed pixel
    metrics = compare(reference, one_pixel, "image")
    assert metrics["max_abs_of_range"] > 0.01 and judge(metrics, threshold) == (True, None)
    patch = reference.copy()
    patch[0, :, :8, :8] += 0.1  # 64 of 4096 pixels visibly wrong
    passed, reason = judge(compare(reference, patch, "image"), threshold)
    assert not passed and "p999_abs_of_range" in reason


def test_fp16_rounding_of_an_image_passes():
    reference = _image()
    rounded = reference.astype(np.float16).astype(np.float32)
    assert judge(compare(reference, rounded, "image"), threshold_for("image", "fp16", "cpu"))[0]


def test_jsep_all_zeros_fail_images_and_audio():
    for kind, reference in (("image", _image()), ("audio", _audio())):
        for ep in ("cpu", "webgpu"):
            metrics = compare(reference, np.zeros_like(reference), kind)
            threshold = threshold_for(kind, "fp16", ep)
            assert not judge(metrics, threshold)[0], (kind, ep)
            # The perceptual figures collapse on their own, whatever else is bounded.
            for key in ("psnr_db", "snr_db", "seg_snr_db"):
                if key in threshold:
                    assert metrics[key] < threshold[key] and metrics[key] <= 10, (kind, ep, key, metrics[key])
            if kind == "image":
                assert metrics["p999_abs_of_range"] > 10 * threshold["p999_abs_of_range"]


def test_negative_step_slice_off_by_one_fails_on_shape():
    reference = _audio()
    short = reference[:, :-1]  # the root onnxruntime-web build computes the flipped half one short
    for kind in ("audio", "image", "tensor"):
        metrics = compare(reference, short, kind)
        passed, reason = judge(metrics, threshold_for(kind, "fp16", "webgpu"))
        assert not passed and reason.startswith("shape")


def test_segmental_snr_catches_a_broken_quiet_passage_that_whole_snr_hides():
    reference = _audio()
    broken = reference.copy()
    broken[:, 8000:] = 0  # the quiet half lost: 0.01 % of the energy
    metrics = compare(reference, broken, "audio")
    assert metrics["snr_db"] > 25  # the whole-signal SNR passes the fp16 bound...
    passed, reason = judge(metrics, threshold_for("audio", "fp16", "cpu"))
    assert not passed and "seg_snr_db" in reason  # ...the segmental SNR does not
    fine = (reference.astype(np.float16)).astype(np.float32)
    assert judge(compare(reference, fine, "audio"), threshold_for("audio", "fp16", "cpu"))[0]


def test_recipe_overrides_accept_the_new_metric_names():
    assert threshold_for("image", "fp16", "cpu", {"p999_abs_of_range": 0.05})["p999_abs_of_range"] == 0.05
    assert threshold_for("audio", "fp16", "webgpu")["seg_snr_db"] == 10.0


def _image_512(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 255, (1, 3, 512, 512)).astype(np.float32)


def _lama_like_fp16(reference: np.ndarray) -> np.ndarray:
    """The LaMa-style 512² fp16 output that used to be refused: PSNR ~55 dB, p99.9 3.1 of 255
    levels (fine noise everywhere, 0.2 % of the pixels 3.1 levels off)."""
    rng = np.random.default_rng(1)
    noisy = reference + rng.normal(0, 0.4, reference.shape)
    outliers = rng.random(reference.shape) < 0.002
    return (noisy + outliers * rng.choice([-3.1, 3.1], reference.shape)).astype(np.float32)


@pytest.mark.parametrize("ep", ["cpu", "wasm", "webgpu"])
def test_visually_lossless_fp16_passes_while_zeros_one_short_and_a_wrong_patch_fail(ep):
    reference = _image_512()
    threshold = threshold_for("image", "fp16", ep)
    lossless = compare(reference, _lama_like_fp16(reference), "image")
    assert 54 < lossless["psnr_db"] < 57 and 3.0 / 255 < lossless["p999_abs_of_range"] < 3.2 / 255
    assert judge(lossless, threshold) == (True, None)
    assert not judge(lossless, threshold_for("image", "fp32", ep))[0]  # it is not fp32-exact
    assert not judge(compare(reference, np.zeros_like(reference), "image"), threshold)[0]
    passed, reason = judge(compare(reference, reference[..., :-1], "image"), threshold)
    assert not passed and reason.startswith("shape")
    patch = reference.copy()
    patch[0, :, 200:208, 300:308] += 25.5  # one 8x8 patch a tenth of the range off: 0.02 % of the pixels
    metrics = compare(reference, patch, "image")
    assert metrics["p999_abs_of_range"] == 0 and metrics["psnr_db"] > 50  # neither sees it...
    passed, reason = judge(metrics, threshold)
    assert not passed and "block_mae_of_range" in reason  # ...the worst block does


@pytest.mark.parametrize("precision,ep", [("fp32", "cpu"), ("fp16", "wasm"), ("fp16", "webgpu")])
def test_uint8_images_allow_one_level_on_a_small_share_of_pixels(precision, ep):
    rng = np.random.default_rng(2)
    reference = rng.integers(10, 245, (1, 3, 512, 512)).astype(np.uint8)
    threshold = threshold_for("image", precision, ep)
    flips = rng.random(reference.shape) < 0.0026  # MI-GAN 512²: 0.26 % of the pixels one level off
    one_level = (reference.astype(np.int16) + flips * rng.choice([-1, 1], reference.shape)).astype(np.uint8)
    metrics = compare(reference, one_level, "image")
    assert 0.002 < metrics["one_level_share"] < 0.003 and metrics["p999_abs_of_range"] == 0
    assert judge(metrics, threshold) == (True, None)
    many = (reference.astype(np.int16) + (rng.random(reference.shape) < 0.05)).astype(np.uint8)
    passed, reason = judge(compare(reference, many, "image"), threshold)
    assert not passed and "one_level_share" in reason
    patch = reference.copy()
    patch[0, 0, 100:108, 100:108] += 10  # ten levels on one 8x8 patch
    passed, reason = judge(compare(reference, patch, "image"), threshold)
    assert not passed and "block_mae_of_range" in reason
    assert not judge(compare(reference, np.zeros_like(reference), "image"), threshold)[0]


def test_pack_verify_reads_back_exactly_the_bounds_the_build_checked():
    # the manifest's table (threshold_table) is what the build's browser checks use; `pack verify`
    # (recorded_thresholds) must use the same bounds, recipe overrides and fp16-on-WebGPU widening included
    from dataclasses import dataclass

    from pipeline.recipe import OutputSpec, Recipe
    from pipeline.verify.judgement.thresholds import BROWSER_EPS, check_bounds, recorded_thresholds, threshold_table

    @dataclass
    class Variant:
        name: str
        precision: str
        self_reference: str | None = None

    variants = [Variant("fp32", "fp32"), Variant("fp16", "fp16"), Variant("fp16w", "fp16w")]
    recipe = Recipe(name="m")
    recipe.outputs["image"] = OutputSpec(kind="image", thresholds={"fp16": {"p999_abs_of_range": 0.05, "psnr_db": 40.0}})
    recipe.outputs["audio"] = OutputSpec(kind="audio", thresholds={"fp32": {"snr_db": 70.0}})
    outputs = ["image", "audio", "tensor"]
    table = threshold_table(variants, outputs, recipe, {"webgpu": ["fp16", "fp32"], "wasm": ["fp32"]})
    manifest = {"thresholds": table, "variants": {v.name: {"precision": v.precision} for v in variants},
                "outputs": [{"name": name, "kind": recipe.outputs[name].kind if name in recipe.outputs else "tensor"} for name in outputs]}
    read_back = recorded_thresholds(manifest)
    for ep in BROWSER_EPS:
        assert read_back[ep] == table[ep]
    # an override tighter than the WebGPU default is widened there, as fp16 accumulates in fp16
    assert table["webgpu"]["fp16"]["image"]["psnr_db"] == check_bounds("image", "fp16", "webgpu")["psnr_db"] < 40.0
    assert table["wasm"]["fp16"]["image"]["psnr_db"] == 40.0 and table["cpu"]["fp32"]["audio"]["snr_db"] == 70.0
