"""Chunked external data with byte-plane coding.

A model whose file would be larger than `[assets] chunk_mib` ships as a graph without weights plus
its weights as ONNX external data, cut into chunks of at most that size, each a content-hashed
package file the loader fetches, checks and caches on its own; smaller models stay one file.

Layout of the external data: every initializer of at least EXTERNAL_MIN_BYTES moves out, grouped
by element width (8, 4, 2, then 1 byte; in graph order inside a group), so a chunk never mixes
widths. A chunk of w-byte elements is coded as w byte planes (byte 0 of every element, then byte
1, ...) before brotli: the plane holding sign and exponent is highly redundant, the low mantissa
plane nearly random, and brotli finds far more in planes than in interleaved bytes
(scripts/bench/bench_coding.py). The loader re-interleaves them after the browser's native brotli
decoding (web_template/loader/chunks.js).

An fp16w model (pipeline/precision/fp16w.py) is chunked the same way, with its narrowed FLOAT16
initializers in a group of their own at the end of the external data (the manifest's
`externalData.widened` says from which offset): the chunks carry the fp16 bytes in 2 byte planes,
and the loader widens each one to float32 straight into place as it arrives, while nothing before
that offset moves.

Any other file over `[assets] max_file_mib` (the sample, a runtime .wasm) ships in parts, cut by the
same planner without coding (`write_split`): the manifest's `split` names the whole file and its
parts, and the loader joins them (web_template/loader/files.js) wherever a reference names it.

The build checks the round trip on the files it ships: every chunk file (and its .br copy) is read
back, decoded and reassembled, and must hash to the external data the graph was cut from. The host
checks then run onnxruntime on that reassembled copy (for fp16w: widened, as the loader widens
it), so they judge the exact bytes shipped.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import brotli
import numpy as np
import onnx
from onnx import TensorProto, external_data_helper, numpy_helper

from pipeline.assets.files import PackageFile, add_hashed_file, add_hashed_files, brotli_encode, hashed_name
from pipeline.cache import atomic_write, cache_dir
from pipeline.errors import PackError
from pipeline.graph.model_io import model_bytes
from pipeline.manifest import ExternalData, SplitFile
from pipeline.media_types import media_type
from pipeline.precision.fp16w import FLOAT16, WidenedLayout, WidenError, widen_external_data, widen_model_bytes, widened_model_file
from pipeline.progress import Progress

MIB = 1 << 20
# Smaller initializers stay in the graph (onnx's own default): moving them saves nothing.
EXTERNAL_MIN_BYTES = 1024
# Chunk boundaries fall on multiples of this, so every chunk holds whole elements of its width.
ALIGN = 8
WIDTHS = (8, 4, 2, 1)
# Plane counts tried per element width where no one count wins (measured, scripts/bench/bench_coding.py:
# GTCRN's int64 indices compress best in 2 planes, worst in 8).
PLANE_CANDIDATES = {8: (1, 2, 8)}


@dataclass(frozen=True)
class Chunk:
    offset: int  # in the external data
    size: int
    planes: int  # byte planes it is coded as (1: as is)


def chunk_bytes(chunk_mib: float) -> int:
    """The largest chunk in bytes for `[assets] chunk_mib`, a multiple of ALIGN."""
    return max(ALIGN, int(chunk_mib * MIB) // ALIGN * ALIGN)


def plan_chunks(groups: list[tuple[int, int, int]], limit: int) -> list[Chunk]:
    """Chunks for the external data's groups, each (offset, length, width): a group of length L is
    cut into ceil(L / limit) chunks of near-equal size (equal sizes fetch best in parallel), each
    a multiple of ALIGN except the group's last, none over `limit`."""
    if limit < ALIGN or limit % ALIGN:
        raise ValueError(f"chunk limit {limit} is not a positive multiple of {ALIGN}")
    chunks: list[Chunk] = []
    for offset, length, width in groups:
        if length <= 0:
            continue
        count = -(-length // limit)
        step = -(-(-(-length // count)) // ALIGN) * ALIGN  # ceil(length / count), rounded up to ALIGN
        start = offset
        end = offset + length
        while start < end:
            size = min(step, end - start)
            chunks.append(Chunk(start, size, width if width > 1 else 1))
            start += size
    return chunks


def deinterleave(data: bytes | np.ndarray, planes: int) -> bytes:
    """Byte k of every element, for k = 0 .. planes-1 (little-endian elements of `planes` bytes)."""
    if planes == 1:
        return bytes(data)
    array = np.frombuffer(data, dtype=np.uint8)
    return array.reshape(-1, planes).T.tobytes()


def interleave(data: bytes, planes: int) -> bytes:
    """The inverse of deinterleave."""
    if planes == 1:
        return bytes(data)
    array = np.frombuffer(data, dtype=np.uint8)
    return array.reshape(planes, -1).T.tobytes()


def _width(tensor: TensorProto) -> int | None:
    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    try:
        return int(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize)
    except (KeyError, TypeError, ValueError):
        return None


def _raw(tensor: TensorProto) -> bytes:
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    array = numpy_helper.to_array(tensor)
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


class Split(NamedTuple):
    graph: onnx.ModelProto  # its large initializers point at the external data
    blob: bytes  # the external data
    location: str  # its name, as the graph's initializers give it
    groups: list[tuple[int, int, int]]  # (offset, length, width)
    widen_from: int | None  # widen=True: where the FLOAT16 initializers to widen start (they fill the rest)


def split_external(model: onnx.ModelProto, stem: str, widen: bool = False) -> Split:
    """The model cut into a graph and its external data. The location carries the data's hash, so
    the graph's bytes (and every cache keyed by them) change whenever the weights do. With `widen`
    (an fp16w model) the FLOAT16 initializers of the main graph, those the loader widens, form the
    last group, so widening them moves nothing before them."""
    graph = onnx.ModelProto()
    graph.CopyFrom(model)
    main = len(graph.graph.initializer)  # the walk yields the main graph's initializers first, then subgraphs'
    by_width: dict[int, list[tuple[TensorProto, bytes]]] = {w: [] for w in WIDTHS}
    tail: list[tuple[TensorProto, bytes]] = []
    for index, tensor in enumerate(external_data_helper._get_initializer_tensors(graph)):
        if tensor.data_location == TensorProto.EXTERNAL:
            raise PackError(f"model '{model.graph.name}': initializer {tensor.name!r} still points at external data; load the model with its data first")
        width = _width(tensor)
        if width not in WIDTHS:
            continue
        raw = _raw(tensor)
        if len(raw) >= EXTERNAL_MIN_BYTES and len(raw) % width == 0:
            (tail if widen and tensor.data_type == FLOAT16 and index < main else by_width[width]).append((tensor, raw))
    pieces: list[bytes] = []
    placed: list[tuple[TensorProto, bytes, int]] = []
    groups: list[tuple[int, int, int]] = []
    offset = 0
    widen_from = None
    for width, members in [*((w, by_width[w]) for w in WIDTHS), (2, tail)]:
        if not members:
            continue
        pad = -offset % ALIGN
        pieces.append(bytes(pad))
        offset += pad
        start = offset
        for tensor, raw in members:
            placed.append((tensor, raw, offset))
            pieces.append(raw)
            offset += len(raw)
        groups.append((start, offset - start, width))
        if members is tail:
            widen_from = start
    blob = b"".join(pieces)
    location = f"{stem}.{hashlib.sha256(blob).hexdigest()[:16]}.weights"
    for tensor, raw, at in placed:
        for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            tensor.ClearField(field)
        tensor.raw_data = raw
        external_data_helper.set_external_data(tensor, location, offset=at, length=len(raw))
        tensor.data_location = TensorProto.EXTERNAL
        tensor.ClearField("raw_data")
    return Split(graph, blob, location, groups, widen_from)


def best_coding(data: memoryview, chunk: Chunk) -> Chunk:
    """The chunk with the plane count that compresses it best, for widths whose best count
    varies: 8-byte elements (int64 indices and shapes, float64) try 1, 2 and 8 planes; fp16 and
    fp32 weights always gained from 2 and 4 planes (scripts/bench/bench_coding.py), so they are not tried.
    The winner's brotli bytes stay in the brotli cache, so it is not compressed twice."""
    candidates = PLANE_CANDIDATES.get(chunk.planes)
    if not candidates:
        return chunk
    sizes = {}
    for planes in candidates:
        coded = deinterleave(data, planes)
        sizes[planes] = len(brotli_encode(coded, hashlib.sha256(coded).hexdigest(), ".bin", "", Progress.quiet(), "weights"))
    best = min(candidates, key=lambda planes: (sizes[planes], planes))
    return Chunk(chunk.offset, chunk.size, best)


@dataclass
class ChunkedModel:
    graph: PackageFile
    chunks: list[PackageFile]
    external: ExternalData
    verify_path: Path  # graph beside its reassembled external data, for the host checks


def _reassemble(staging: Path, external: ExternalData, expected_sha: str) -> bytes:
    """The external data rebuilt from the chunk files as shipped (and their .br copies)."""
    data = bytearray(external["size"])
    for chunk in external["chunks"]:
        path = staging / chunk["file"]
        coded = path.read_bytes()
        encoded = path.with_name(path.name + ".br")
        if encoded.exists() and brotli.decompress(encoded.read_bytes()) != coded:
            raise PackError(f"{encoded.name}: does not decode to {path.name}; this is a bug in pack, please report it")
        raw = interleave(coded, chunk["coding"]["planes"])
        if len(raw) != chunk["size"] or hashlib.sha256(raw).hexdigest() != chunk["sha256"]:
            raise PackError(f"{path.name}: decodes to other bytes than offset {chunk['offset']} of the weights; this is a bug in pack, please report it")
        data[chunk["offset"] : chunk["offset"] + chunk["size"]] = raw
    if hashlib.sha256(data).hexdigest() != expected_sha:
        raise PackError(f"{external['path']}: the chunks reassemble to other bytes than the model's external data; this is a bug in pack, please report it")
    return bytes(data)


def widen_chunked(graph_bytes: bytes, data: bytes, external: ExternalData) -> tuple[bytes, bytes]:
    """(graph, external data) of a chunked fp16w model as the loader hands them to onnxruntime-web
    (web_template/loader/chunks.js widens chunk by chunk into the same bytes)."""
    widened = external.get("widened")
    if widened is None:
        raise PackError(f"{external['path']}: an fp16w model in chunks without externalData.widened; rebuild the package")
    try:
        graph, _ = widen_model_bytes(graph_bytes, WidenedLayout(external["path"], widened["offset"], external["size"]))
        wide = widen_external_data(data, widened["offset"])
    except WidenError as error:
        raise PackError(f"{external['path']}: not an fp16w model pack can widen ({error}); rebuild the package") from None
    if len(wide) != widened["size"] or hashlib.sha256(wide).hexdigest() != widened["sha256"]:
        raise PackError(f"{external['path']}: widens to other bytes than externalData.widened says; rebuild the package")
    return graph, wide


def write_chunked(staging: Path, stem: str, model: onnx.ModelProto, limit: int, progress: Progress, widen: bool = False) -> ChunkedModel | None:
    """The graph file, the chunk files (byte-plane coded, brotli copies compressed in parallel),
    the manifest's `externalData` for them, and the round-trip-checked copy the host checks run
    (with `widen`, an fp16w model: widened as the loader widens it); None when no initializer is
    large enough to move out (the model then ships as one file)."""
    split = split_external(model, stem, widen)
    if not split.blob:
        return None
    blob, location = split.blob, split.location
    blob_sha = hashlib.sha256(blob).hexdigest()
    plan = [best_coding(memoryview(blob)[c.offset : c.offset + c.size], c) for c in plan_chunks(split.groups, limit)]
    coded = [deinterleave(memoryview(blob)[c.offset : c.offset + c.size], c.planes) for c in plan]
    files = add_hashed_files(staging, [(f"{stem}.part{i}", ".bin", data) for i, data in enumerate(coded)], "weights", f"brotli {stem} chunks", progress)
    chunks = [
        {"file": file.path, "offset": c.offset, "size": c.size, "sha256": hashlib.sha256(memoryview(blob)[c.offset : c.offset + c.size]).hexdigest(), "coding": {"planes": c.planes}}
        for c, file in zip(plan, files)
    ]
    external: ExternalData = {"path": location, "size": len(blob), "sha256": blob_sha, "chunks": chunks}  # type: ignore[typeddict-item]
    graph_bytes = model_bytes(split.graph)
    graph = add_hashed_file(staging, stem, ".onnx", graph_bytes, progress)
    data = _reassemble(staging, external, blob_sha)
    if widen:
        start = len(blob) if split.widen_from is None else split.widen_from
        wide = widen_external_data(data, start)
        external["widened"] = {"offset": start, "size": len(wide), "sha256": hashlib.sha256(wide).hexdigest()}
        graph_bytes, data = widen_model_bytes(graph_bytes, WidenedLayout(location, start, len(blob)))[0], wide
    return ChunkedModel(graph, files, external, _runnable_copy(graph_bytes, location, data))


def write_split(staging: Path, stem: str, suffix: str, data: bytes, limit: int, progress: Progress, kind: str | None = None) -> tuple[str, list[PackageFile], SplitFile]:
    """A file over `limit` bytes as parts of at most `limit` (each a content-hashed `.bin` package
    file, brotli copies compressed in parallel as `kind`): (the whole file's path, the parts, its
    manifest `split` entry). The parts are read back and must join to `data`."""
    sha256 = hashlib.sha256(data).hexdigest()
    path = hashed_name(stem, sha256, suffix)
    cuts = plan_chunks([(0, len(data), 1)], limit)
    items = [(f"{stem}.part{index}", ".bin", data[cut.offset : cut.offset + cut.size]) for index, cut in enumerate(cuts)]
    parts = add_hashed_files(staging, items, kind, f"brotli {Path(path).name} in {len(items)} parts", progress)
    joined = hashlib.sha256()
    for part in parts:
        joined.update((staging / part.path).read_bytes())
    if joined.hexdigest() != sha256:
        raise PackError(f"{path}: its parts join to other bytes; this is a bug in pack, please report it")
    return path, parts, {"sha256": sha256, "size": len(data), "mediaType": media_type(path), "parts": [part.path for part in parts]}


def _runnable_copy(graph_bytes: bytes, location: str, data: bytes) -> Path:
    """The graph beside its external data in the cache (onnxruntime finds the data by the
    location, relative to the model file); rewritten whenever it differs, so a run sees these bytes."""
    folder = cache_dir("external-data", hashlib.sha256(graph_bytes).hexdigest())
    model_path = folder / "model.onnx"
    if not model_path.exists() or model_path.read_bytes() != graph_bytes:
        atomic_write(model_path, graph_bytes)
    target = folder / location
    if not target.exists() or target.read_bytes() != data:
        atomic_write(target, data)
    return model_path


def runnable_model(package: Path, variant: dict, name: str) -> Path:
    """A model file onnxruntime can open for a variant of a built package, as the loader hands it
    to onnxruntime-web: the model file itself; for chunked weights, its graph beside the external
    data reassembled from the package's chunk files; for fp16w (`widen`), widened."""
    path = package / variant["model"]
    if not path.is_file():
        raise PackError(f"{path}: model file of variant {name!r} missing; rebuild the package")
    external = variant.get("externalData")
    if external is None:
        return widened_model_file(path) if variant.get("widen") else path
    for chunk in external["chunks"]:
        if not (package / chunk["file"]).is_file():
            raise PackError(f"{package / chunk['file']}: weight chunk of variant {name!r} missing; rebuild the package")
    graph, data = path.read_bytes(), _reassemble(package, external, external["sha256"])
    if variant.get("widen"):
        graph, data = widen_chunked(graph, data, external)
    return _runnable_copy(graph, external["path"], data)


def chunk_lines(manifest: dict) -> list[str]:
    """One summary line per chunked variant: chunks, largest, raw and brotli bytes, plane counts."""
    lines = []
    for name, variant in manifest.get("variants", {}).items():
        external = variant.get("externalData")
        if not external:
            continue
        files = [manifest["files"][c["file"]] for c in external["chunks"]]
        wire = sum((f["encodings"].get("br") or {"size": f["size"]})["size"] for f in files)
        planes = sorted({c["coding"]["planes"] for c in external["chunks"]})
        largest = max(f["size"] for f in files)
        widened = f"; widened by the loader to {external['widened']['size']:,} B" if "widened" in external else ""
        lines.append(
            f"  weights {name}: {len(files)} chunks (largest {largest / MIB:.2f} MiB), {external['size']:,} B raw -> {wire:,} B brotli "
            f"({100 * wire / max(external['size'], 1):.1f} %), byte planes {'/'.join(map(str, planes))}; reassembled sha256 matches{widened}"
        )
    return lines
