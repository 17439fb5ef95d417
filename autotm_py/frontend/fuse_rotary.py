"""The rotary position embedding of Llama-style decoders, as one `RotaryEmbedding` kernel.

transformers' `apply_rotary_pos_emb` computes `q * cos + rotate_half(q) * sin` with
`rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])`, for q and for k of every layer; torch's
exporters (the dynamo one, and the TorchScript one of the corpus Llama) write it as

    X1 = Slice(X, [0, h) of the last axis)           h = D / 2, step 1
    X2 = Slice(X, [h, D) of the last axis)
    N  = Neg(X2)
    R  = Concat(N, X1, axis = last)
    A  = Mul(X, COS) | Mul(COS, X)
    B  = Mul(R, SIN) | Mul(SIN, R)
    Y  = Add(A, B) | Add(B, A)

(the importer makes the Slices' starts/ends/axes/steps explicit attributes, clamped and
non-negative), and it becomes `RotaryEmbedding(X, COS, SIN) -> Y`. COS and SIN must have X's
dtype and last axis and broadcast into X's shape (Y has X's shape), and depend on no trainable
weight (the fused op's rule gives them no gradient): in transformers they are constants of the
positions, or come from a graph input. Every intermediate (X1, X2, N, R, A, B) must be read
only inside the pattern and be no graph output, else nothing is fused. Anchored at the
Concat.

Per q or k, the forward's 7 kernels (7 launches: each Slice's view is copied out, as every
output is made contiguous) become one of 3 launches; the backward's two MulGrads, ConcatGrad
(two copies), the Neg's SumToShape, two SliceGrads (zero fill and copy each) and two
GradAccumulates (8 kernels, 11 launches) become one `RotaryEmbeddingGrad` of 3.
"""

from __future__ import annotations

from autotm_py.frontend.fuse_base import Matcher, NewKernel, Rewrite
from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.base import BACKWARD_DOMAIN
from autotm_py.ir.rules.fused import ROTARY


def match_rotary(m: Matcher, cat: Kernel) -> Rewrite | None:
    if cat.op_type != "Concat" or cat.domain != "" or len(cat.inputs) != 2:
        return None
    neg = m.producer(cat.inputs[0])
    low = m.producer(cat.inputs[1])
    if neg is None or low is None or neg.op_type != "Neg" or neg.domain != "":
        return None
    high = m.producer(neg.inputs[0])
    if high is None:
        return None
    x = low.inputs[0] if low.op_type == "Slice" and low.domain == "" else None
    if x is None or not m.is_float(x) or high.op_type != "Slice" or high.domain != "" or \
            high.inputs[0] != x:
        return None
    shape = m.graph.tensors[x].shape
    rank = len(shape)
    if rank < 1 or shape[-1] % 2 or shape[-1] < 2 or \
            int(cat.attr("axis")) % rank != rank - 1:
        return None
    d = shape[-1]
    h = d // 2
    if _last_axis_range(low, shape) != (0, h) or _last_axis_range(high, shape) != (h, d):
        return None
    r = cat.outputs[0]
    sin_mul = m.sole_user(r)
    sin = _other_factor(sin_mul, r)
    if sin_mul is None or sin is None:
        return None
    b = sin_mul.outputs[0]
    add = m.sole_user(b)
    if add is None or add.op_type != "Add" or add.domain != "" or add.inputs[0] == add.inputs[1]:
        return None
    a = add.inputs[1] if add.inputs[0] == b else add.inputs[0]
    cos_mul = m.producer(a)
    cos = _other_factor(cos_mul, x)
    if cos_mul is None or cos is None or not all(_fits(m, t, x) for t in (cos, sin)):
        return None
    y = add.outputs[0]
    if m.graph.tensors[y].shape != shape or m.graph.tensors[y].dtype != m.graph.tensors[x].dtype:
        return None
    kernels = [low.id, high.id, neg.id, cat.id, sin_mul.id, cos_mul.id, add.id]
    if not m.interior_ok(kernels, keep=(y,)):
        return None
    kernel = NewKernel(ROTARY, (x, cos, sin), (y,), {}, m.kernel_name(kernels, ROTARY),
                       domain=BACKWARD_DOMAIN)
    return Rewrite("rotary", frozenset(kernels), ((add.id, kernel),))


def _last_axis_range(sl: Kernel, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """[start, end) of a step-1 Slice along the last axis that keeps every other axis whole
    (canonical attributes: non-negative axes, clamped starts and ends); None otherwise."""
    rank = len(shape)
    got: tuple[int, int] | None = None
    for axis, start, end, step in zip(sl.attr("axes"), sl.attr("starts"), sl.attr("ends"),
                                      sl.attr("steps"), strict=True):
        axis, start, end = int(axis) % rank, int(start), int(end)
        if int(step) != 1:
            return None
        if axis == rank - 1:
            got = (start, end)
        elif (start, end) != (0, shape[axis]):
            return None
    return got


def _other_factor(mul: Kernel | None, t: int) -> int | None:
    """The other operand of Mul(t, F) or Mul(F, t), else None."""
    if mul is None or mul.op_type != "Mul" or mul.domain != "" or t not in mul.inputs or \
            mul.inputs[0] == mul.inputs[1]:
        return None
    return mul.inputs[1] if mul.inputs[0] == t else mul.inputs[0]


def _fits(m: Matcher, t: int, x: int) -> bool:
    """COS or SIN: X's dtype and last axis, broadcasting into X's shape, and no gradient."""
    ts, xs = m.graph.tensors[t], m.graph.tensors[x]
    shape = ts.shape
    if t == x or ts.dtype != xs.dtype or not shape or shape[-1] != xs.shape[-1] or \
            len(shape) > len(xs.shape) or t in m.weight_dependent:
        return False
    return all(s in (1, n) for s, n in zip(reversed(shape), reversed(xs.shape), strict=False))
