"""Export small, random-weight versions of the flagship architectures to ONNX (tests/data/flagship/).

Each export reproduces the graph patterns of the published model its recipe names, with the same
input and output names, dtypes and ranks, at a size a software WebGPU adapter runs in seconds:
- lama: LaMa's FFC resblocks (rfft, a 1x1 conv on the spectrum, the spectrum's mirrored half by
  torch.flip, i.e. a negative-step Slice with end INT64_MIN, and a full inverse FFT), image and
  mask in, image 0..255 out;
- migan: MI-GAN's whole pipeline with uint8 I/O (Cast, normalise, depthwise-separable encoder/decoder,
  composite with the known pixels, round and Cast back);
- vocos: the Vocos backbone (ConvNeXt blocks) and head: mel in, mag, x = cos, y = sin out;
- wavtokenizer: codes (int64) to a waveform: codebook Gather, ConvNeXt + attention backbone, and
  the ISTFT head exported the old way (inverse DFT as MatMul, overlap-add as ConvTranspose,
  Squeeze to 1-D, window-envelope Div guarded by Where) with the stale 3-D value_info over the
  Squeeze's 1-D output that older exporters leave (onnxruntime issue 22994);
- htdemucs: two inputs (waveform, spectrogram), a time branch and an STFT-domain branch, a cross
  transformer (self- and cross-attention between the branches), ConvTranspose decoders;
- mdx: a TFC-TDF U-Net on a [1,4,F,T] spectrogram (used by uvr-mdx and uvr-mdx-vocals);
- scnet: waveform in, STFT as a strided Conv1d, band split into sub-bands with their own strides,
  dual-path LSTM (across time, then across bands), masks, inverse STFT as ConvTranspose;
- mpsenet: MP-SENet's generator: magnitude and phase in, dense encoder, conformer blocks whose
  feed-forward is a GRU, magnitude mask and phase (atan2) decoders.
Weights are random with fixed seeds; node metadata (stack traces with local paths) is stripped.
Every export is checked against PyTorch on onnxruntime CPU before it is written.

Needs PyTorch (CPU) and onnxscript; the generated files are committed so CI needs neither.
Usage: python tests/data/generators/make_flagship_models.py [NAME ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_ffc_model import FourierUnit  # noqa: E402  (the FFC spectral unit, shared)

OPSET = 18


# --- LaMa ------------------------------------------------------------------------------------


class FFCResBlock(nn.Module):
    """LaMa's FFC resnet block: local (conv) and global (Fourier) halves exchanging features."""

    def __init__(self, channels: int):
        super().__init__()
        half = channels // 2
        self.local_to_local = nn.Conv2d(half, half, 3, padding=1, padding_mode="reflect", bias=False)
        self.local_to_global = nn.Conv2d(half, half, 3, padding=1, padding_mode="reflect", bias=False)
        self.global_to_local = nn.Conv2d(half, half, 3, padding=1, padding_mode="reflect", bias=False)
        self.spectral_in = nn.Sequential(nn.Conv2d(half, half // 2, 1, bias=False), nn.BatchNorm2d(half // 2), nn.ReLU())
        self.fourier = FourierUnit(half // 2, "hermitian")
        self.spectral_out = nn.Conv2d(half // 2, half, 1, bias=False)
        self.norm_local = nn.BatchNorm2d(half)
        self.norm_global = nn.BatchNorm2d(half)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local, global_ = torch.chunk(x, 2, dim=1)
        hidden = self.spectral_in(global_)
        spectral = self.spectral_out(hidden + self.fourier(hidden))
        out_local = F.relu(self.norm_local(self.local_to_local(local) + self.global_to_local(global_)))
        out_global = F.relu(self.norm_global(self.local_to_global(local) + spectral))
        return x + torch.cat((out_local, out_global), dim=1)


class LaMa(nn.Module):
    """image [1,3,H,W] in 0..1 and mask [1,1,H,W] (1 = fill) -> output [1,3,H,W] in 0..255."""

    def __init__(self, width: int = 8, blocks: int = 1):
        super().__init__()
        self.head = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(4, width, 7), nn.BatchNorm2d(width), nn.ReLU())
        self.down = nn.Sequential(nn.Conv2d(width, width * 2, 3, stride=2, padding=1), nn.BatchNorm2d(width * 2), nn.ReLU())
        self.blocks = nn.Sequential(*[FFCResBlock(width * 2) for _ in range(blocks)])
        self.up = nn.Sequential(nn.ConvTranspose2d(width * 2, width, 3, stride=2, padding=1, output_padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.tail = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(width, 3, 7))

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        masked = image * (1 - mask)
        x = self.tail(self.up(self.blocks(self.down(self.head(torch.cat((masked, mask), dim=1))))))
        predicted = torch.sigmoid(x)
        result = mask * predicted + (1 - mask) * image
        return torch.clamp(result * 255, 0, 255)


def lama_example() -> tuple:
    image = torch.rand(1, 3, 32, 32)
    mask = torch.zeros(1, 1, 32, 32)
    mask[..., 8:20, 10:24] = 1
    return image, mask


# --- MI-GAN ----------------------------------------------------------------------------------


class SeparableConv(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.depthwise = nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin)
        self.pointwise = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        return F.leaky_relu(self.pointwise(self.depthwise(x)), 0.2)


class MIGAN(nn.Module):
    """image uint8 [1,3,H,W], mask uint8 [1,1,H,W] (255 = known) -> result uint8 [1,3,H,W]."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.from_rgb = nn.Conv2d(4, width, 1)
        self.encoder = nn.ModuleList([SeparableConv(width, width * 2, 2), SeparableConv(width * 2, width * 2, 2)])
        self.decoder = nn.ModuleList([SeparableConv(width * 4, width * 2), SeparableConv(width * 3, width)])
        self.to_rgb = nn.Conv2d(width, 3, 1)

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rgb = image.to(torch.float32) / 127.5 - 1
        known = (mask.to(torch.float32) / 255 > 0.5).to(torch.float32)
        x = self.from_rgb(torch.cat((known - 0.5, rgb * known), dim=1))
        skips = [x]
        for layer in self.encoder:
            x = layer(x)
            skips.append(x)
        for layer, skip in zip(self.decoder, reversed(skips[:-1])):
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
            x = layer(torch.cat((x, skip), dim=1))
        out = torch.tanh(self.to_rgb(x))
        composite = rgb * known + out * (1 - known)
        return torch.round(torch.clamp((composite + 1) * 127.5, 0, 255)).to(torch.uint8)


def migan_example() -> tuple:
    image = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8)
    mask = torch.full((1, 1, 32, 32), 255, dtype=torch.uint8)
    mask[..., 6:18, 12:26] = 0
    return image, mask


# --- Vocos / WavTokenizer --------------------------------------------------------------------


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, hidden)
        self.pwconv2 = nn.Linear(hidden, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):  # x [B, C, T]
        residual = x
        x = self.norm(self.dwconv(x).transpose(1, 2))
        x = self.pwconv2(F.gelu(self.pwconv1(x))) * self.gamma
        return residual + x.transpose(1, 2)


class VocosBackbone(nn.Module):
    def __init__(self, cin: int, dim: int, blocks: int):
        super().__init__()
        self.embed = nn.Conv1d(cin, dim, 7, padding=3)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.blocks = nn.ModuleList([ConvNeXtBlock(dim, dim * 3) for _ in range(blocks)])
        self.final_norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x):  # [B, cin, T] -> [B, T, dim]
        x = self.norm(self.embed(x).transpose(1, 2)).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x.transpose(1, 2))


class Vocos(nn.Module):
    """mel [1,80,T] -> mag, x, y [1,513,T]: Vocos without its ISTFT, as the published export ships it."""

    def __init__(self, mels: int = 80, n_fft: int = 1024, dim: int = 16, blocks: int = 1):
        super().__init__()
        self.backbone = VocosBackbone(mels, dim, blocks)
        self.out = nn.Linear(dim, n_fft + 2)

    def forward(self, mel):
        h = self.out(self.backbone(mel)).transpose(1, 2)
        log_mag, phase = torch.chunk(h, 2, dim=1)
        mag = torch.clip(torch.exp(log_mag), max=1e2)
        return mag, torch.cos(phase), torch.sin(phase)


def vocos_example() -> tuple:
    return (torch.randn(1, 80, 16) - 4.0,)


class AttentionBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.GroupNorm(4, dim)
        self.qkv = nn.Conv1d(dim, dim * 3, 1)
        self.proj = nn.Conv1d(dim, dim, 1)

    def forward(self, x):  # [B, C, T]
        q, k, v = torch.chunk(self.qkv(self.norm(x)), 3, dim=1)
        weights = torch.softmax(q.transpose(1, 2) @ k / math.sqrt(q.shape[1]), dim=-1)
        return x + self.proj((weights @ v.transpose(1, 2)).transpose(1, 2))


class WavTokenizerDecoder(nn.Module):
    """codes int64 [1,T] -> waveform [1, T*hop]: codebook lookup, backbone, ISTFT head."""

    def __init__(self, codebook: int = 4096, dim: int = 16, n_fft: int = 64, hop: int = 16, blocks: int = 1, frames: int = 16):
        super().__init__()
        self.codebook = nn.Embedding(codebook, dim)
        self.attention = AttentionBlock(dim)
        self.backbone = VocosBackbone(dim, dim, blocks)
        self.out = nn.Linear(dim, n_fft + 2)
        self.n_fft, self.hop, self.frames = n_fft, hop, frames
        bins = n_fft // 2 + 1
        k, n = np.arange(bins)[:, None], np.arange(n_fft)[None, :]
        weight = np.full((bins, 1), 2.0)
        weight[0] = weight[-1] = 1.0
        window = np.hanning(n_fft + 1)[:-1]
        # Windowed inverse real DFT as two matrices (what exporters without DFT emit as MatMul).
        self.register_buffer("inverse_real", torch.tensor(weight * np.cos(2 * np.pi * k * n / n_fft) / n_fft * window, dtype=torch.float32))
        self.register_buffer("inverse_imag", torch.tensor(-weight * np.sin(2 * np.pi * k * n / n_fft) / n_fft * window, dtype=torch.float32))
        self.register_buffer("identity", torch.eye(n_fft, dtype=torch.float32).unsqueeze(1))
        length = (frames - 1) * hop + n_fft
        envelope = np.zeros(length)
        for frame in range(frames):
            envelope[frame * hop: frame * hop + n_fft] += window ** 2
        self.register_buffer("envelope", torch.tensor(envelope, dtype=torch.float32))

    def forward(self, codes):
        x = self.codebook(codes).transpose(1, 2)
        h = self.out(self.backbone(self.attention(x))).transpose(1, 2)
        log_mag, phase = torch.chunk(h, 2, dim=1)
        mag = torch.clip(torch.exp(log_mag), max=1e2)
        real, imag = mag * torch.cos(phase), mag * torch.sin(phase)
        frames = (torch.einsum("bkt,kn->bnt", real, self.inverse_real) + torch.einsum("bkt,kn->bnt", imag, self.inverse_imag))
        overlap_added = F.conv_transpose1d(frames, self.identity, stride=self.hop)
        audio = overlap_added.squeeze(0).squeeze(0)
        audio = torch.where(self.envelope > 1e-11, audio / self.envelope, torch.zeros_like(audio))
        pad = (self.n_fft - self.hop) // 2
        return audio[pad: pad + self.frames * self.hop].unsqueeze(0)


def wavtokenizer_example() -> tuple:
    return (torch.randint(0, 4096, (1, 16), dtype=torch.int64),)


def stale_squeeze_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """What older exporters leave: a 3-D value_info over the 1-D output of the head's Squeeze."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: v for v in inferred.graph.value_info}
    for node in model.graph.node:
        if node.op_type == "Squeeze" and node.output[0] in shapes:
            dims = [d.dim_value for d in shapes[node.output[0]].type.tensor_type.shape.dim]
            if len(dims) == 1:
                model.graph.value_info.append(onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, [1, 1, dims[0]]))
                return model
    raise SystemExit("wavtokenizer: no Squeeze to 1-D found; the export changed")


# --- HTDemucs --------------------------------------------------------------------------------


class CrossTransformerLayer(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.self_time = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.self_freq = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.cross_time = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.cross_freq = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norms = nn.ModuleList([nn.LayerNorm(dim) for _ in range(4)])
        self.ff_time = nn.Sequential(nn.Linear(dim, dim * 2), nn.GELU(), nn.Linear(dim * 2, dim))
        self.ff_freq = nn.Sequential(nn.Linear(dim, dim * 2), nn.GELU(), nn.Linear(dim * 2, dim))

    def forward(self, time, freq):
        t, f = self.norms[0](time), self.norms[1](freq)
        time = time + self.self_time(t, t, t, need_weights=False)[0]
        freq = freq + self.self_freq(f, f, f, need_weights=False)[0]
        t, f = self.norms[2](time), self.norms[3](freq)
        time = time + self.cross_time(t, f, f, need_weights=False)[0]
        freq = freq + self.cross_freq(f, t, t, need_weights=False)[0]
        return time + self.ff_time(time), freq + self.ff_freq(freq)


class HTDemucs(nn.Module):
    """waveform [1,2,L] + spectrogram [1,4,F,T] -> time [1,4,2,L] + freq [1,4,4,F,T]."""

    def __init__(self, sources: int = 4, width: int = 8, dim: int = 16):
        super().__init__()
        self.sources = sources
        self.time_encoder = nn.Sequential(nn.Conv1d(2, width, 8, stride=4, padding=2), nn.GELU(), nn.Conv1d(width, dim, 8, stride=4, padding=2), nn.GELU())
        self.freq_encoder = nn.Sequential(nn.Conv2d(4, width, (8, 1), stride=(4, 1), padding=(2, 0)), nn.GELU(), nn.Conv2d(width, dim, (8, 1), stride=(4, 1), padding=(2, 0)), nn.GELU())
        self.transformer = nn.ModuleList([CrossTransformerLayer(dim, 4) for _ in range(1)])
        self.time_decoder = nn.Sequential(nn.ConvTranspose1d(dim, width, 8, stride=4, padding=2), nn.GELU(), nn.ConvTranspose1d(width, 2 * sources, 8, stride=4, padding=2))
        self.freq_decoder = nn.Sequential(nn.ConvTranspose2d(dim, width, (8, 1), stride=(4, 1), padding=(2, 0)), nn.GELU(), nn.ConvTranspose2d(width, 4 * sources, (8, 1), stride=(4, 1), padding=(2, 0)))

    def forward(self, waveform, spectrogram):
        mean, std = waveform.mean(dim=(1, 2), keepdim=True), waveform.std(dim=(1, 2), keepdim=True)
        t = self.time_encoder((waveform - mean) / (1e-5 + std))  # [1, dim, Lt]
        f = self.freq_encoder(spectrogram)  # [1, dim, Fz, T]
        t, f = cross_transform(self.transformer, t, f)
        batch, frames = f.shape[0], f.shape[3]
        time_out = self.time_decoder(t).reshape(batch, self.sources, 2, -1) * std + mean
        freq_out = self.freq_decoder(f).reshape(batch, self.sources, 4, spectrogram.shape[2], frames) * spectrogram.unsqueeze(1)
        return time_out, freq_out


def cross_transform(layers: nn.ModuleList, t: torch.Tensor, f: torch.Tensor) -> tuple:
    """The time [B, dim, Lt] and freq [B, dim, Fz, T] encodings through the cross-transformer layers
    (as token sequences), back in the same shapes (also used by make_htdemucs_full.py)."""
    batch, dim, fz, frames = f.shape
    time_seq, freq_seq = t.transpose(1, 2), f.flatten(2).transpose(1, 2)
    for layer in layers:
        time_seq, freq_seq = layer(time_seq, freq_seq)
    return time_seq.transpose(1, 2), freq_seq.transpose(1, 2).reshape(batch, dim, fz, frames)


def htdemucs_example() -> tuple:
    waveform = torch.randn(1, 2, 256) * 0.3
    spectrogram = torch.randn(1, 4, 32, 8)
    return waveform, spectrogram


# --- MDX (UVR) -------------------------------------------------------------------------------


class TFCTDF(nn.Module):
    """Time-frequency convolutions then a time-distributed fully connected layer over frequency."""

    def __init__(self, channels: int, bins: int, bottleneck: int = 4):
        super().__init__()
        self.tfc = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
                                 nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        self.tdf = nn.Sequential(nn.Linear(bins, bins // bottleneck, bias=False), nn.BatchNorm2d(channels), nn.ReLU(),
                                 nn.Linear(bins // bottleneck, bins, bias=False), nn.BatchNorm2d(channels), nn.ReLU())

    def forward(self, x):  # [B, C, T, F]
        x = self.tfc(x)
        return x + self.tdf(x)


class MDX(nn.Module):
    """input [1,4,F,T] -> output [1,4,F,T]: a TFC-TDF U-Net as UVR's MDX-Net."""

    def __init__(self, bins: int = 32, width: int = 4, bottleneck: int = 4):
        super().__init__()
        self.first = nn.Sequential(nn.Conv2d(4, width, 1), nn.BatchNorm2d(width), nn.ReLU())
        self.enc = TFCTDF(width, bins, bottleneck)
        self.down = nn.Sequential(nn.Conv2d(width, width * 2, 2, stride=2), nn.BatchNorm2d(width * 2), nn.ReLU())
        self.mid = TFCTDF(width * 2, bins // 2, bottleneck)
        self.up = nn.Sequential(nn.ConvTranspose2d(width * 2, width, 2, stride=2), nn.BatchNorm2d(width), nn.ReLU())
        self.dec = TFCTDF(width, bins, bottleneck)
        self.last = nn.Conv2d(width, 4, 1)

    def forward(self, x):
        h = self.first(x.transpose(2, 3))  # [B, C, T, F]: TDF acts on the frequency axis
        skip = self.enc(h)
        h = self.up(self.mid(self.down(skip)))
        return self.last(self.dec(h * skip)).transpose(2, 3)


def mdx_example() -> tuple:
    return (torch.randn(1, 4, 32, 16),)


# --- SCNet -----------------------------------------------------------------------------------


class DualPath(nn.Module):
    """An LSTM across time within each band, then one across bands within each frame."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm_time, self.norm_band = nn.GroupNorm(1, dim), nn.GroupNorm(1, dim)
        self.time_rnn = nn.LSTM(dim, dim, batch_first=True, bidirectional=True)
        self.band_rnn = nn.LSTM(dim, dim, batch_first=True, bidirectional=True)
        self.time_fc, self.band_fc = nn.Linear(2 * dim, dim), nn.Linear(2 * dim, dim)

    def forward(self, x):  # [B, C, bands, T]
        batch, dim, bands, frames = x.shape
        seq = self.norm_time(x).permute(0, 2, 3, 1).reshape(batch * bands, frames, dim)
        x = x + self.time_fc(self.time_rnn(seq)[0]).reshape(batch, bands, frames, dim).permute(0, 3, 1, 2)
        seq = self.norm_band(x).permute(0, 3, 2, 1).reshape(batch * frames, bands, dim)
        return x + self.band_fc(self.band_rnn(seq)[0]).reshape(batch, frames, bands, dim).permute(0, 3, 2, 1)


class SCNet(nn.Module):
    """mix [1,2,L] -> stems [1,4,2,L]: STFT, band split, dual-path LSTMs, masks, inverse STFT."""

    def __init__(self, sources: int = 4, n_fft: int = 64, hop: int = 16, dim: int = 8):
        super().__init__()
        self.sources, self.n_fft, self.hop = sources, n_fft, hop
        bins = n_fft // 2  # the Nyquist bin dropped, as SCNet does
        n, k = np.arange(n_fft), np.arange(bins)[:, None]
        window = np.hanning(n_fft + 1)[:-1]
        analysis = np.concatenate([np.cos(2 * np.pi * k * n / n_fft), -np.sin(2 * np.pi * k * n / n_fft)]) * window
        self.register_buffer("analysis", torch.tensor(analysis[:, None, :], dtype=torch.float32))
        scale = np.full((bins, 1), 2.0 / n_fft)
        scale[0] = 1.0 / n_fft
        synthesis = np.concatenate([scale * np.cos(2 * np.pi * k * n / n_fft), -scale * np.sin(2 * np.pi * k * n / n_fft)]) * window / (np.sum(window ** 2) / hop)
        self.register_buffer("synthesis", torch.tensor(synthesis[:, None, :], dtype=torch.float32))
        # Sub-bands: low frequencies kept fine, high ones compressed harder (SCNet's SD layer).
        self.splits = [bins // 4, bins // 4, bins // 2]
        self.strides = [1, 2, 4]
        self.band_in = nn.ModuleList([nn.Conv2d(4, dim, (s, 1), stride=(s, 1)) for s in self.strides])
        self.dual_path = nn.Sequential(DualPath(dim))
        self.band_out = nn.ModuleList([nn.ConvTranspose2d(dim, 4 * sources, (s, 1), stride=(s, 1)) for s in self.strides])

    def forward(self, mix):
        batch, channels, length = mix.shape
        frames = F.conv1d(mix.reshape(batch * channels, 1, length), self.analysis, stride=self.hop)  # [2, 2*bins, T]
        spec = frames.reshape(batch, channels * 2, self.n_fft // 2, -1)  # [B, 4 = (ch, re/im), F, T]
        bands = torch.split(spec, self.splits, dim=2)
        encoded = [layer(band) for layer, band in zip(self.band_in, bands)]
        sizes = [e.shape[2] for e in encoded]
        x = self.dual_path(torch.cat(encoded, dim=2))
        decoded = [layer(part) for layer, part in zip(self.band_out, torch.split(x, sizes, dim=2))]
        masks = torch.cat(decoded, dim=2).reshape(batch, self.sources, channels * 2, self.n_fft // 2, -1)
        separated = masks * spec.unsqueeze(1)  # [B, S, 4, F, T]
        stems = separated.reshape(batch * self.sources * channels, self.n_fft, -1)
        audio = F.conv_transpose1d(stems, self.synthesis, stride=self.hop)
        return audio[..., :length].reshape(batch, self.sources, channels, length)


def scnet_example() -> tuple:
    return (torch.randn(1, 2, 512) * 0.3,)


# --- MP-SENet --------------------------------------------------------------------------------


class ConformerBlock(nn.Module):
    """MP-SENet's conformer: attention, depthwise conv module and a GRU as the feed-forward."""

    def __init__(self, dim: int, heads: int = 4):
        super().__init__()
        self.norm_ff = nn.LayerNorm(dim)
        self.gru = nn.GRU(dim, dim, batch_first=True, bidirectional=True)
        self.ff_out = nn.Linear(2 * dim, dim)
        self.norm_att = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm_conv = nn.LayerNorm(dim)
        self.pointwise = nn.Conv1d(dim, 2 * dim, 1)
        self.depthwise = nn.Conv1d(dim, dim, 7, padding=3, groups=dim)
        self.conv_out = nn.Conv1d(dim, dim, 1)
        self.norm_out = nn.LayerNorm(dim)

    def forward(self, x):  # [N, L, dim]
        x = x + 0.5 * self.ff_out(self.gru(self.norm_ff(x))[0])
        h = self.norm_att(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        h = F.glu(self.pointwise(self.norm_conv(x).transpose(1, 2)), dim=1)
        x = x + self.conv_out(F.silu(self.depthwise(h))).transpose(1, 2)
        return self.norm_out(x)


class MPSENet(nn.Module):
    """noisy_mag, noisy_pha [1,F,T] -> mag, pha [1,F,T] and com [1,F,T,2]."""

    def __init__(self, dim: int = 8, blocks: int = 1, compress: float = 0.3):
        super().__init__()
        self.compress = compress
        self.encoder = nn.Sequential(nn.Conv2d(2, dim, 1), nn.InstanceNorm2d(dim, affine=True), nn.PReLU(dim),
                                     nn.Conv2d(dim, dim, (1, 3), stride=(1, 2)), nn.InstanceNorm2d(dim, affine=True), nn.PReLU(dim))
        self.time_blocks = nn.ModuleList([ConformerBlock(dim) for _ in range(blocks)])
        self.freq_blocks = nn.ModuleList([ConformerBlock(dim) for _ in range(blocks)])
        self.mask_decoder = nn.Sequential(nn.ConvTranspose2d(dim, dim, (1, 3), stride=(1, 2)), nn.InstanceNorm2d(dim, affine=True), nn.PReLU(dim), nn.Conv2d(dim, 1, 1))
        self.mask_slope = nn.Parameter(torch.ones(1))
        self.phase_decoder = nn.Sequential(nn.ConvTranspose2d(dim, dim, (1, 3), stride=(1, 2)), nn.InstanceNorm2d(dim, affine=True), nn.PReLU(dim))
        self.phase_real, self.phase_imag = nn.Conv2d(dim, 1, 1), nn.Conv2d(dim, 1, 1)

    def forward(self, noisy_mag, noisy_pha):
        x = torch.stack((noisy_mag, noisy_pha), dim=1).permute(0, 1, 3, 2)  # [B, 2, T, F]
        x = self.encoder(x)  # [B, C, T, F']
        batch, dim, frames, bins = x.shape
        for time_block, freq_block in zip(self.time_blocks, self.freq_blocks):
            seq = x.permute(0, 3, 2, 1).reshape(batch * bins, frames, dim)
            x = time_block(seq).reshape(batch, bins, frames, dim).permute(0, 3, 2, 1)
            seq = x.permute(0, 2, 3, 1).reshape(batch * frames, bins, dim)
            x = freq_block(seq).reshape(batch, frames, bins, dim).permute(0, 3, 1, 2)
        mask = 2.0 * torch.sigmoid(self.mask_slope * self.mask_decoder(x))  # learnable sigmoid
        mag = (noisy_mag.permute(0, 2, 1).unsqueeze(1) * mask).squeeze(1).permute(0, 2, 1)
        phase = self.phase_decoder(x)
        pha = torch.atan2(self.phase_imag(phase), self.phase_real(phase)).squeeze(1).permute(0, 2, 1)
        linear = torch.pow(mag, 1.0 / self.compress)
        com = torch.stack((linear * torch.cos(pha), linear * torch.sin(pha)), dim=-1)
        return mag, pha, com


def mpsenet_example() -> tuple:
    return torch.rand(1, 17, 8) * 0.8, (torch.rand(1, 17, 8) * 2 - 1) * math.pi


# --- export ----------------------------------------------------------------------------------

MODELS = {
    # name: (module factory, example inputs, input names, output names, tolerance)
    "lama": (LaMa, lama_example, ["image", "mask"], ["output"], 1e-2),
    "migan": (MIGAN, migan_example, ["image", "mask"], ["result"], 1.0),
    "vocos": (Vocos, vocos_example, ["mel"], ["mag", "x", "y"], 1e-4),
    "wavtokenizer": (WavTokenizerDecoder, wavtokenizer_example, ["codes"], ["waveform"], 1e-4),
    "htdemucs": (HTDemucs, htdemucs_example, ["waveform", "spectrogram"], ["time", "freq"], 1e-4),
    "mdx": (MDX, mdx_example, ["input"], ["output"], 1e-4),
    "scnet": (SCNet, scnet_example, ["mix"], ["stems"], 1e-4),
    "mpsenet": (MPSENet, mpsenet_example, ["noisy_mag", "noisy_pha"], ["mag", "pha", "com"], 1e-3),
}


def _randomise_norm_statistics(module: nn.Module) -> None:
    """Non-trivial BatchNorm statistics, so no block is near-identity."""
    for child in module.modules():
        if isinstance(child, nn.BatchNorm2d):
            child.running_mean.uniform_(-0.2, 0.2)
            child.running_var.uniform_(0.5, 1.5)


def export(name: str, output: Path) -> None:
    export_module(name, *MODELS[name], output)


def export_module(name: str, factory, example_fn, input_names: list, output_names: list, tolerance: float, output: Path) -> None:
    """Build the module with seed 0, export it, check it against PyTorch, write it to `output`."""
    torch.manual_seed(0)
    module = factory().eval()
    with torch.no_grad():
        _randomise_norm_statistics(module)
    example = example_fn()
    program = torch.onnx.export(module, example, dynamo=True, opset_version=OPSET, input_names=input_names, output_names=output_names, optimize=True, verbose=False)
    model = program.model_proto
    for node in model.graph.node:
        del node.metadata_props[:]
    model.graph.doc_string = ""
    model.producer_version = ""  # the exporter's build string would change the file per machine
    if name == "wavtokenizer":
        model = stale_squeeze_shapes(model)
    _check_against_torch(module, model, example, input_names, tolerance, name)
    onnx.save(model, str(output))


def _check_against_torch(module, model, example, input_names, tolerance, name) -> None:
    """The export must compute what PyTorch computes (onnxruntime CPU), or the tests prove nothing."""
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    exported = session.run(None, {n: t.numpy() for n, t in zip(input_names, example)})
    with torch.no_grad():
        expected = module(*example)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for got, want in zip(exported, expected):
        error = float(np.max(np.abs(got.astype(np.float64) - want.numpy().astype(np.float64))))
        if error > tolerance:
            raise SystemExit(f"{name}: onnxruntime differs from PyTorch by {error} (> {tolerance})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[*MODELS, []], help="models to export (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "flagship")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for model_name in args.names or list(MODELS):
        target = args.out / f"{model_name}.onnx"
        export(model_name, target)
        print(f"wrote {target} ({target.stat().st_size} bytes)")
