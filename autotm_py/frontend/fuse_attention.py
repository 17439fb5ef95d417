"""Scaled dot-product attention: the pattern and its match.

Anchored at a Softmax over the last axis whose only reader is MatMul(P, V), walking back:

    S  = MatMul(Q', KT')            Q' = Q or Q * c_q (Mul/Div by a scalar constant), same KT'
    S1 = S * c | S / c              optional, c a scalar constant
    S2 = S1 + M | Where(C, S1, F) | Where(C, F, S1)    optional, at most one of each kind
    P  = Softmax(S2, axis=-1);  O = MatMul(P, V)

becomes `ScaledDotProductAttention(Q, K, V[, mask])` with scale = c * c_q * c_k. Conditions
(anything else is left unfused):
- Q, K, V of rank 3 or 4 with equal batch dims; KT the output of a Transpose that swaps the
  last two axes of K (the Transpose is rewritten to produce K, or dropped when it becomes the
  identity), or of Reshape(Transpose(Reshape(K))) that merges K's leading axes, transposes
  the rest and splits them back (how torch's dynamo exporter spells K^T for a 4-d K: `_KeyT`);
  every intermediate (S, S1, S2, P, KT, Q', KT') read only by the next step;
- M additive, of the scores' dtype, broadcasting to them without growing them, and not
  depending on a trainable weight (it gets no gradient);
- Where: C bool, broadcasting likewise; F a scalar constant at or below -1e9 (or -inf, or
  the dtype's lowest value), so that exp(F - max) is exactly 0 like a masked-out entry; a
  constant C must leave at least one key per query row (else the unfused graph averages over
  the masked row where the fused op returns garbage); a run-time C only with F = -inf and
  C in the "keep" orientation;
- a constant keep mask (or constant additive mask with 0 on and below the diagonal and F-like
  values above it) equal to the lower triangle of (L, S) becomes is_causal=1 and no mask; an
  additive mask may repeat that (L, S) slice over leading axes (transformers' (B, 1, L, S));
  a constant additive mask of zeros is dropped (no mask).
A non-causal bool mask together with an additive mask is not fused (one mask slot).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from autotm_py.frontend.fuse_base import Matcher, NewKernel, NewTensor, Ref, Rewrite
from autotm_py.ir.graph import Kernel, Role
from autotm_py.ir.rules.base import BACKWARD_DOMAIN
from autotm_py.ir.rules.fused import BLHE, SDPA, sdpa_workspace

MASKED_FILL_MAX = -1e9  # fills at or below this are "masked out" (exp(F - max) == 0 exactly)
HEADS = [0, 2, 1, 3]  # (B, L, H, E) <-> (B, H, L, E): splitting heads off, merging them back


@dataclass(frozen=True)
class _KeyT:
    """How K^T is made from a tensor `src`: as Transpose(src, `perm`), by the kernels
    `removed`; `at` the last of them (where a rewritten Transpose goes)."""

    src: int
    perm: list[int]
    at: Kernel
    removed: tuple[int, ...]


def _key_transpose(m: Matcher, kt: int) -> _KeyT | None:
    tr = m.producer(kt)
    if tr is None or m.sole_user(kt) is None:
        return None
    if tr.op_type == "Transpose":
        perm = list(tr.attr("perm") or range(len(m.graph.tensors[kt].shape))[::-1])
        return _KeyT(tr.inputs[0], perm, tr, (tr.id,))
    return _merged_transpose(m, tr) if tr.op_type == "Reshape" else None


def _merged_transpose(m: Matcher, split: Kernel) -> _KeyT | None:
    """Reshape(Transpose(Reshape(X, (prod(X[:k]), *X[k:])), (0, *p)), (*X[:k], ...)): X's
    leading k axes merged into one, the rest permuted by p, the merged axis split back, which
    is Transpose(X, (0..k-1, k-1 + p)), when only the chain reads its intermediates."""
    g = m.graph
    tr = m.producer(split.inputs[0])
    if tr is None or tr.op_type != "Transpose" or m.sole_user(split.inputs[0]) is None:
        return None
    merge = m.producer(tr.inputs[0])
    if merge is None or merge.op_type != "Reshape" or m.sole_user(tr.inputs[0]) is None:
        return None
    x, merged = g.tensors[merge.inputs[0]].shape, g.tensors[merge.outputs[0]].shape
    perm = list(tr.attr("perm") or range(len(merged))[::-1])
    k = len(x) - len(merged) + 1
    if k < 1 or not perm or perm[0] != 0 or math.prod(x[:k]) != merged[0] \
            or tuple(x[k:]) != tuple(merged[1:]):
        return None
    full = list(range(k)) + [k - 1 + p for p in perm[1:]]
    if tuple(g.tensors[split.outputs[0]].shape) != tuple(x[p] for p in full):
        return None
    return _KeyT(merge.inputs[0], full, split, (merge.id, tr.id, split.id))


@dataclass(frozen=True)
class _Acc:
    """What the walk back from the Softmax has collected so far."""

    removed: tuple[int, ...] = ()
    scale: float = 1.0
    scaled: bool = False
    add: int | None = None  # additive mask tensor
    keep: Ref | None = None  # bool keep-mask (True = attend), a tensor or a new constant
    keep_value: np.ndarray | None = None  # its value when constant
    where: bool = False


def match_attention(m: Matcher, sm: Kernel) -> Rewrite | None:
    if sm.op_type != "Softmax" or sm.domain != "":
        return None
    x = sm.inputs[0]
    shape = m.graph.tensors[x].shape
    if len(shape) not in (3, 4) or int(sm.attr("axis", -1)) % len(shape) != len(shape) - 1 \
            or not m.is_float(x):
        return None
    mm2 = m.sole_user(sm.outputs[0])
    if mm2 is None or mm2.op_type != "MatMul" or mm2.inputs[0] != sm.outputs[0] \
            or mm2.inputs[1] == sm.outputs[0]:
        return None
    return _walk(m, x, _Acc(removed=(sm.id, mm2.id)), mm2)


def _walk(m: Matcher, t: int, acc: _Acc, mm2: Kernel) -> Rewrite | None:
    """Step back from the scores tensor `t` towards MatMul(Q, K^T)."""
    k = m.producer(t)
    if k is None or m.sole_user(t) is None:
        return None
    acc = replace(acc, removed=(*acc.removed, k.id))
    if k.op_type == "MatMul":
        return _scores(m, k, acc, mm2)
    if k.op_type in ("Mul", "Div") and not acc.scaled:
        other, c = _scaled_operand(m, k)
        if other is not None:
            return _walk(m, other, replace(acc, scale=acc.scale * c, scaled=True), mm2)
        return None
    if acc.scaled:  # masks come after the scale: (S + M) * c would scale the mask
        return None
    if k.op_type == "Add" and acc.add is None:
        for slot in (0, 1):
            mask, scores = k.inputs[1 - slot], k.inputs[slot]
            if _additive_ok(m, mask, t) and \
                    m.graph.tensors[scores].shape == m.graph.tensors[t].shape:
                found = _walk(m, k.inputs[slot], replace(acc, add=mask), mm2)
                if found is not None:
                    return found
        return None
    if k.op_type == "Where" and not acc.where:
        return _where(m, k, t, acc, mm2)
    return None


def _scaled_operand(m: Matcher, k: Kernel) -> tuple[int | None, float]:
    """(the other operand, factor) of Mul/Div by a finite non-zero scalar constant."""
    a, b = k.inputs
    for data, const in ((a, b), (b, a)) if k.op_type == "Mul" else ((a, b),):
        c = m.scalar(const)
        if c is not None and math.isfinite(c) and c != 0.0 and m.is_float(data) and \
                m.graph.tensors[data].shape == m.graph.tensors[k.outputs[0]].shape:
            return data, (c if k.op_type == "Mul" else 1.0 / c)
    return None, 1.0


def _broadcasts_into(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    if len(small) > len(big):
        return False
    return all(s in (1, b) for s, b in zip(small[::-1], big[::-1], strict=False))


def _additive_ok(m: Matcher, mask: int, scores: int) -> bool:
    g = m.graph
    return (g.tensors[mask].dtype == g.tensors[scores].dtype
            and _broadcasts_into(g.tensors[mask].shape, g.tensors[scores].shape)
            and mask not in m.weight_dependent)


def _masked_fill(value: float, dtype: str) -> bool:
    return _all_masked_fill(np.array([value]), dtype)


def _all_masked_fill(values: np.ndarray, dtype: str) -> bool:
    """Every value is one a masked score is filled with (vectorised: a causal mask at seq 2048
    has two million of them, once per attention)."""
    lowest = float(np.finfo(np.dtype("float16" if dtype == "bfloat16" else dtype)).min)
    return bool(np.all((values <= MASKED_FILL_MAX) | (values == lowest) | (values == -math.inf)))


def _where(m: Matcher, k: Kernel, t: int, acc: _Acc, mm2: Kernel) -> Rewrite | None:
    g = m.graph
    cond, a, b = k.inputs
    if g.tensors[cond].dtype != "bool" or not _broadcasts_into(g.tensors[cond].shape,
                                                               g.tensors[t].shape):
        return None
    value = m.constant(cond)
    for scores, fill, keep_is_cond in ((a, b, True), (b, a, False)):
        f = m.scalar(fill)
        if f is None or not _masked_fill(f, g.tensors[t].dtype) or \
                g.tensors[scores].shape != g.tensors[t].shape:
            continue
        if value is None:  # run-time condition: only the exact -inf keep form
            if not keep_is_cond or f != -math.inf:
                continue
            return _walk(m, scores, replace(acc, where=True, keep=cond), mm2)
        keep = np.asarray(value, dtype=bool) if keep_is_cond else ~np.asarray(value, dtype=bool)
        if not keep.any(axis=-1).all():
            continue  # a fully masked row: the unfused softmax averages, SDPA does not
        ref: Ref = cond if keep_is_cond else NewTensor(f"{g.name_of(cond)}::keep", keep.shape,
                                                       "bool", Role.CONSTANT, keep)
        return _walk(m, scores, replace(acc, where=True, keep=ref, keep_value=keep), mm2)
    return None


def _is_causal(keep: np.ndarray | None, l_len: int, s_len: int) -> bool:
    if keep is None or keep.ndim < 2 or keep.shape[-2:] != (l_len, s_len) or \
            any(d != 1 for d in keep.shape[:-2]):
        return False
    return bool(np.array_equal(keep.reshape(l_len, s_len), np.tri(l_len, s_len, dtype=bool)))


def _one_slice(value: np.ndarray, l_len: int, s_len: int) -> np.ndarray | None:
    """The (L, S) mask of a constant whose leading axes repeat one slice (transformers' masks
    are (B, 1, L, S) of one slice per batch row), else None."""
    if value.ndim < 2 or value.shape[-2:] != (l_len, s_len):
        return None
    slices = value.reshape(-1, l_len, s_len)
    return slices[0] if (slices == slices[:1]).all() else None


def _additive_zero(m: Matcher, mask: int | None) -> bool:
    """A constant additive mask of zeros (BERT's mask when no attention_mask is given): adding
    it changes nothing, so the fused op needs no mask."""
    value = m.constant(mask) if mask is not None else None
    return value is not None and not np.asarray(value).any()


def _additive_causal(m: Matcher, mask: int | None, l_len: int, s_len: int) -> bool:
    """A constant additive mask that is 0 on and below the diagonal and masked above (the
    same (L, S) slice for every leading index)."""
    value = m.constant(mask) if mask is not None else None
    if value is None:
        return False
    value = _one_slice(np.asarray(value, dtype=np.float64), l_len, s_len)
    if value is None:
        return False
    lower = np.tri(l_len, s_len, dtype=bool)
    dtype = m.graph.tensors[mask].dtype  # type: ignore[index]
    return bool((value[lower] == 0.0).all() and _all_masked_fill(value[~lower], dtype))


def _unscaled(m: Matcher, t: int) -> tuple[int, float, tuple[int, ...]]:
    """(operand, factor, removed kernels): Q * c / Q / c read only by the MatMul, else Q."""
    k = m.producer(t)
    if k is not None and k.op_type in ("Mul", "Div") and m.sole_user(t) is not None:
        other, c = _scaled_operand(m, k)
        if other is not None:
            return other, c, (k.id,)
    return t, 1.0, ()


def _scores(m: Matcher, mm1: Kernel, acc: _Acc, mm2: Kernel) -> Rewrite | None:
    g = m.graph
    q, cq, q_removed = _unscaled(m, mm1.inputs[0])
    kt, ck, k_removed = _unscaled(m, mm1.inputs[1])
    key_t = _key_transpose(m, kt)
    if key_t is None:
        return None
    perm = list(key_t.perm)
    perm[-2], perm[-1] = perm[-1], perm[-2]
    k_src = key_t.src
    k_shape = tuple(g.tensors[k_src].shape[p] for p in perm)
    v = mm2.inputs[1]
    qs, vs = g.tensors[q].shape, g.tensors[v].shape
    if not (len(qs) == len(k_shape) == len(vs) == len(g.tensors[mm1.outputs[0]].shape)
            and qs[:-2] == k_shape[:-2] == vs[:-2] and qs[-1] == k_shape[-1]
            and k_shape[-2] == vs[-2]
            and len({g.tensors[t].dtype for t in (q, k_src, v)}) == 1 and m.is_float(q)):
        return None
    l_len, s_len = qs[-2], k_shape[-2]
    causal = _is_causal(acc.keep_value, l_len, s_len)
    mask: Ref | None = acc.add
    if not causal and acc.keep is not None:
        if acc.add is not None:
            return None  # a bool and an additive mask: one mask slot only
        mask = acc.keep
    elif not causal and _additive_causal(m, acc.add, l_len, s_len):
        causal, mask = True, None
    elif not causal and acc.keep is None and _additive_zero(m, acc.add):
        mask = None
    removed = (*acc.removed, *q_removed, *k_removed, *key_t.removed)
    if not m.interior_ok(removed, keep=(mm2.outputs[0],)):
        return None
    return _rewrite(m, removed, key_t, perm, k_shape, (q, v), mask, causal,
                    acc.scale * cq * ck, mm2)


def _heads_split(m: Matcher, t: int, inside: tuple[int, ...]) -> Kernel | None:
    """The Transpose (perm 0, 2, 1, 3) that made `t` from a (B, L, H, E) tensor, when only the
    pattern's kernels read `t`."""
    k = m.producer(t)
    if not is_heads_transpose(k) or not m.read_only_by(t, inside):
        return None
    return k


def is_heads_transpose(k: Kernel | None) -> bool:
    """`k` is a Transpose (0, 2, 1, 3): heads split off a (B, L, H, E) tensor, or merged back."""
    return k is not None and k.op_type == "Transpose" and k.domain == "" and \
        list(k.attr("perm") or ()) == HEADS


def _heads_last(m: Matcher, removed: tuple[int, ...], key_src: int, perm: list[int],
                qv: tuple[int, int], mm2: Kernel) -> tuple[tuple[int, int, int], Kernel,
                                                           tuple[int, ...]] | None:
    """(Q, K, V as (B, L, H, E) tensors, the output's Transpose, kernels removed besides)
    when the heads were split off and merged back by Transposes (0, 2, 1, 3) that only the
    attention reads: the fused op then reads and writes that layout (`layout` "blhe") and
    none of the four transposed copies is made."""
    g = m.graph
    out_tr = m.sole_user(mm2.outputs[0])
    if len(g.tensors[qv[0]].shape) != 4 or out_tr is None or not is_heads_transpose(out_tr):
        return None
    q_tr, v_tr = (_heads_split(m, t, removed) for t in qv)
    if q_tr is None or v_tr is None:
        return None
    extra = {q_tr.id, v_tr.id, out_tr.id}
    if perm == HEADS:  # K^T = Transpose(K_blhe, (0, 2, 3, 1))
        key = key_src
    elif perm == sorted(perm):  # K^T = Transpose(K_bhle, (0, 1, 3, 2)), K_bhle split off
        k_tr = _heads_split(m, key_src, removed)
        if k_tr is None:
            return None
        key = k_tr.inputs[0]
        extra.add(k_tr.id)
    else:
        return None
    return (q_tr.inputs[0], key, v_tr.inputs[0]), out_tr, tuple(sorted(extra))


def _rewrite(m: Matcher, removed: tuple[int, ...], key_t: _KeyT, perm: list[int],
             k_shape: tuple[int, ...], qv: tuple[int, int], mask: Ref | None, causal: bool,
             scale: float, mm2: Kernel) -> Rewrite:
    g = m.graph
    q, v = qv
    placed: list[tuple[int, NewKernel]] = []
    key: Ref = key_t.src
    layout, out, at = {}, mm2.outputs[0], mm2.id
    heads = _heads_last(m, removed, key_t.src, perm, qv, mm2)
    if heads is not None:
        (q, key, v), out_tr, extra = heads
        removed = (*removed, *extra)
        layout, out, at = {"layout": BLHE}, out_tr.outputs[0], out_tr.id
    elif perm != sorted(perm):
        tr = key_t.at
        kt = tr.outputs[0]
        key = NewTensor(f"{g.name_of(kt)}::key", k_shape, g.tensors[kt].dtype)
        placed.append((tr.id, NewKernel("Transpose", (key_t.src,), (key,),
                                        {"perm": tuple(perm)}, f"{tr.name}::key")))
    inputs: tuple[Ref, ...] = (q, key, v) if mask is None else (q, key, v, mask)
    mask_spec = None
    if isinstance(mask, int):
        mask_spec = (g.tensors[mask].shape, g.tensors[mask].dtype)
    elif mask is not None:
        mask_spec = (mask.shape, mask.dtype)
    dtype = g.tensors[q].dtype
    attention = NewKernel(
        SDPA, inputs, (out,),
        {"scale": scale if dtype == "float64" else _f32(scale), "is_causal": int(causal),
         **layout},
        m.kernel_name(removed, SDPA), domain=BACKWARD_DOMAIN,
        workspace_bytes=sdpa_workspace(g.tensors[q].shape, dtype, mask_spec, backward=False))
    placed.append((at, attention))
    return Rewrite("attention", frozenset(removed), tuple(placed))


def _f32(value: float) -> float:
    """The shortest decimal that round-trips the float32 value, as the importer writes float
    attributes (1/sqrt(64) * 1 is 0.125 however the file spells its constants)."""
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))
