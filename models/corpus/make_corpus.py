"""Regenerate models/corpus/: small torch models exported to ONNX, none of them from the zoo.

    python models/corpus/make_corpus.py                       # models/corpus/NAME.onnx, small
    python models/corpus/make_corpus.py --out DIR --scale gpu # GPU-benchmark sizes, no weights
    python models/corpus/make_corpus.py --only vit_tiny,llama_gqa

The planner was tuned on the zoo, whose files our own builders write; users bring files that
torch wrote. Every model here is a torch module written in this script, exported with the
TorchScript exporter (`torch.onnx.export(..., dynamo=False)`) at opset 17 in eval mode, with
a dynamic first (batch) axis and the batch size it was exported at as the file's default
(`autotm.default_dims`, so `autotm inspect FILE` needs no `--batch`). Two exceptions to the
exporter's defaults: `gpt2_tied` is exported without constant folding, which is how the file
keeps one embedding table for the Gather and the tied head (with folding on, torch writes the
transposed table as a second initializer and the tie is cut in the file itself); and
`mobilenet_dw` with `training=TrainingMode.PRESERVE`, which keeps its BatchNormalization nodes
(in eval mode the exporter folds each into the convolution before it, as `resnext_small`
shows).

`--scale small` (default) writes the weights into each file (each under 1 MB, for the CPU
tests); `--scale gpu` exports the same architectures at benchmark sizes and writes their
weights as external data that is then deleted: the files hold shapes only, as the zoo's do,
and the executor runs them with seeded random values (docs/import.md). Everything is seeded,
so a run writes the same graphs; `tests/test_corpus.py` checks the committed files against
`SPECS` (names, inputs and their shapes), not byte for byte.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
OPSET = 17
TRACE_BATCH = 2


@dataclass(frozen=True)
class Spec:
    """One corpus model: its builder, its inputs at each scale and what it exercises."""

    name: str
    build: Callable[[str], nn.Module]
    inputs: Callable[[str], dict[str, tuple[tuple[int, ...], torch.dtype, int]]]
    exercises: str
    fold: bool = True  # the exporter's constant folding (torch's default)
    # training=PRESERVE: the exporter keeps BatchNormalization nodes (training_mode 0) instead
    # of folding them into the convolutions before them, as it does in eval mode
    keep_batch_norm: bool = False


def _sizes(scale: str, small: dict, gpu: dict) -> dict:
    return small if scale == "small" else gpu


# ---- mobilenet-style: inverted residuals, depthwise 3x3, BatchNorm, ReLU6 ------------------
class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.body = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNet(nn.Module):
    def __init__(self, scale: str) -> None:
        super().__init__()
        w = _sizes(scale, {"stem": 8, "widths": [8, 12, 12, 16], "classes": 10},
                   {"stem": 32, "widths": [16, 24, 24, 32, 32, 64, 64, 96, 160, 320],
                    "classes": 1000})
        layers: list[nn.Module] = [nn.Conv2d(3, w["stem"], 3, 2, 1, bias=False),
                                   nn.BatchNorm2d(w["stem"]), nn.ReLU6()]
        cin = w["stem"]
        for i, cout in enumerate(w["widths"]):
            layers.append(InvertedResidual(cin, cout, 2 if cout != cin and i % 2 else 1, 4))
            cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, w["classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


# ---- U-Net: down convs, a ConvTranspose and a bilinear Upsample, skip Concats --------------
def _double_conv(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())


class UNet(nn.Module):
    def __init__(self, scale: str) -> None:
        super().__init__()
        c = _sizes(scale, {"base": 4, "classes": 3}, {"base": 32, "classes": 8})
        b = c["base"]
        self.enc1, self.enc2, self.mid = _double_conv(3, b), _double_conv(b, 2 * b), \
            _double_conv(2 * b, 4 * b)
        self.up2 = nn.ConvTranspose2d(4 * b, 2 * b, 2, stride=2)
        self.dec2 = _double_conv(4 * b, 2 * b)
        self.reduce1 = nn.Conv2d(2 * b, b, 1)
        self.dec1 = _double_conv(2 * b, b)
        self.head = nn.Conv2d(b, c["classes"], 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        up1 = F.interpolate(self.reduce1(d2), scale_factor=2.0, mode="bilinear",
                            align_corners=False)
        return self.head(self.dec1(torch.cat([up1, e1], 1)))


# ---- ViT: patch conv, cls token, pre-norm blocks with scaled_dot_product_attention ---------
class EncoderBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, d // self.heads) \
            .permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    def __init__(self, scale: str) -> None:
        super().__init__()
        c = _sizes(scale, {"image": 16, "patch": 4, "d": 32, "heads": 2, "depth": 2,
                           "classes": 10},
                   {"image": 224, "patch": 16, "d": 384, "heads": 6, "depth": 12,
                    "classes": 1000})
        d, tokens = c["d"], (c["image"] // c["patch"]) ** 2
        self.patch = nn.Conv2d(3, d, c["patch"], stride=c["patch"])
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, d) * 0.02)
        self.blocks = nn.Sequential(*(EncoderBlock(d, c["heads"]) for _ in range(c["depth"])))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, c["classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


# ---- GPT-2: learned positions, causal softmax attention, tanh GELU, tied bias-free head ----
class GPT2Block(nn.Module):
    def __init__(self, d: int, heads: int, ctx: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("bias", torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.attn(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, scale: str) -> None:
        super().__init__()
        c = _sizes(scale, {"vocab": 96, "d": 32, "heads": 2, "layers": 2, "ctx": 16},
                   {"vocab": 50257, "d": 768, "heads": 12, "layers": 12, "ctx": 1024})
        self.wte, self.wpe = nn.Embedding(c["vocab"], c["d"]), nn.Embedding(c["ctx"], c["d"])
        self.blocks = nn.Sequential(*(GPT2Block(c["d"], c["heads"], c["ctx"])
                                      for _ in range(c["layers"])))
        self.ln_f = nn.LayerNorm(c["d"])

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.ln_f(self.blocks(self.wte(idx) + self.wpe(pos)))
        return x @ self.wte.weight.T  # the tied head: no bias, no weight of its own


# ---- Llama-style: RMSNorm, SwiGLU, rotary, grouped-query attention, float32 softmax -------
class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)  # as transformers' LlamaRMSNorm writes it
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, heads * self.hd, bias=False)
        self.k = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(heads * self.hd, d, bias=False)

    def _repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        b, h, t, hd = x.shape
        rep = self.heads // self.kv_heads
        return x[:, :, None].expand(b, h, rep, t, hd).reshape(b, h * rep, t, hd)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = self._repeat_kv(k), self._repeat_kv(v)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.hd) + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return self.o((probs @ v).transpose(1, 2).reshape(b, t, -1))


class LlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.attn = LlamaAttention(d, heads, kv_heads)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, scale: str) -> None:
        super().__init__()
        c = _sizes(scale, {"vocab": 96, "d": 32, "heads": 4, "kv": 2, "hidden": 64,
                           "layers": 2, "ctx": 16},
                   {"vocab": 32000, "d": 1024, "heads": 16, "kv": 4, "hidden": 2816,
                    "layers": 8, "ctx": 1024})
        hd = c["d"] // c["heads"]
        self.embed = nn.Embedding(c["vocab"], c["d"])
        self.layers = nn.ModuleList(LlamaBlock(c["d"], c["heads"], c["kv"], c["hidden"])
                                    for _ in range(c["layers"]))
        self.norm, self.lm_head = RMSNorm(c["d"]), nn.Linear(c["d"], c["vocab"], bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        angles = torch.outer(torch.arange(c["ctx"]).float(), inv_freq)
        angles = torch.cat((angles, angles), -1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        mask = torch.full((t, t), float("-inf"), device=idx.device).triu(1)
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x))


# ---- LSTM text classifier ------------------------------------------------------------------
class LSTMClassifier(nn.Module):
    def __init__(self, scale: str) -> None:
        super().__init__()
        c = _sizes(scale, {"vocab": 64, "d": 16, "hidden": 24, "layers": 2, "classes": 5},
                   {"vocab": 30000, "d": 512, "hidden": 1024, "layers": 2, "classes": 20})
        self.embed = nn.Embedding(c["vocab"], c["d"])
        self.lstm = nn.LSTM(c["d"], c["hidden"], c["layers"], batch_first=True)
        self.head = nn.Linear(c["hidden"], c["classes"])

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(idx))
        return self.head(out[:, -1])


# ---- gated MLP: pre-norm blocks with a SiLU gate (Split of one projection) -----------------
class GatedBlock(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.inp, self.out = nn.Linear(d, 2 * hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.inp(self.norm(x)).chunk(2, dim=-1)
        return x + self.out(F.silu(a) * b)


class GatedMLP(nn.Module):
    def __init__(self, scale: str) -> None:
        super().__init__()
        c = _sizes(scale, {"features": 48, "d": 64, "hidden": 96, "depth": 3, "classes": 10},
                   {"features": 1024, "d": 1024, "hidden": 4096, "depth": 8, "classes": 1000})
        self.embed = nn.Linear(c["features"], c["d"])
        self.blocks = nn.Sequential(*(GatedBlock(c["d"], c["hidden"])
                                      for _ in range(c["depth"])))
        self.head = nn.Linear(c["d"], c["classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)))


# ---- ConvNeXt-style: depthwise 7x7, channels-last LayerNorm, GELU MLP, layer scale ---------
class ConvNeXtBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(d, d, 7, padding=3, groups=d)
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.gamma = nn.Parameter(torch.full((d,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.mlp(self.norm(self.dw(x).permute(0, 2, 3, 1))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ChannelsNorm(nn.Module):
    """LayerNorm over the channels of an NCHW tensor (ConvNeXt's downsampling norm)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, scale: str) -> None:
        super().__init__()
        c = _sizes(scale, {"dims": [8, 16], "depths": [1, 1], "classes": 10},
                   {"dims": [96, 192, 384, 768], "depths": [3, 3, 9, 3], "classes": 1000})
        dims = c["dims"]
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, stride=4), ChannelsNorm(dims[0])]
        for i, (d, depth) in enumerate(zip(dims, c["depths"], strict=True)):
            if i:
                layers += [ChannelsNorm(dims[i - 1]), nn.Conv2d(dims[i - 1], d, 2, stride=2)]
            layers += [ConvNeXtBlock(d) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm, self.head = nn.LayerNorm(dims[-1], eps=1e-6), nn.Linear(dims[-1],
                                                                          c["classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.features(x).mean((2, 3))))


# ---- MLP-Mixer: patch conv, token mixing over the transposed tokens, channel mixing --------
class MixerBlock(nn.Module):
    def __init__(self, tokens: int, d: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.tokens = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(),
                                    nn.Linear(2 * tokens, tokens))
        self.channels = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, scale: str) -> None:
        super().__init__()
        c = _sizes(scale, {"image": 16, "patch": 4, "d": 32, "depth": 2, "classes": 10},
                   {"image": 224, "patch": 16, "d": 512, "depth": 8, "classes": 1000})
        tokens = (c["image"] // c["patch"]) ** 2
        self.patch = nn.Conv2d(3, c["d"], c["patch"], stride=c["patch"])
        self.blocks = nn.Sequential(*(MixerBlock(tokens, c["d"]) for _ in range(c["depth"])))
        self.norm, self.head = nn.LayerNorm(c["d"]), nn.Linear(c["d"], c["classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.patch(x).flatten(2).transpose(1, 2))
        return self.head(self.norm(x).mean(1))


# ---- ResNeXt: bottlenecks with a grouped 3x3, BatchNorm after ReLU kept by the exporter ----
class ResNeXtBlock(nn.Module):
    def __init__(self, cin: int, width: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False),
            nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.short = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.short(x))


class ResNeXt(nn.Module):
    def __init__(self, scale: str) -> None:
        super().__init__()
        c = _sizes(scale, {"stem": 8, "stages": [(16, 16, 1), (32, 32, 2)], "groups": 4,
                           "classes": 10},
                   {"stem": 64, "stages": [(128, 256, 1), (256, 512, 2), (512, 1024, 2),
                                           (1024, 2048, 2)], "groups": 32, "classes": 1000})
        layers: list[nn.Module] = [nn.Conv2d(3, c["stem"], 7, 2, 3, bias=False),
                                   nn.BatchNorm2d(c["stem"]), nn.ReLU(),
                                   nn.MaxPool2d(3, 2, 1)]
        cin = c["stem"]
        for width, cout, stride in c["stages"]:
            layers.append(ResNeXtBlock(cin, width, cout, stride, c["groups"]))
            cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, c["classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# ---- the corpus ----------------------------------------------------------------------------
def _image(small: tuple[int, ...], gpu: tuple[int, ...]):
    return lambda scale: {"x": (small if scale == "small" else gpu, torch.float32, 0)}


def _tokens(small: tuple[int, int], gpu: tuple[int, int], vocab: tuple[int, int]):
    return lambda scale: {"idx": (small if scale == "small" else gpu, torch.int64,
                                  vocab[scale != "small"])}


SPECS = [Spec(*fields) for fields in (
    ("mobilenet_dw", MobileNet, _image((2, 3, 32, 32), (128, 3, 224, 224)),
     "inverted residuals: depthwise 3x3 (groups = channels), 1x1 expand/project, ReLU6 "
     "(Clip), residual Adds, BatchNormalization kept (exported with training=PRESERVE), so "
     "training uses batch statistics", True, True),
    ("unet_small", UNet, _image((2, 3, 32, 32), (32, 3, 256, 256)),
     "encoder-decoder: MaxPool, ConvTranspose (stride 2), bilinear Resize, skip Concats, a "
     "per-pixel class output (N x C x H x W)"),
    ("vit_tiny", ViT, _image((2, 3, 16, 16), (64, 3, 224, 224)),
     "patch Conv, a cls token (Expand + Concat), learned positions, pre-norm "
     "LayerNormalization, scaled_dot_product_attention (as MatMul/Softmax), erf GELU, the cls "
     "row read by a Gather"),
    ("gpt2_tied", GPT2, _tokens((2, 16), (8, 1024), (96, 50257)),
     "token + position Gathers, causal mask from a sliced buffer, explicit Softmax, tanh GELU, "
     "the head as MatMul by Transpose of the token embedding (tied, no bias); exported without "
     "constant folding, so the table stays one initializer", False),
    ("llama_gqa", Llama, _tokens((2, 16), (8, 1024), (96, 32000)),
     "RMSNorm (Pow, ReduceMean, Sqrt, Div), SwiGLU (Sigmoid gate), rotary embeddings (sliced "
     "cos/sin, Neg, Concat), grouped-query attention (Expand + Reshape of k and v), additive "
     "causal mask, Casts to float32 around the Softmax, bias-free MatMul projections and head"),
    ("lstm_classifier", LSTMClassifier, _tokens((4, 12), (64, 256), (64, 30000)),
     "Embedding, a 2-layer batch-first nn.LSTM (ONNX LSTM nodes), the last step by a Gather, "
     "a Linear classifier"),
    ("gated_mlp", GatedMLP, _image((4, 48), (128, 1024)),
     "pre-norm residual MLP blocks whose gate is SiLU (x * Sigmoid) of one half of a Split "
     "projection"),
    ("convnext_tiny", ConvNeXt, _image((2, 3, 32, 32), (64, 3, 224, 224)),
     "depthwise 7x7 convolutions, channels-last LayerNormalization between Transposes, GELU "
     "MLPs, layer scale (Mul by a weight), strided-conv downsampling, a mean-pooled head"),
    ("mlp_mixer", Mixer, _image((2, 3, 16, 16), (64, 3, 224, 224)),
     "patch Conv, token mixing (MatMul over the transposed tokens), channel mixing, GELU, "
     "ReduceMean over the tokens"),
    ("resnext_small", ResNeXt, _image((2, 3, 32, 32), (64, 3, 224, 224)),
     "a 7x7 stride-2 stem and a MaxPool, bottlenecks with a grouped 3x3 convolution (groups "
     "= 4; 32 at GPU size), projection shortcuts, BatchNorm folded by the exporter, Flatten "
     "+ Gemm classifier"),
)]


def example_inputs(spec: Spec, scale: str = "small", batch: int | None = None
                   ) -> dict[str, torch.Tensor]:
    """Seeded inputs of the shapes the file declares (token ids below the vocabulary), with
    `batch` rows instead where given."""
    gen = torch.Generator().manual_seed(1)
    out = {}
    for name, (shape, dtype, bound) in spec.inputs(scale).items():
        shape = shape if batch is None else (batch, *shape[1:])
        out[name] = (torch.randint(0, bound, shape, generator=gen) if bound
                     else torch.randn(shape, generator=gen, dtype=dtype))
    return out


def build_module(spec: Spec, scale: str = "small") -> nn.Module:
    """The spec's module with seeded weights, in eval mode. Tensors that start constant
    (norm scales of ones, biases of zeros, BatchNorm statistics) get distinct random values:
    the exporter writes equal initializers once, so fresh LayerNorms would share (and train)
    one scale in the file, and folded BatchNorms would be the identity."""
    torch.manual_seed(0)
    module = spec.build(scale)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for bn in (m for m in module.modules() if isinstance(m, nn.BatchNorm2d)):
            for t in (bn.weight, bn.bias, bn.running_mean, bn.running_var):
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
        for p in module.parameters():
            if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return module.eval()


def export(spec: Spec, path: Path, scale: str = "small") -> Path:
    """Export `spec` to `path` (TorchScript exporter, opset 17, a dynamic batch axis whose
    default is the spec's batch); at GPU scale the weights are left out (external data, then
    deleted). The trace runs at batch 2 whatever the default: the graph is the same, and a
    GPU-size batch would cost the exporter tens of GB of host memory."""
    import onnx

    module, inputs = build_module(spec, scale), example_inputs(spec, scale, TRACE_BATCH)
    names = list(inputs)
    dynamic = {n: {0: "batch"} for n in [*names, "y"]}
    buffer = io.BytesIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(inputs.values()), buffer, dynamo=False,
                          opset_version=OPSET, input_names=names, output_names=["y"],
                          dynamic_axes=dynamic, do_constant_folding=spec.fold,
                          training=torch.onnx.TrainingMode.PRESERVE if spec.keep_batch_norm
                          else torch.onnx.TrainingMode.EVAL)
    model = onnx.load_from_string(buffer.getvalue())
    batch = next(iter(spec.inputs(scale).values()))[0][0]
    onnx.helper.set_model_props(model, {"autotm.default_dims": json.dumps({"batch": batch})})
    model.graph.name = spec.name
    path.parent.mkdir(parents=True, exist_ok=True)
    if scale == "small":
        onnx.save(model, path)
        return path
    data = path.with_name(path.name + ".data")
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location=data.name, size_threshold=1024)
    data.unlink()  # shapes only: the executor draws seeded random weights
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write (default: "
                        "models/corpus)")
    parser.add_argument("--scale", choices=("small", "gpu"), default="small",
                        help="small: CPU-test sizes with weights; gpu: benchmark sizes, "
                        "weights left out")
    parser.add_argument("--only", default="", help="comma-separated model names")
    args = parser.parse_args(argv)
    wanted = [n for n in args.only.split(",") if n]
    unknown = set(wanted) - {s.name for s in SPECS}
    if unknown:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}; the corpus has "
                     + ", ".join(s.name for s in SPECS))
    for spec in SPECS:
        if wanted and spec.name not in wanted:
            continue
        path = export(spec, args.out / f"{spec.name}.onnx", args.scale)
        print(f"{path}  {path.stat().st_size:>10,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
