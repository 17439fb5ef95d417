"""RMSNorm (Llama-style decoders), as one `RMSNormalization` kernel.

transformers' LlamaRMSNorm, `w * (x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))`, exports
as (the float32 casts around it are no kernels when x already is float32: the importer drops
casts to the dtype a tensor has):

    S  = Pow(X, 2) | Mul(X, X)
    M  = ReduceMean(S, axes=[last], keepdims=1)
    V  = Add(M, eps) | Add(eps, M)                          (eps a scalar constant >= 0)
    R  = Sqrt(V)
    N  = Mul(X, Div(1, R)) | Mul(X, Reciprocal(R)) | Div(X, R)    (Mul in either order)
    Y  = Mul(N, W) | Mul(W, N)                              (optional; W of shape (D,))

and becomes `RMSNormalization(X[, W]) -> Y` (attrs axis = the last axis, epsilon). Anchored at
the ReduceMean. Every intermediate (S, M, V, R, 1/R, and N when the weight is fused) must be
read only by the next step and be no graph output, else nothing is fused: the backward of the
fused op saves X and one rstd per row, where the unfused one kept S, M, V, R, 1/R and N (each
of them also a kernel launch). N read elsewhere keeps the weight's Mul unfused but still fuses
the normalization.
"""

from __future__ import annotations

import numpy as np

from autotm_py.frontend.fuse_base import Matcher, NewKernel, Rewrite
from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.base import BACKWARD_DOMAIN
from autotm_py.ir.rules.fused import RMS_NORM


def match_rms_norm(m: Matcher, mean: Kernel) -> Rewrite | None:
    if mean.op_type != "ReduceMean" or mean.domain != "":
        return None
    sq = m.producer(mean.inputs[0])
    x = _squared(m, sq) if sq is not None else None
    if x is None or not m.is_float(x) or not _over_last_axis(m, mean, x):
        return None
    assert sq is not None
    add = m.sole_user(mean.outputs[0])
    eps = _epsilon(m, add, mean.outputs[0]) if add is not None else None
    if add is None or eps is None:
        return None
    sqrt = m.sole_user(add.outputs[0])
    if sqrt is None or sqrt.op_type != "Sqrt" or sqrt.domain != "":
        return None
    norm = _normalized(m, x, sqrt)
    if norm is None:
        return None
    kernels = [sq.id, mean.id, add.id, sqrt.id, *norm]
    out = m.graph.kernels[norm[-1]].outputs[0]
    inputs = [x]
    scale = _weight_mul(m, x, out)
    if scale is not None:
        inputs.append(scale[1])
        kernels.append(scale[0].id)
        out = scale[0].outputs[0]
    if not m.interior_ok(kernels, keep=(out,)):
        return None
    axis = len(m.graph.tensors[x].shape) - 1
    kernel = NewKernel(RMS_NORM, tuple(inputs), (out,), {"axis": axis, "epsilon": eps},
                       m.kernel_name(kernels, RMS_NORM), domain=BACKWARD_DOMAIN)
    producer = m.graph.tensors[out].producer
    assert producer is not None
    return Rewrite("rms_norm", frozenset(kernels), ((producer, kernel),))


def _squared(m: Matcher, k: Kernel) -> int | None:
    """X when `k` is Pow(X, 2) or Mul(X, X), else None."""
    if k.domain != "":
        return None
    if k.op_type == "Mul" and k.inputs[0] == k.inputs[1]:
        return k.inputs[0]
    if k.op_type == "Pow":
        exponent = m.constant(k.inputs[1])
        if exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2:
            return k.inputs[0]
    return None


def _over_last_axis(m: Matcher, mean: Kernel, x: int) -> bool:
    shape = m.graph.tensors[x].shape
    return len(shape) >= 1 and tuple(mean.attr("axes")) == (len(shape) - 1,) and \
        int(mean.attr("keepdims", 1)) == 1 and m.graph.tensors[mean.inputs[0]].shape == shape


def _epsilon(m: Matcher, add: Kernel, ms: int) -> float | None:
    """eps of Add(M, eps) or Add(eps, M): a finite scalar constant >= 0 that keeps M's shape."""
    if add.op_type != "Add" or add.domain != "" or ms not in add.inputs:
        return None
    other = add.inputs[1] if add.inputs[0] == ms else add.inputs[0]
    eps = m.scalar(other)
    same = m.graph.tensors[add.outputs[0]].shape == m.graph.tensors[ms].shape
    return eps if eps is not None and np.isfinite(eps) and eps >= 0 and same else None


def _normalized(m: Matcher, x: int, sqrt: Kernel) -> list[int] | None:
    """The kernels from the root R to X / R: Div(X, R), or Mul of X by Div(1, R) or by
    Reciprocal(R) (either operand order); None for any other use of R."""
    r = sqrt.outputs[0]
    user = m.sole_user(r)
    if user is None or user.domain != "":
        return None
    if user.op_type == "Div" and user.inputs == (x, r):
        return [user.id]
    one_over_r = user.op_type == "Div" and user.inputs[1] == r and \
        m.scalar(user.inputs[0]) == 1.0
    inverse = user.op_type == "Reciprocal" or one_over_r
    mul = m.sole_user(user.outputs[0]) if inverse else None
    if mul is None or mul.op_type != "Mul" or mul.domain != "" or \
            sorted(mul.inputs) != sorted((x, user.outputs[0])):
        return None
    return [user.id, mul.id]


def _weight_mul(m: Matcher, x: int, n: int) -> tuple[Kernel, int] | None:
    """(the Mul, W) when N's only reader multiplies it by a W of shape (D,) and X's dtype."""
    mul = m.sole_user(n)
    if mul is None or mul.op_type != "Mul" or mul.domain != "" or n not in mul.inputs or \
            mul.inputs[0] == mul.inputs[1]:
        return None
    w = mul.inputs[1] if mul.inputs[0] == n else mul.inputs[0]
    xt, wt = m.graph.tensors[x], m.graph.tensors[w]
    if wt.shape != xt.shape[-1:] or wt.dtype != xt.dtype:
        return None
    return mul, w
