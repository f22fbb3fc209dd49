"""Metrics that judge what a person perceives without hiding breakage."""

import numpy as np
import pytest

from pipeline.verify.metrics import compare, judge
from pipeline.verify.thresholds import threshold_for


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
