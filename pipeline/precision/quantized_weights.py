"""Quantized constants as the float values they stand for.

`(q - zero_point) * scale` with the scale and zero point per tensor, per axis (a Conv weight's
output channels, a MatMul weight's columns) or per block along an axis (DequantizeLinear from opset
21, `block_size`), for 8-bit, 4-bit (int4/uint4 arrive unpacked from onnx's numpy_helper) and int32
(biases) values; and `com.microsoft::MatMulNBits`' packed blocks, whose layout is its own.
"""

from __future__ import annotations

import math

import numpy as np


def dequantize(values: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, axis: int = 1, block_size: int = 0) -> np.ndarray:
    """DequantizeLinear on constants: a scalar scale applies to the whole tensor, a 1-D one along
    `axis`, a blocked one (`block_size` > 0, same rank as `values`) to `block_size` entries along it."""
    q = np.asarray(values).astype(np.float32)
    scale = np.asarray(scale).astype(np.float32)
    zero = np.asarray(zero_point).astype(np.float32) if zero_point is not None else np.zeros_like(scale)
    if scale.size == 1 and not block_size:
        return ((q - zero.reshape(())) * scale.reshape(())).astype(np.float32)
    axis = axis % q.ndim
    if block_size:
        scale = np.repeat(scale, block_size, axis=axis).take(range(q.shape[axis]), axis=axis)
        zero = np.repeat(zero, block_size, axis=axis).take(range(q.shape[axis]), axis=axis)
    else:
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return ((q - zero) * scale).astype(np.float32)


def _unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8 bytes holding two 4-bit values each, the low nibble first, as one value per entry."""
    packed = packed.astype(np.uint8)
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def matmul_nbits_weight(blob: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, k: int, n: int, bits: int, block_size: int) -> np.ndarray | str:
    """MatMulNBits' B as the float [K, N] matrix it multiplies by, or why it cannot be read: B is
    [N, blocks, block_size·bits/8] bytes (4-bit: low nibble first), scales [N·blocks], zero points
    packed the same way as B (default 2^(bits-1))."""
    if bits not in (4, 8):
        return f"{bits}-bit blocks (pack reads 4 and 8)"
    if zero_points is not None and zero_points.dtype != np.uint8:
        return f"float zero points ({zero_points.dtype})"
    blocks = math.ceil(k / block_size)
    raw = blob.reshape(n, blocks, -1)
    values = (_unpack_nibbles(raw) if bits == 4 else raw).astype(np.float32)[:, :, :block_size]
    scale = scales.astype(np.float32).reshape(n, blocks)
    if zero_points is None:
        zero = np.full((n, blocks), 2 ** (bits - 1), np.float32)
    else:
        packed = zero_points.reshape(n, -1)
        zero = (_unpack_nibbles(packed) if bits == 4 else packed).astype(np.float32)[:, :blocks]
    weight = ((values - zero[:, :, None]) * scale[:, :, None]).reshape(n, blocks * block_size)[:, :k]
    return np.ascontiguousarray(weight.T, dtype=np.float32)
