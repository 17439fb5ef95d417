"""Language-model heads: the kernel that makes a loss's logits, in the forms the chunked loss
(`--loss-chunks`, `ir/training.py`) computes a block of rows at a time, and what it is in words.

    head = find_head(kernels, tensors, logits)    # a Head, or a str: why it is none
    head.text      # "Linear (MatMul by the transposed tied embedding 'emb.weight')"

`kernels` and `tensors` are a graph's (`Kernel`, `Tensor`) or the training derivation's drafts
(`KernelDraft`, `TensorDraft`). A head is one of (docs/training.md, "Which heads chunk"):
- `Linear` (domain "autotm"), the fusion pass's (docs/fusion.md): MatMul by a 2-d weight plus
  the Add of a bias per column, or MatMul by the Transpose of a 2-d weight (a tied embedding
  kept in its (vocab, d) orientation, `transB` = 1) with or without a bias;
- ONNX `Gemm` with transA = 0, alpha = 1, beta = 1 (or no C) and C one value per output
  column: a Linear on 2-d rows, as torch's exporters write one; `transB` as it has it;
- ONNX `MatMul` of X (rank >= 2) by a 2-d weight (a float WEIGHT that no kernel makes): a
  bias-free Linear whose W^T an exporter folded into a weight of its own (torch's TorchScript
  exporter's constant folding, the dynamo exporter's optimizer) or our importer did (a
  Transpose of an initializer read nowhere else, `frontend/fold.py`). The fusion pass leaves
  it alone (it already is one GEMM), so the forward graph and its hash stay what they were.
A weight that a Gather also reads as its table is "tied" (the embedding is the head's weight).
Under bf16 autocast (`ir.precision`) the head writes bf16 and a Cast up to float32 makes the
output; the head is found behind that Cast (`Head.low`: the chunked loss then multiplies in
bf16 and takes the loss in fp32, as autocast does).
Anything else is no head; the string `find_head` returns then names what it found and what
would make it one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from autotm_py.ir.graph import Role
from autotm_py.ir.rules.base import BACKWARD_DOMAIN, FLOAT_DTYPES
from autotm_py.ir.rules.fused import LINEAR

NOT_LINEAR = "not by a fused Linear layer"
LOW_FLOATS = frozenset({"bfloat16", "float16"})


class _Kernel(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def op_type(self) -> str: ...
    @property
    def domain(self) -> str: ...
    @property
    def inputs(self) -> Sequence[int]: ...
    @property
    def outputs(self) -> Sequence[int]: ...
    def attr(self, name: str, default: Any = None) -> Any: ...


class _Tensor(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def role(self) -> Role: ...


@dataclass(frozen=True)
class Head:
    """A head the chunked loss can replace: `LinearCrossEntropy(x, w[, bias], labels)` with
    `trans_b` computes its loss. `op` is the kernel's op ("Linear", "Gemm", "MatMul")."""

    op: str
    kernel: str
    x: int
    w: int
    bias: int | None
    trans_b: int
    weight: str
    bias_name: str | None
    tied: bool
    # the head's own output where a Cast up to float32 makes the logits from it (bf16
    # autocast, `ir.precision`: the product in bf16, the loss in fp32); None: none between
    low: int | None = None

    @property
    def text(self) -> str:
        by = ("the transposed " if self.trans_b else "the ") + \
            (f"tied embedding {self.weight!r}" if self.tied else f"weight {self.weight!r}")
        plus = f", plus the bias {self.bias_name!r}" if self.bias_name else ""
        if self.op == "MatMul":
            return f"MatMul by {by}"
        return f"{self.op} ({'' if self.op == 'Gemm' else 'MatMul '}by {by}{plus})"

    def meta(self) -> dict[str, Any]:
        """What `graph.meta["training"]["head"]` records (and `autotm inspect --json` shows)."""
        return {"op": self.op, "kernel": self.kernel, "weight": self.weight,
                "bias": self.bias_name, "transB": self.trans_b, "tied": self.tied,
                "text": self.text}


def find_head(kernels: Sequence[_Kernel], tensors: Sequence[_Tensor],
              logits: int) -> Head | str:
    """The head that makes tensor `logits`, or why there is none: "the output is made by ...,
    not by a fused Linear layer..." naming the pattern found and what would make it a head."""
    made = {t: k for k in kernels for t in k.outputs}
    k = made.get(logits)
    low = None
    if k is not None and up_cast(k, tensors):  # bf16 autocast: the head, then its fp32 copy
        low = k.inputs[0]
        if any(low in other.inputs for other in kernels if other is not k):
            return f"other kernels read the output's {tensors[low].dtype} form"
        k = made.get(low)
    if k is None:
        return f"the output is an input of the graph, {NOT_LINEAR}"
    problem = _problem(k, tensors, made)
    if problem is not None:
        return f"the output is made by {problem}"
    x, w = k.inputs[0], k.inputs[1]
    bias = k.inputs[2] if len(k.inputs) > 2 else None
    trans = int(k.attr("transB", 0)) if k.op_type != "MatMul" else 0
    master = _master(w, made)  # bf16: the head reads a copy of the weight
    tied = any(g.op_type == "Gather" and g.domain == "" and g.inputs[0] in (w, master)
               for g in kernels)
    return Head(k.op_type, k.name, x, w, bias, trans, tensors[master].name,
                None if bias is None else tensors[_master(bias, made)].name, tied, low)


def _master(t: int, made: dict[int, _Kernel]) -> int:
    """The tensor `t` is a Cast of (the fp32 weight of a bf16 copy), else `t`."""
    k = made.get(t)
    return k.inputs[0] if k is not None and k.op_type == "Cast" and k.domain == "" else t


def up_cast(k: _Kernel, tensors: Sequence[_Tensor]) -> bool:
    """`k` is a Cast of a bf16 or fp16 tensor up to float32 (what `ir.precision` puts after a
    head whose output is a graph output; the chunked and the unchunked loss drop it and read
    the half tensor, `ir/training.py`)."""
    return k.op_type == "Cast" and k.domain == "" and \
        tensors[k.inputs[0]].dtype in LOW_FLOATS and tensors[k.outputs[0]].dtype == "float32"


def _problem(k: _Kernel, tensors: Sequence[_Tensor], made: dict[int, _Kernel]) -> str | None:
    """Why kernel `k` is no head (the pattern it is, and the fix), or None where it is one."""
    what = f"{k.op_type} {k.name!r}"
    if k.op_type == LINEAR and k.domain == BACKWARD_DOMAIN:
        return None
    if k.domain == "" and k.op_type == "Gemm":
        return _gemm_problem(k, tensors, what)
    if k.domain == "" and k.op_type == "MatMul":
        return _matmul_problem(k, tensors, made, what)
    if k.domain == "" and k.op_type == "Add" and any(
            made.get(t) is not None and made[t].op_type == "MatMul" for t in k.inputs):
        return (f"{what}, the Add of a bias to a MatMul, {NOT_LINEAR}: the fusion pass fuses "
                "a bias of one value per class into the Linear (load the model without "
                "--no-fuse); a bias per position, or a product read elsewhere, stays unfused")
    return (f"{what}, {NOT_LINEAR}, a Gemm or a MatMul by a weight: the head must make the "
            "output itself (an op after it, such as a soft cap of the logits, needs them whole)")


def _gemm_problem(k: _Kernel, tensors: Sequence[_Tensor], what: str) -> str | None:
    fix = ("not by a Linear layer: chunking needs X W + b or X W^T + b with one bias value per "
           "class, as torch's nn.Linear exports")
    if int(k.attr("transA", 0)):
        return f"{what} with transA = 1 (X transposed), {fix}"
    if float(k.attr("alpha", 1.0)) != 1.0:
        return f"{what} with alpha = {k.attr('alpha')}, {fix}"
    if len(k.inputs) > 2:
        if float(k.attr("beta", 1.0)) != 1.0:
            return f"{what} with beta = {k.attr('beta')}, {fix}"
        c, y = tensors[k.inputs[2]], tensors[k.outputs[0]]
        core = c.shape
        while len(core) > 1 and core[0] == 1:
            core = core[1:]
        if core != (y.shape[-1],) or c.dtype != y.dtype:
            return f"{what} whose C has shape {c.shape} (not one value per class), {fix}"
    return None


def _matmul_problem(k: _Kernel, tensors: Sequence[_Tensor], made: dict[int, _Kernel],
                    what: str) -> str | None:
    x, w = tensors[k.inputs[0]], tensors[k.inputs[1]]
    if len(w.shape) != 2 or len(x.shape) < 2:
        return (f"{what} of a {len(x.shape)}-d by a {len(w.shape)}-d tensor (a batched product "
                f"or a vector, not a Linear layer), {NOT_LINEAR}")
    if x.dtype not in FLOAT_DTYPES or w.dtype not in FLOAT_DTYPES:
        return f"{what} of {x.dtype} by {w.dtype}, {NOT_LINEAR}"
    maker = made.get(k.inputs[1])
    if maker is None and w.role == Role.WEIGHT:
        return None
    if maker is not None and maker.op_type == "Cast" and \
            tensors[maker.inputs[0]].role == Role.WEIGHT:  # bf16: a copy of the weight
        return None
    if maker is not None and maker.op_type == "Transpose" and maker.domain == "" and \
            tuple(maker.attr("perm") or (1, 0)) == (1, 0) and \
            tensors[maker.inputs[0]].role == Role.WEIGHT:
        return (f"{what} by the transpose of the weight {tensors[maker.inputs[0]].name!r}, "
                f"{NOT_LINEAR}: the fusion pass makes it one (load the model without "
                "--no-fuse), or export the head's weight already transposed")
    source = "an input of the graph" if maker is None else f"made by {maker.op_type} " \
        f"{maker.name!r}"
    return (f"{what} by {w.name!r}, {source}: a product by no weight, {NOT_LINEAR}; a head "
            "multiplies by a weight or by its transpose")
