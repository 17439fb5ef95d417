"""Sequence-model layers on top of `NetBuilder`: Linear, LayerNorm, GELU, attention, FFN.

Activations are (batch, seq, features) with both leading dims symbolic, written as exporters
write transformer layers: Linear = MatMul + Add, heads split by Reshape [0, 0, h, dh] and
Transpose, LayerNormalization (opset 17) over the last axis.

Positions and the causal mask are derived from the token ids' *shape* with ops of our op list
only (no Shape/Range, which would leave symbolic dims to constant-fold): a (seq, seq) zero
matrix is made by broadcasting a zeroed row of the ids against its transpose; Trilu turns it into
a lower-triangular matrix of ones (row sums give positions 1..seq) or an additive causal mask.
These are a handful of small (seq, seq) kernels, computed once per model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autotm_py.frontend.zoo.layers import FLOAT, INT64, NetBuilder

# Additive mask value: exp(-1e9 + score) underflows to exactly 0 in float32, and unlike -inf
# it cannot make NaN through inf - inf.
MASK_VALUE = -1e9


def linear(b: NetBuilder, x: str, fin: int, fout: int, *, name: str, bias: bool = True) -> str:
    with b.scope(name):
        y = b.op("MatMul", x, b.weight("weight", (fin, fout)))
        return b.op("Add", y, b.weight("bias", (fout,))) if bias else y


def layer_norm(b: NetBuilder, x: str, d: int, *, eps: float, name: str) -> str:
    with b.scope(name):
        scale, bias = b.weight("weight", (d,)), b.weight("bias", (d,))
        return b.op("LayerNormalization", x, scale, bias, axis=-1, epsilon=eps)


def gelu(b: NetBuilder, x: str, form: str) -> str:
    """GELU as opset-17 exporters write it (the Gelu op only exists from opset 20).

    "erf": x * 0.5 * (1 + erf(x / sqrt 2)) (BERT); "tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x +
    0.044715 x^3))) (GPT-2's gelu_new).
    """
    if form == "erf":
        inner = b.op("Erf", b.op("Div", x, b.scalar(math.sqrt(2.0))))
    else:
        cube = b.op("Mul", b.op("Pow", x, b.scalar(3.0)), b.scalar(0.044715))
        scaled = b.op("Mul", b.op("Add", x, cube), b.scalar(math.sqrt(2.0 / math.pi)))
        inner = b.op("Tanh", scaled)
    half_x = b.op("Mul", x, b.scalar(0.5))
    return b.op("Mul", half_x, b.op("Add", inner, b.scalar(1.0)))


def embedding(b: NetBuilder, ids: str, rows: int, d: int, *, name: str) -> tuple[str, str]:
    """Gather from a (rows, d) table; returns (output, table name) so the table can be tied."""
    with b.scope(name):
        table = b.weight("weight", (rows, d))
    return b.op("Gather", table, ids, axis=0), table


def seq_square(b: NetBuilder, ids: str) -> str:
    """A (seq, seq) float matrix of zeros whose size follows the ids' symbolic seq dim."""
    row = b.op("Slice", ids, b.const([0]), b.const([1]), b.const([0]))  # (1, seq)
    zero_row = b.op("Mul", b.op("Cast", row, to=FLOAT), b.scalar(0.0))
    return b.op("Add", b.op("Transpose", zero_row, perm=[1, 0]), zero_row)


def positions(b: NetBuilder, square: str) -> str:
    """Position ids 0..seq-1 (int64, shape (seq,)) from `seq_square`'s zero matrix."""
    lower = b.op("Trilu", b.op("Add", square, b.scalar(1.0)), upper=0)
    counts = b.op("ReduceSum", lower, b.const([1]), keepdims=0)  # row i holds i + 1 ones
    return b.op("Cast", b.op("Sub", counts, b.scalar(1.0)), to=INT64)


def causal_mask(b: NetBuilder, square: str) -> str:
    """Additive (seq, seq) mask: 0 on and below the diagonal, MASK_VALUE above it."""
    filled = b.op("Add", square, b.scalar(MASK_VALUE))
    return b.op("Trilu", filled, b.const(1), upper=1)


def _heads(b: NetBuilder, x: str, heads: int, perm: Sequence[int]) -> str:
    split = b.op("Reshape", x, b.const([0, 0, heads, -1]))  # (batch, seq, h, dh)
    return b.op("Transpose", split, perm=list(perm))


def attention_core(b: NetBuilder, q: str, k: str, v: str, *, d: int, heads: int,
                   mask: str | None = None) -> str:
    """softmax(q k^T / sqrt(dh) + mask) v over `heads` heads; (batch, seq, d) in and out."""
    qh = _heads(b, q, heads, (0, 2, 1, 3))  # (batch, h, seq, dh)
    kt = _heads(b, k, heads, (0, 2, 3, 1))  # (batch, h, dh, seq)
    vh = _heads(b, v, heads, (0, 2, 1, 3))
    scores = b.op("Div", b.op("MatMul", qh, kt), b.scalar(math.sqrt(d // heads)))
    if mask is not None:
        scores = b.op("Add", scores, mask)
    ctx = b.op("MatMul", b.op("Softmax", scores, axis=-1), vh)
    merged = b.op("Transpose", ctx, perm=[0, 2, 1, 3])
    return b.op("Reshape", merged, b.const([0, 0, -1]))


def attention(b: NetBuilder, x: str, memory: str, *, d: int, heads: int, name: str,
              mask: str | None = None, out_name: str = "out") -> str:
    """Multi-head attention with separate q/k/v projections (BERT, Transformer).

    `memory` is `x` for self-attention and the encoder output for cross-attention.
    """
    with b.scope(name):
        q = linear(b, x, d, d, name="query")
        k = linear(b, memory, d, d, name="key")
        v = linear(b, memory, d, d, name="value")
        ctx = attention_core(b, q, k, v, d=d, heads=heads, mask=mask)
        return linear(b, ctx, d, d, name=out_name)


def fused_attention(b: NetBuilder, x: str, *, d: int, heads: int, mask: str, name: str) -> str:
    """GPT-2's attention: one (d, 3d) projection split into q, k, v, then the output proj."""
    with b.scope(name):
        qkv = linear(b, x, d, 3 * d, name="c_attn")
        q, k, v = b.op_multi("Split", qkv, b.const([d, d, d]), outputs=3, axis=-1)
        ctx = attention_core(b, q, k, v, d=d, heads=heads, mask=mask)
        return linear(b, ctx, d, d, name="c_proj")


def feed_forward(b: NetBuilder, x: str, *, d: int, dff: int, act: str, name: str,
                 names: tuple[str, str] = ("fc1", "fc2")) -> str:
    """Linear(d, dff) -> activation ('relu' or a GELU form) -> Linear(dff, d)."""
    with b.scope(name):
        h = linear(b, x, d, dff, name=names[0])
        h = b.op("Relu", h) if act == "relu" else gelu(b, h, act)
        return linear(b, h, dff, d, name=names[1])


def tied_logits(b: NetBuilder, x: str, table: str) -> str:
    """x @ table^T: the output projection that shares the token embedding's weights."""
    return b.op("MatMul", x, b.op("Transpose", table, perm=[1, 0]))
