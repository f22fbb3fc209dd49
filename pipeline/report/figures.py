"""The report's charts and pictures, drawn with matplotlib (Agg, no display) and embedded as data
URIs: SVG for charts (crisp at any width), PNG for pictures.

Each output is drawn as what it is (`layout_of`, the twin of demo.js's imageLayout/audioLayout): an
image or mask, a waveform (with its spectrogram), a spectrum frame (complex bins as [.., F, .., 2],
GTCRN's enh), or, for any other tensor, a histogram of its error against the fp32 reference.
"""

from __future__ import annotations

import base64
import io
import math
import wave
from dataclasses import dataclass

import numpy as np

# Matplotlib is imported lazily (first figure), with the Agg backend: no display, no GUI toolkit.
_plt = None

IMAGE_CHANNELS = (1, 3, 4)
MIN_AUDIO_SAMPLES = 256  # shorter "audio" is drawn as a line, not played
MAX_WAV_SECONDS = 60
WIDTH_IN = 8.0  # figure width; the page scales it down to the screen (400 px phones too)
REFERENCE_COLOR = "#555555"
RUN_COLOR = "#1f77b4"
ERROR_COLOR = "#d62728"


def _pyplot():
    global _plt
    if _plt is None:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt

        plt.rcParams.update({"font.size": 9, "axes.titlesize": 9, "svg.fonttype": "path", "figure.dpi": 100})
        _plt = plt
    return _plt


def _uri(fig, fmt: str) -> str:
    plt = _pyplot()
    buffer = io.BytesIO()
    # no date or software version in the file: the same data draws the same bytes
    metadata = {"Date": None, "Creator": None} if fmt == "svg" else {"Software": None}
    fig.savefig(buffer, format=fmt, metadata=metadata, dpi=100)  # laid out by tight_layout: one draw, not two
    plt.close(fig)
    mime = "image/svg+xml" if fmt == "svg" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(buffer.getvalue()).decode('ascii')}"


# ----- what a tensor is ------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    what: str  # image | waveform | spectrum | tensor
    shape: tuple[int, ...] = ()  # image (C, H, W, planar 1/0); waveform (channels, T); spectrum (F, T)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    dims = list(shape)
    while len(dims) > 1 and dims[0] == 1:
        dims = dims[1:]
    return tuple(dims)


def image_layout(shape: tuple[int, ...]) -> Layout | None:
    d = _squeezed(shape)
    if len(d) == 3 and d[0] in IMAGE_CHANNELS and d[1] >= 8 and d[2] >= 8:
        return Layout("image", (d[0], d[1], d[2], 1))
    if len(d) == 3 and d[2] in IMAGE_CHANNELS and d[0] >= 8 and d[1] >= 8:
        return Layout("image", (d[2], d[0], d[1], 0))
    if len(d) == 2 and d[0] >= 8 and d[1] >= 8:
        return Layout("image", (1, d[0], d[1], 1))
    return None


def layout_of(kind: str, shape: tuple[int, ...]) -> Layout:
    """How to draw an output of manifest `kind` and this shape."""
    if kind in ("image", "mask"):
        return image_layout(shape) or Layout("tensor")
    if kind == "audio":
        d = _squeezed(shape)
        if len(d) >= 2 and d[-1] == 2 and math.prod(d[:-1]) > 2:
            # complex bins [.., F, .., 2]: the longest axis is frequency, the rest time frames
            bins = max(d[:-1])
            return Layout("spectrum", (bins, math.prod(d[:-1]) // bins))
        length = d[-1]
        channels = math.prod(d[:-1]) if len(d) > 1 else 1
        if length >= MIN_AUDIO_SAMPLES:
            return Layout("waveform", (channels, length))
    return Layout("tensor")


def as_image(array: np.ndarray, layout: Layout) -> np.ndarray:
    """[H, W, C] float."""
    c, h, w, planar = layout.shape
    values = np.asarray(array, dtype=np.float64).reshape(-1)[: c * h * w]
    image = values.reshape(c, h, w).transpose(1, 2, 0) if planar else values.reshape(h, w, c)
    return image[..., :3] if c == 4 else image


def image_scale(reference: np.ndarray, dtype: np.dtype):
    """value -> [0, 1] for display, from the reference's range (the same for every run, so a darker
    variant looks darker): common ranges first, else the reference's min..max."""
    low, high = float(np.nanmin(reference)), float(np.nanmax(reference))
    if np.dtype(dtype) == np.uint8 or (low >= 0 and high <= 255 and high > 1.01):
        return lambda v: np.clip(v / 255.0, 0, 1)
    if low >= -0.01 and high <= 1.01:
        return lambda v: np.clip(v, 0, 1)
    if low >= -1.01 and high <= 1.01:
        return lambda v: np.clip((v + 1) / 2, 0, 1)
    span = (high - low) or 1.0
    return lambda v: np.clip((v - low) / span, 0, 1)


def waveform(array: np.ndarray, layout: Layout) -> np.ndarray:
    """[channels, T] float; leading groups (stems) beyond two channels keep the first two rows."""
    channels, length = layout.shape
    values = np.asarray(array, dtype=np.float64).reshape(channels, length)
    return values[:2]


def spectrum(array: np.ndarray, layout: Layout) -> np.ndarray:
    """[F, T] magnitude of complex bins stored as (..., 2)."""
    bins, frames = layout.shape
    d = _squeezed(array.shape)
    values = np.asarray(array, dtype=np.float64).reshape(d)
    magnitude = np.hypot(values[..., 0], values[..., 1])
    axis = int(np.argmax(magnitude.shape))
    magnitude = np.moveaxis(magnitude, axis, 0).reshape(bins, frames)
    return magnitude


# ----- charts --------------------------------------------------------------------------------


def sizes_chart(rows: list[tuple[str, int, int | None]]) -> str:
    """Horizontal bars per file: raw bytes and brotli bytes (log scale: 1 KB and 20 MB side by side)."""
    plt = _pyplot()
    height = 0.9 + 0.32 * len(rows)
    fig, ax = plt.subplots(figsize=(WIDTH_IN, height))
    ys = np.arange(len(rows))
    raw = [max(r[1], 1) for r in rows]
    encoded = [max(r[2], 1) if r[2] else np.nan for r in rows]
    ax.barh(ys - 0.2, raw, height=0.4, label="raw", color="#9ecae1")
    ax.barh(ys + 0.2, encoded, height=0.4, label="brotli (what is transferred)", color="#3182bd")
    for y, r in zip(ys, rows):
        transferred = r[2] or r[1]
        ax.text(max(r[1], transferred) * 1.15, y, _bytes(transferred), va="center", fontsize=8)
    ax.set_yticks(ys, [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=max(raw) * 8)
    ax.set_xlabel("bytes (log scale); label: bytes transferred")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _uri(fig, "svg")


def timings_chart(runs: dict[str, dict]) -> str:
    """Grouped bars per browser run: session create, first run, steady run (ms, log scale)."""
    plt = _pyplot()
    keys = (("session_create_ms", "session create", "#bdbdbd"), ("first_run_ms", "first run", "#fdae6b"), ("steady_run_ms", "steady run", "#e6550d"))
    labels = list(runs)
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.9 + 0.55 * len(labels)))
    ys = np.arange(len(labels))
    for i, (key, name, color) in enumerate(keys):
        values = [runs[label].get(key) or np.nan for label in labels]
        ax.barh(ys + (i - 1) * 0.26, values, height=0.26, label=name, color=color)
        for y, value in zip(ys, values):
            if not np.isnan(value):
                ax.text(value * 1.08, y + (i - 1) * 0.26, f"{value:.0f}" if value >= 10 else f"{value:.1f}", va="center", fontsize=7)
    ax.set_yticks(ys, labels)
    ax.invert_yaxis()
    ax.set_xscale("log")
    finite = [v.get(k) for v in runs.values() for k, _, _ in keys if v.get(k)]
    if finite:
        ax.set_xlim(min(finite) / 2, max(finite) * 6)
    ax.set_xlabel("ms (log scale), production settings")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _uri(fig, "svg")


def _bytes(n: int) -> str:
    for unit, size in (("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


# ----- pictures of one output ----------------------------------------------------------------


def image_figure(inputs: list[tuple[str, np.ndarray]], reference: np.ndarray, runs: list[tuple[str, np.ndarray, str]], layout: Layout) -> str:
    """First row: the sample input(s) and the fp32 reference; then per run: its output and a heat
    map of |output - reference| as a fraction of the reference's range."""
    plt = _pyplot()
    scale = image_scale(reference, reference.dtype)
    ref_image = as_image(reference, layout)
    value_range = float(np.nanmax(ref_image) - np.nanmin(ref_image)) or 1.0
    columns = max(2, len(inputs) + 1)
    rows = 1 + len(runs)
    c, h, w, _ = layout.shape
    cell = WIDTH_IN / columns
    fig, axes = plt.subplots(rows, columns, figsize=(WIDTH_IN, rows * cell * h / w + 0.45 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    panels = [(f"input {name}", _show_input(array)) for name, array in inputs] + [("fp32 reference (host)", _rgb(scale(ref_image)))]
    for ax, (title, picture) in zip(axes[0], panels):
        _imshow(ax, picture)
        ax.set_title(title)
    for row, (label, array, caption) in enumerate(runs, start=1):
        image = as_image(array, layout)
        _imshow(axes[row][0], _rgb(scale(image)))
        axes[row][0].set_title(f"{label}\n{caption}")
        error = np.nanmean(np.abs(image - ref_image), axis=-1) / value_range
        error = np.where(np.isfinite(error), error, 1.0)
        top = max(float(error.max()), 1e-6)
        shown = axes[row][1].imshow(error, cmap="magma", vmin=0, vmax=top, interpolation="nearest")
        axes[row][1].set_title(f"|error| / range, max {top:.2g}")
        fig.colorbar(shown, ax=axes[row][1], fraction=0.046, pad=0.02)
    fig.tight_layout()
    return _uri(fig, "png")


def boxes_figure(image: np.ndarray, panels: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], most: int = 50) -> str:
    """The sample image once per panel (the reference, then each run) with that panel's boxes
    (x1 y1 x2 y2 in the image's pixels) drawn and labelled with class and score, the best `most`."""
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    picture = _show_input(image)
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    h, w = picture.shape[:2]
    cell = WIDTH_IN / columns
    fig, axes = plt.subplots(rows, columns, figsize=(WIDTH_IN, rows * cell * h / w + 0.45 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (title, boxes, scores, classes) in zip(axes.flat, panels):
        _imshow(ax, picture)
        for (x1, y1, x2, y2), score, cls in list(zip(boxes, scores, classes))[:most]:
            ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="#e6550d", linewidth=1))
            ax.text(x1, y1, f"{int(cls)} {score:.2f}", color="white", fontsize=6, va="bottom", bbox={"facecolor": "#e6550d", "pad": 0.5, "linewidth": 0})
        ax.set_xlim(0, w)
        ax.set_ylim(h, 0)
        ax.set_title(f"{title}: {len(boxes)} boxes" + (f" (best {most} drawn)" if len(boxes) > most else ""))
    fig.tight_layout()
    return _uri(fig, "png")


def _rgb(image: np.ndarray) -> np.ndarray:
    return np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image


def _imshow(ax, picture: np.ndarray) -> None:
    ax.imshow(picture, interpolation="nearest" if picture.shape[0] <= 128 else "antialiased")


def _show_input(array: np.ndarray) -> np.ndarray:
    layout = image_layout(array.shape)
    image = as_image(array, layout)
    return _rgb(image_scale(image, array.dtype)(image))


def audio_figure(reference: np.ndarray, runs: list[tuple[str, np.ndarray, str]], layout: Layout, sample_rate: int) -> str:
    """Rows: the fp32 reference, then each run; columns: waveform (a run's error in red over it)
    and spectrogram."""
    plt = _pyplot()
    ref = waveform(reference, layout)
    rows = 1 + len(runs)
    fig, axes = plt.subplots(rows, 2, figsize=(WIDTH_IN, 1.7 * rows + 0.3), squeeze=False)
    peak = float(np.nanmax(np.abs(ref))) or 1.0
    seconds = np.arange(ref.shape[1]) / sample_rate
    nfft = int(2 ** min(10, max(5, math.floor(math.log2(max(ref.shape[1] // 8, 32))))))
    entries = [("fp32 reference (host)", ref, "")] + [(label, waveform(array, layout), caption) for label, array, caption in runs]
    for row, (label, values, caption) in enumerate(entries):
        ax = axes[row][0]
        ax.plot(seconds, values[0], color=REFERENCE_COLOR if row == 0 else RUN_COLOR, linewidth=0.6)
        if row:
            ax.plot(seconds, values[0] - ref[0], color=ERROR_COLOR, linewidth=0.6, label="error")
            ax.legend(loc="upper right", fontsize=7)
        ax.set_ylim(-peak * 1.1, peak * 1.1)
        ax.set_title(f"{label}{' · ' + caption if caption else ''}")
        ax.set_xlabel("s")
        spectrogram = axes[row][1]
        signal = np.nan_to_num(values[0])
        spectrogram.specgram(signal, NFFT=nfft, Fs=sample_rate, noverlap=nfft // 2, cmap="viridis", vmin=-120)
        spectrogram.set_ylabel("Hz")
        spectrogram.set_xlabel("s")
        spectrogram.set_title("spectrogram")
    fig.tight_layout()
    return _uri(fig, "png")


def spectrum_figure(reference: np.ndarray, runs: list[tuple[str, np.ndarray, str]], layout: Layout) -> str:
    """Complex spectrum frames: magnitude (dB) per bin, the reference and each run overlaid, and the
    error per bin below; several frames are drawn as a spectrogram per run instead."""
    plt = _pyplot()
    ref = spectrum(reference, layout)
    bins, frames = layout.shape
    to_db = lambda m: 20 * np.log10(np.maximum(m, 1e-8))  # noqa: E731
    if frames == 1:
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(WIDTH_IN, 4.6), sharex=True)
        top.plot(to_db(ref[:, 0]), color=REFERENCE_COLOR, linewidth=2.2, label="fp32 reference (host)")
        for index, (label, array, caption) in enumerate(runs):
            magnitude = spectrum(array, layout)[:, 0]
            top.plot(to_db(magnitude), linewidth=0.9, linestyle=("-", "--", ":", "-.")[index % 4], label=f"{label} {caption}".strip())
            bottom.plot(to_db(np.abs(magnitude - ref[:, 0])), linewidth=0.9, label=label)
        top.set_ylabel("magnitude (dB)")
        top.set_title(f"spectrum frame: {bins} frequency bins")
        top.legend(fontsize=7, loc="best")
        bottom.set_ylabel("|error| (dB)")
        bottom.set_xlabel("frequency bin")
        top.grid(alpha=0.3)
        bottom.grid(alpha=0.3)
        fig.tight_layout()
        return _uri(fig, "png")
    rows = 1 + len(runs)
    fig, axes = plt.subplots(rows, 1, figsize=(WIDTH_IN, 1.8 * rows + 0.3), squeeze=False)
    entries = [("fp32 reference (host)", ref, "")] + [(label, spectrum(array, layout), caption) for label, array, caption in runs]
    low = float(np.percentile(to_db(ref), 5))
    for ax, (label, magnitude, caption) in zip(axes[:, 0], entries):
        ax.imshow(to_db(magnitude), origin="lower", aspect="auto", cmap="viridis", vmin=low)
        ax.set_title(f"{label}{' · ' + caption if caption else ''}")
        ax.set_ylabel("bin")
    axes[-1][0].set_xlabel("frame")
    fig.tight_layout()
    return _uri(fig, "png")


def histogram_figure(reference: np.ndarray, runs: list[tuple[str, np.ndarray, str]]) -> str:
    """The distribution of (run - reference) per run, overlaid (log counts)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 2.8))
    ref = np.asarray(reference, dtype=np.float64).reshape(-1)
    errors = [(label, np.asarray(array, dtype=np.float64).reshape(-1)[: ref.size] - ref[: np.asarray(array).size], caption) for label, array, caption in runs]
    finite = np.concatenate([e[np.isfinite(e)] for _, e, _ in errors]) if errors else np.zeros(1)
    span = float(np.max(np.abs(finite), initial=0.0))
    edges = np.linspace(-span, span, 81) if span > 0 else np.linspace(-1e-9, 1e-9, 3)
    for index, (label, error, caption) in enumerate(errors):
        ax.hist(error[np.isfinite(error)], bins=edges, histtype="step", linewidth=1.4,
                linestyle=("-", "--", ":", "-.")[index % 4], label=f"{label} {caption}".strip())
    ax.set_yscale("log")
    ax.set_xlabel("output - fp32 reference" + (" (all identical: 0)" if span == 0 else ""))
    ax.set_ylabel("values")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _uri(fig, "png")  # PNG: an SVG of log-scaled steps takes seconds to write


# ----- sound ---------------------------------------------------------------------------------


def wav_uri(values: np.ndarray, sample_rate: int, gain: float) -> str:
    """16-bit PCM WAV (one or two channels) of [channels, T] values times `gain`, clipped."""
    channels = values[:2]
    length = min(channels.shape[1], sample_rate * MAX_WAV_SECONDS)
    pcm = np.clip(np.nan_to_num(channels[:, :length]) * gain, -1, 1)
    frames = (pcm.T * 32767).round().astype("<i2").tobytes()
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(channels.shape[0])
        writer.setsampwidth(2)
        writer.setframerate(sample_rate)
        writer.writeframes(frames)
    return "data:audio/wav;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
