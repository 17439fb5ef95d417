"""Linear layers: a matrix product with a 2-d weight and its bias, as one `Linear` kernel.

Anchored at a MatMul(X, W) with a 2-d right operand and X of rank >= 2 (float):

    Y0 = MatMul(X, W)          or   Y0 = MatMul(X, Transpose(W'))    (a tied embedding's W'^T)
    Y  = Add(Y0, B) | Add(B, Y0)                                     (optional)

becomes `Linear(X, W[, B])` (`transB = 1` with W' for the transposed form), which runs as one
addmm over the rows of X, as torch's nn.Linear does, and whose backward (`LinearGrad`) computes
dX, dW and the bias's row sum in one kernel. Conditions (anything else stays as it is):
- B has the product's dtype and shape (N,) after any leading 1s, no more axes than Y0: it
  adds one value per output column, so Y has Y0's shape;
- Y0 is read only by the Add (and is no graph output) when the bias is fused; the Transpose
  must swap the two axes of a 2-d W' and be read only by the MatMul;
- a plain MatMul(X, W) without bias or transpose gains nothing and is left alone (a bias-free
  language-model head too: `--loss-chunks` reads that MatMul as it is, `ir/heads.py`).
"""

from __future__ import annotations

from autotm_py.frontend.fuse_base import Matcher, NewKernel, Rewrite
from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.base import BACKWARD_DOMAIN
from autotm_py.ir.rules.fused import LINEAR


def match_linear(m: Matcher, mm: Kernel) -> Rewrite | None:
    if mm.op_type != "MatMul" or mm.domain != "":
        return None
    g = m.graph
    x, w = mm.inputs
    y0 = mm.outputs[0]
    if len(g.tensors[w].shape) != 2 or len(g.tensors[x].shape) < 2 or not m.is_float(x):
        return None
    removed = [mm.id]
    weight, trans = w, 0
    tr = m.producer(w)
    if tr is not None and _swaps_2d(tr) and m.sole_user(w) is not None:
        weight, trans = tr.inputs[0], 1
        removed.append(tr.id)
    inputs = [x, weight]
    out, at = y0, mm
    add = m.sole_user(y0)
    bias = _bias(m, add, y0) if add is not None else None
    if bias is not None:
        inputs.append(bias)
        removed.append(add.id)  # type: ignore[union-attr]
        out, at = add.outputs[0], add  # type: ignore[union-attr]
    if bias is None and not trans:
        return None
    kernel = NewKernel(LINEAR, tuple(inputs), (out,), {"transB": trans},
                       m.kernel_name(removed, LINEAR), domain=BACKWARD_DOMAIN)
    return Rewrite("linear", frozenset(removed), ((at.id, kernel),))


def _swaps_2d(k: Kernel) -> bool:
    """A Transpose of a 2-d tensor (the default permutation reverses the axes)."""
    return k.op_type == "Transpose" and k.domain == "" and \
        tuple(k.attr("perm") or (1, 0)) == (1, 0)


def _bias(m: Matcher, add: Kernel, y0: int) -> int | None:
    """The bias operand of Add(Y0, B) / Add(B, Y0) when it adds one value per column."""
    if add.op_type != "Add" or add.domain != "" or len(add.inputs) != 2:
        return None
    a, b = add.inputs
    if a == b:
        return None
    bias = b if a == y0 else a
    g = m.graph
    y_shape, b_shape = g.tensors[y0].shape, g.tensors[bias].shape
    core = b_shape
    while core and core[0] == 1 and len(core) > 1:
        core = core[1:]
    if g.tensors[bias].dtype != g.tensors[y0].dtype or len(b_shape) > len(y_shape) or \
            core != (y_shape[-1],) or g.tensors[add.outputs[0]].shape != y_shape:
        return None
    return bias
