"""Sample inputs that look like the data a model is made for (recipe key `inputs.NAME.pattern`).

Uniform noise is a poor probe: an inpainting model sees no hole, an audio model no pitch or
silence, and fp16 errors that matter on real data hide. Patterns, all seeded:
- `box`: an inpainting mask, a rectangle of `hole` (default 1) on `known` (default 0);
- `image`: a smooth colour field with a few flat-coloured shapes, scaled to `range`;
- `speech`: a voiced signal, harmonics of a gliding pitch shaped by formants, in syllables with
  pauses, peak at `range`'s high end; the last axis is time;
- `spectrogram`: the STFT of that signal, complex as channels (re, im per audio channel, as
  Demucs and MDX lay them out), or its `magnitude` (raised to `power`) or `phase`;
- `mel`: its log-mel spectrogram, as vocoders take it.
The signal is a function of time and seed only, so a waveform and a spectrogram input of the same
recipe describe the same audio.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import PackError
from pipeline.recipe import InputSpec


def generate(spec: InputSpec, shape: list[int], dtype: str, seed: int) -> np.ndarray:
    """The sample for one input; errors name the recipe key when the shape does not fit."""
    maker = {"box": _box, "image": _image, "speech": _speech, "spectrogram": _spectrogram, "mel": _mel}[spec.pattern]
    array = maker(spec, shape, seed)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        array = np.clip(np.rint(array), info.min, info.max)
    return array.astype(dtype)


def _fail(spec: InputSpec, message: str) -> PackError:
    return PackError(f"recipe key 'inputs.{spec.name}.pattern': {spec.pattern!r} {message}")


def _box(spec: InputSpec, shape: list[int], seed: int) -> np.ndarray:
    if len(shape) < 2 or min(shape[-2:]) < 4:
        raise _fail(spec, f"needs a mask of at least 4x4 in its last two axes, got shape {shape}")
    rng = np.random.default_rng(seed)
    height, width = shape[-2:]
    box_h = int(rng.integers(height // 4, height // 2 + 1))
    box_w = int(rng.integers(width // 4, width // 2 + 1))
    top = int(rng.integers(0, height - box_h + 1))
    left = int(rng.integers(0, width - box_w + 1))
    mask = np.full(shape, float(spec.pattern_options.get("known", 0.0)))
    mask[..., top:top + box_h, left:left + box_w] = float(spec.pattern_options.get("hole", 1.0))
    return mask


def _image(spec: InputSpec, shape: list[int], seed: int) -> np.ndarray:
    if len(shape) < 3:
        raise _fail(spec, f"needs [..., channels, height, width], got shape {shape}")
    rng = np.random.default_rng(seed)
    channels, height, width = shape[-3:]
    y, x = np.meshgrid(np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij")
    image = np.empty((channels, height, width))
    for c in range(channels):
        field = rng.uniform(0.3, 0.7) + 0.15 * (x * rng.uniform(-1, 1) + y * rng.uniform(-1, 1))
        for _ in range(3):
            fx, fy, phase = rng.uniform(0.5, 3), rng.uniform(0.5, 3), rng.uniform(0, 2 * np.pi)
            field += 0.08 * np.sin(2 * np.pi * (fx * x + fy * y) + phase)
        image[c] = field
    for _ in range(4):  # flat shapes with sharp edges, like objects in a photo
        top, left = rng.uniform(0, 0.8, 2)
        size_y, size_x = rng.uniform(0.1, 0.35, 2)
        inside = (y >= top) & (y < top + size_y) & (x >= left) & (x < left + size_x)
        image[:, inside] = rng.uniform(0.05, 0.95, (channels, 1))
    image += rng.normal(0, 0.01, image.shape)  # sensor noise
    low, high = spec.range or (0.0, 1.0)
    image = low + (high - low) * np.clip(image, 0, 1)
    return np.broadcast_to(image, shape).copy()


def speech_signal(length: int, sample_rate: int, seed: int) -> np.ndarray:
    """A voiced, speech-like signal with peak 1: pitch glide, formants, syllables and pauses."""
    rng = np.random.default_rng(seed)
    t = np.arange(length) / sample_rate
    f0 = 130 + 35 * np.sin(2 * np.pi * 0.6 * t + rng.uniform(0, 2 * np.pi)) + 10 * np.sin(2 * np.pi * 3.1 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    formants = [(rng.uniform(500, 800), 1.0), (rng.uniform(1100, 1800), 0.6), (rng.uniform(2300, 3000), 0.3)]
    signal = np.zeros(length)
    for harmonic in range(1, 30):
        frequency = harmonic * f0
        gain = sum(weight * np.exp(-(((frequency - centre) / 250.0) ** 2)) for centre, weight in formants) + 0.02
        gain = np.where(frequency < sample_rate / 2, gain, 0.0)  # no aliasing above Nyquist
        signal += gain / harmonic * np.sin(harmonic * phase)
    syllables = np.clip(np.sin(2 * np.pi * 3.5 * t + rng.uniform(0, 2 * np.pi)), 0, None) ** 0.7
    signal = signal * syllables + 0.01 * rng.standard_normal(length)  # breath noise in the pauses
    return signal / max(float(np.max(np.abs(signal))), 1e-9)


def _speech(spec: InputSpec, shape: list[int], seed: int) -> np.ndarray:
    if not shape or shape[-1] < 2:
        raise _fail(spec, f"needs time on the last axis, got shape {shape}")
    rate = int(spec.pattern_options.get("sample_rate", 16000))
    signal = speech_signal(shape[-1], rate, seed)
    low, high = spec.range or (-0.5, 0.5)
    peak = max(abs(low), abs(high))
    channels = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    gains = 1.0 - 0.15 * np.arange(channels) / max(channels, 1)  # channels differ a little, like a stereo mix
    return (peak * gains[:, None] * signal[None, :]).reshape(shape)


def _stft(signal: np.ndarray, n_fft: int, hop: int, frames: int) -> np.ndarray:
    """Centred, Hann-windowed STFT: [bins, frames] complex."""
    padded = np.pad(signal, (n_fft // 2, n_fft // 2), mode="reflect")
    window = np.hanning(n_fft + 1)[:-1]
    starts = np.arange(frames) * hop
    index = starts[:, None] + np.arange(n_fft)[None, :]
    return np.fft.rfft(padded[index] * window, axis=-1).T


def _audio_for_frames(spec: InputSpec, bins: int, frames: int, seed: int, default_rate: int, default_n_fft: int | None) -> tuple[np.ndarray, int, int]:
    n_fft = int(spec.pattern_options.get("n_fft", default_n_fft or 2 * (bins - 1)))
    if n_fft // 2 + 1 < bins:
        raise _fail(spec, f"with n_fft {n_fft} gives {n_fft // 2 + 1} frequency bins, the input has {bins}; set 'inputs.{spec.name}.n_fft'")
    hop = int(spec.pattern_options.get("hop", n_fft // 4))
    rate = int(spec.pattern_options.get("sample_rate", default_rate))
    length = max(hop * (frames - 1), n_fft // 2 + 1)
    return speech_signal(length, rate, seed), n_fft, hop


def _spectrogram(spec: InputSpec, shape: list[int], seed: int) -> np.ndarray:
    component = spec.pattern_options.get("component", "complex")
    if len(shape) < 3 or (component == "complex" and (len(shape) < 4 or shape[-3] % 2)):
        want = "[..., 2 x channels, bins, frames]" if component == "complex" else "[..., bins, frames]"
        raise _fail(spec, f"({component}) needs {want}, got shape {shape}")
    bins, frames = shape[-2:]
    signal, n_fft, hop = _audio_for_frames(spec, bins, frames, seed, 44100, None)
    low, high = spec.range or (-0.5, 0.5)
    peak = max(abs(low), abs(high))
    spectrum = _stft(peak * signal, n_fft, hop, frames)[:bins]
    if spec.pattern_options.get("normalized", False):
        spectrum = spectrum / np.sqrt(n_fft)
    if component == "complex":
        channels = shape[-3] // 2
        gains = 1.0 - 0.15 * np.arange(channels) / channels
        planes = [part for gain in gains for part in (gain * spectrum.real, gain * spectrum.imag)]
        block = np.stack(planes)
    elif component == "magnitude":
        block = np.abs(spectrum) ** float(spec.pattern_options.get("power", 1.0))
    else:
        block = np.angle(spectrum)
    return np.broadcast_to(block, shape).copy()


def _mel(spec: InputSpec, shape: list[int], seed: int) -> np.ndarray:
    if len(shape) < 2:
        raise _fail(spec, f"needs [..., mels, frames], got shape {shape}")
    mels, frames = shape[-2:]
    rate = int(spec.pattern_options.get("sample_rate", 22050))
    n_fft = int(spec.pattern_options.get("n_fft", 1024))
    signal, n_fft, hop = _audio_for_frames(spec, 1, frames, seed, rate, n_fft)
    low, high = spec.range or (-0.5, 0.5)
    magnitude = np.abs(_stft(max(abs(low), abs(high)) * signal, n_fft, hop, frames))
    mel = np.log(np.clip(_mel_filters(mels, n_fft, rate) @ magnitude, 1e-5, None))
    return np.broadcast_to(mel, shape).copy()


def _mel_filters(mels: int, n_fft: int, rate: int) -> np.ndarray:
    """Slaney-style triangular filters on the mel scale, [mels, n_fft // 2 + 1]."""
    to_mel = lambda hz: 2595.0 * np.log10(1.0 + hz / 700.0)  # noqa: E731
    to_hz = lambda mel: 700.0 * (10 ** (mel / 2595.0) - 1.0)  # noqa: E731
    edges = to_hz(np.linspace(0, to_mel(rate / 2), mels + 2))
    bins = np.linspace(0, rate / 2, n_fft // 2 + 1)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins - lower) / (centre - lower)
    falling = (upper - bins) / (upper - centre)
    return np.clip(np.minimum(rising, falling), 0, None) * (2.0 / (upper - lower))
