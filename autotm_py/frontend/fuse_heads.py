"""Attention in the heads-last layout through the rotary embedding and grouped-query heads.

`fuse_attention` gives the attention `layout` "blhe" when the Transposes (0, 2, 1, 3) that
split the heads off feed it directly. In Llama-style decoders (transformers' LlamaAttention,
as torch exports it) they do not: the rotary embedding and the repetition of the key/value
heads (`repeat_kv`) sit between them,

    Q = RotaryEmbedding(Transpose(Xq), COS, SIN)                            (B, H, L, E)
    K = Reshape(Expand(Unsqueeze(RotaryEmbedding(Transpose(Xk), COS, SIN), axis 2)))
    V = Reshape(Expand(Unsqueeze(Transpose(Xv), axis 2)))
    O = Transpose(ScaledDotProductAttention(Q, K, V))                       (B, L, H, E)

with Xq, Xk, Xv (B, L, heads, E), the Expand (B, Hkv, n, L, E), the Reshape (B, Hkv * n, L, E).
Each Transpose is a copy forward and its TransposeGrad one more backward, and the attention
reads and writes the (B, H, L, E) order that torch's fused kernels keep as (B, L, H, E)
memory, so its outputs and gradients are copied too. Both steps commute with the Transpose:
the rotation acts on the last axis (COS and SIN broadcast over the heads), and repeating a
head is the same copy in either order. So this pass, run on the graph the first fusion round
made (it needs its RotaryEmbedding and attention kernels), rewrites each such chain in the
(B, L, H, E) layout:

    Q' = RotaryEmbedding[blhe](Xq, COS, SIN)
    K' = Reshape(Expand(Unsqueeze(RotaryEmbedding[blhe](Xk, COS, SIN), axis 3)))  (B, L, H, E)
    V' = Reshape(Expand(Unsqueeze(Xv, axis 3)))
    O  = ScaledDotProductAttention[blhe](Q', K', V')

and none of the four Transposes is left. Conditions (anything else stays as it is): Q, K and V
each reach a Transpose (0, 2, 1, 3) through RotaryEmbeddings and (Unsqueeze axis 2, Expand,
Reshape merging axes 1 and 2) triples only; the attention's output is read only by a
Transpose (0, 2, 1, 3); every tensor in between is read only by the next step and is no graph
output. A mask keeps its (B, H, L, S) order (the "blhe" attention reads it so).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotm_py.frontend.fuse_attention import is_heads_transpose
from autotm_py.frontend.fuse_base import Matcher, NewKernel, NewTensor, Ref, Rewrite
from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.fused import BLHE, ROTARY, SDPA, sdpa_workspace


@dataclass(frozen=True)
class _Chain:
    """How one attention operand is made from a (B, L, H, E) tensor `source`: its Transpose,
    then `steps` (a RotaryEmbedding, or an (Unsqueeze, Expand, Reshape) triple) in order."""

    source: int
    transpose: Kernel
    steps: tuple[tuple[Kernel, ...], ...]

    @property
    def kernels(self) -> tuple[int, ...]:
        return (self.transpose.id, *(k.id for step in self.steps for k in step))


def match_heads_last(m: Matcher, sdpa: Kernel) -> Rewrite | None:
    if sdpa.op_type != SDPA or sdpa.attr("layout") == BLHE or len(sdpa.outputs) != 1 or \
            len(m.graph.tensors[sdpa.inputs[0]].shape) != 4:
        return None
    out_tr = m.sole_user(sdpa.outputs[0])
    if not is_heads_transpose(out_tr):
        return None
    chains = [_walk(m, t) for t in sdpa.inputs[:3]]
    if any(c is None for c in chains) or \
            all(not c.steps for c in chains):  # type: ignore[union-attr]
        return None  # (no step between: the first round's heads-last form, if anything)
    removed = {sdpa.id, out_tr.id, *(k for c in chains for k in c.kernels)}  # type: ignore
    if len(removed) != 2 + sum(len(c.kernels) for c in chains):  # type: ignore[union-attr]
        return None  # two operands share a step
    placed: list[tuple[int, NewKernel]] = []
    operands = [_rewrite_chain(m, c, placed) for c in chains]  # type: ignore[arg-type]
    q = operands[0]
    q_shape = q.shape if isinstance(q, NewTensor) else m.graph.tensors[q].shape
    mask = sdpa.inputs[3:]
    mask_spec = (m.graph.tensors[mask[0]].shape, m.graph.tensors[mask[0]].dtype) if mask \
        else None
    dtype = m.graph.tensors[sdpa.inputs[0]].dtype
    placed.append((out_tr.id, NewKernel(
        SDPA, (*operands, *mask), (out_tr.outputs[0],), {**sdpa.attrs_dict, "layout": BLHE},
        sdpa.name, domain=sdpa.domain,
        workspace_bytes=sdpa_workspace(q_shape, dtype, mask_spec, backward=False))))
    return Rewrite("heads_last", frozenset(removed), tuple(placed))


def _walk(m: Matcher, t: int) -> _Chain | None:
    """The chain that makes attention operand `t`, walking back to its heads Transpose."""
    steps: list[tuple[Kernel, ...]] = []
    while True:
        k = m.producer(t)
        if k is None or m.sole_user(t) is None:
            return None
        if is_heads_transpose(k):
            return _Chain(k.inputs[0], k, tuple(reversed(steps)))
        step = _rotary_step(m, k) or _repeat_step(m, k)
        if step is None:
            return None
        steps.append(step)
        t = step[0].inputs[0]


def _rotary_step(m: Matcher, k: Kernel) -> tuple[Kernel, ...] | None:
    if k.op_type != ROTARY or k.attr("layout") == BLHE or \
            len(m.graph.tensors[k.outputs[0]].shape) != 4 or \
            m.graph.tensors[k.outputs[0]].shape != m.graph.tensors[k.inputs[0]].shape:
        return None
    return (k,)


def _repeat_step(m: Matcher, reshape: Kernel) -> tuple[Kernel, ...] | None:
    """(Unsqueeze, Expand, Reshape) that repeats each of Hkv heads n times: (B, Hkv, L, E) ->
    (B, Hkv, 1, L, E) -> (B, Hkv, n, L, E) -> (B, Hkv * n, L, E), each read only by the next."""
    if reshape.op_type != "Reshape" or reshape.domain != "" or len(reshape.inputs) != 1:
        return None
    expand = m.producer(reshape.inputs[0])
    if expand is None or expand.op_type != "Expand" or expand.domain != "" or \
            len(expand.inputs) != 1 or m.sole_user(expand.outputs[0]) is None:
        return None
    unsqueeze = m.producer(expand.inputs[0])
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or unsqueeze.domain != "" or \
            len(unsqueeze.inputs) != 1 or tuple(unsqueeze.attr("axes") or ()) != (2,) or \
            m.sole_user(unsqueeze.outputs[0]) is None:
        return None
    g = m.graph
    b, hkv, length, e = g.tensors[unsqueeze.inputs[0]].shape
    n = g.tensors[expand.outputs[0]].shape[2]
    if g.tensors[expand.outputs[0]].shape != (b, hkv, n, length, e) or \
            g.tensors[reshape.outputs[0]].shape != (b, hkv * n, length, e):
        return None
    return (unsqueeze, expand, reshape)


def _rewrite_chain(m: Matcher, chain: _Chain, placed: list[tuple[int, NewKernel]]) -> Ref:
    """The chain's steps in the (B, L, H, E) layout, each where its old kernel ran; returns
    the tensor the attention reads."""
    g = m.graph
    current: Ref = chain.source
    for step in chain.steps:
        last = step[-1]
        b, heads, length, e = g.tensors[last.outputs[0]].shape
        dtype = g.tensors[last.outputs[0]].dtype
        if step[0].op_type == ROTARY:
            out = NewTensor(f"{g.name_of(last.outputs[0])}::blhe", (b, length, heads, e), dtype)
            placed.append((last.id, NewKernel(ROTARY, (current, *last.inputs[1:]), (out,),
                                              {**last.attrs_dict, "layout": BLHE}, last.name,
                                              domain=last.domain)))
            current = out
            continue
        hkv, n = g.tensors[step[1].outputs[0]].shape[1:3]  # the Expand's
        shapes = ((b, length, hkv, 1, e), (b, length, hkv, n, e), (b, length, heads, e))
        attrs = ({"axes": (3,)}, {"shape": shapes[1]}, {"shape": shapes[2]})
        for k, shape, attr in zip(step, shapes, attrs, strict=True):
            out = NewTensor(f"{g.name_of(k.outputs[0])}::blhe", shape, dtype)
            placed.append((k.id, NewKernel(k.op_type, (current,), (out,),
                                           {**k.attrs_dict, **attr}, k.name, domain=k.domain)))
            current = out
    return current
