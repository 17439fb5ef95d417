"""Mixed precision as `torch.autocast("cuda", dtype=torch.bfloat16)` runs it (docs/precision.md).

`with_precision(graph, "bf16")` turns a forward graph (fp32) into its autocast form, op by op,
following autocast's CUDA lists:

- *lower precision* (`LOWER`): matrix products, convolutions, linear layers and attention run
  in bf16. Each float32 input is read through a bf16 copy made by a `Cast` kernel just before
  its first reader; one copy per tensor serves every later reader (autocast caches the casts
  of weights the same way). Weights stay fp32 master tensors: the copy is a tensor of its own,
  which the planner may place, recompute from the master, or drop like any other.
- *float32* (`FP32`): softmax, log-softmax, layer normalization, ReduceSum, exp/log/pow/
  reciprocal, resize, recurrent layers and a graph's own loss read fp32 (bf16 inputs are cast
  up) and write fp32. autocast lists `sum` but not `mean`, so ReduceMean falls through.
- everything else falls through: it runs in the widest float type of its inputs, as torch's
  type promotion does. A 0-d constant (a folded scalar such as attention's scale) does not
  promote, as a 0-d tensor does not in torch; other mixed inputs are cast up to the widest
  type (a copy torch makes inside the kernel, here a tensor the planner sees). Batch
  normalization keeps its fp32 parameters and statistics and runs in its input's type, as
  cuDNN's and torch's mixed batch norm do.

A float graph output left in bf16 is cast back to fp32 and keeps its name (the bf16 tensor
gets `::bf16`). The softmax cross-entropy the training derivation adds drops that Cast and
reads the bf16 tensor, computing in fp32 inside its kernel (`ir/training.py`); its chunked form
does the same.
Forward tensor ids are kept (new tensors come after them); the graph's meta records the
precision under `META_KEY`, which `options.ModelOptions.of_graph` reads back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autotm_py.errors import ConfigError, GraphError
from autotm_py.ir.builder import GraphBuilder
from autotm_py.ir.graph import Kernel, Role, TensorGraph
from autotm_py.ir.layout import is_channels_last
from autotm_py.ir.rules.base import FLOAT_DTYPES
from autotm_py.ir.rules.fused import SDPA, sdpa_workspace
from autotm_py.options import AUTO_PRECISION, PRECISION_KEY, PRECISIONS

META_KEY = PRECISION_KEY  # graph.meta[META_KEY] == "bf16" on a converted graph
BF16, FP32_DTYPE = "bfloat16", "float32"

# autocast's lower-precision list (CUDA), as our ops and the fusion passes' ops spell it
LOWER = frozenset({"Conv", "ConvRelu", "ConvTranspose", "MatMul", "Gemm", "Linear", SDPA})
# autocast's float32 list: what must not lose precision (statistics, exponentials, losses)
FP32 = frozenset({"Softmax", "LogSoftmax", "LayerNormalization", "RMSNormalization", "LRN",
                  "ReduceSum", "Exp", "Log", "Reciprocal", "Pow", "Resize", "LSTM", "GRU",
                  "SoftmaxCrossEntropyLoss"})
# ops whose first input alone sets the compute type (the others keep theirs)
FIRST_INPUT = frozenset({"BatchNormalization"})
_WIDTH = {"bfloat16": 0, "float16": 0, "float32": 1, "float64": 2}


__all__ = ["FP32", "LOWER", "META_KEY", "PRECISIONS", "check_precision", "precision_of",
           "with_precision"]


def check_precision(precision: object) -> str:
    """`precision` when it is fp32 or bf16; "auto" must have been resolved for a device first
    (`options.ModelOptions.on`, `options.default_precision`)."""
    if precision == AUTO_PRECISION:
        raise ConfigError("precision 'auto' is the device's (bf16 on a GPU, fp32 on the CPU): "
                          "resolve it for a device first (ModelOptions.on(device)), or give "
                          "fp32 or bf16")
    if precision not in PRECISIONS:
        raise ConfigError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    return str(precision)


def precision_of(graph: TensorGraph) -> str:
    return str(graph.meta.get(META_KEY, "fp32"))


def with_precision(graph: TensorGraph, precision: str) -> TensorGraph:
    """The forward graph in `precision`: unchanged for fp32, its autocast form for bf16."""
    if precision_of(graph) == check_precision(precision):
        return graph
    if precision == "fp32":
        raise GraphError(f"graph {graph.name!r} is bf16 already; build it again in fp32")
    if "training" in graph.meta or is_channels_last(graph):
        raise GraphError(f"graph {graph.name!r}: convert the forward, row-major graph to bf16, "
                         "then derive training and change the layout")
    return _build(graph, _assign(graph))


@dataclass(frozen=True)
class _Assignment:
    """What the conversion decided: every tensor's new dtype, and each kernel's casts (slot ->
    the dtype its input is read in)."""

    dtypes: tuple[str, ...]
    casts: tuple[dict[int, str], ...]


def _assign(graph: TensorGraph) -> _Assignment:
    """Walk the kernels in order: each one's compute type from its policy and its inputs' new
    dtypes; its float outputs take that type."""
    dtypes = [t.dtype for t in graph.tensors]
    casts = []
    for k in graph.kernels:
        compute, slots = _policy(graph, k, dtypes)
        casts.append({i: compute for i in slots if dtypes[k.inputs[i]] != compute})
        if compute is not None and k.op_type != "Cast":  # an explicit Cast keeps its type
            for t in k.outputs:
                if dtypes[t] in FLOAT_DTYPES:
                    dtypes[t] = compute
    return _Assignment(tuple(dtypes), tuple(casts))


def _policy(graph: TensorGraph, k: Kernel, dtypes: list[str]) -> tuple[str | None, list[int]]:
    """(the kernel's compute type or None (no float input), the input slots read in it)."""
    floats = [i for i, t in enumerate(k.inputs) if dtypes[t] in FLOAT_DTYPES]
    if not floats:
        return None, []
    if k.op_type in LOWER and all(dtypes[k.inputs[i]] != "float64" for i in floats):
        return BF16, floats  # autocast leaves float64 alone
    if k.op_type in FP32:
        low = [i for i in floats if _WIDTH[dtypes[k.inputs[i]]] == 0]
        return (FP32_DTYPE if low else _widest(dtypes[k.inputs[i]] for i in floats)), low
    if k.op_type in FIRST_INPUT:
        return dtypes[k.inputs[0]], []
    promoting = [i for i in floats if not _scalar_constant(graph, k.inputs[i])] or floats
    compute = _widest(dtypes[k.inputs[i]] for i in promoting)
    return compute, promoting


def _scalar_constant(graph: TensorGraph, tid: int) -> bool:
    """A folded 0-d constant: torch's type promotion lets dimensioned tensors decide."""
    return tid in graph.constants and graph.tensors[tid].shape == ()


def _widest(types: Iterable[str]) -> str:
    """The widest float type; bf16 with fp16 gives fp32, as torch promotes them."""
    order = sorted(types, key=_WIDTH.__getitem__)
    return "float32" if order[-1] == "float16" and "bfloat16" in order else order[-1]


_SUFFIX = {"bfloat16": "bf16", "float32": "fp32", "float64": "fp64", "float16": "fp16"}


def _build(graph: TensorGraph, plan: _Assignment) -> TensorGraph:
    """The converted graph: forward tensors (same ids, new dtypes), each kernel after the
    casts it needs, and fp32 casts of bf16 outputs under the outputs' names."""
    b = GraphBuilder(graph.name)
    low_outputs = [t for t in graph.outputs if plan.dtypes[t] == BF16]
    for t in graph.tensors:
        if t.id in low_outputs:  # the output is its fp32 copy now
            b.add_tensor(f"{t.name}::bf16", t.shape, BF16,
                         Role.ACTIVATION if t.role == Role.OUTPUT else t.role)
        else:
            b.add_tensor(t.name, t.shape, plan.dtypes[t.id], t.role)
    b.constants.update(graph.constants)
    made: dict[tuple[int, str], int] = {}
    for k, casts in zip(graph.kernels, plan.casts, strict=True):
        inputs = [_cast(b, t, casts[i], made) if i in casts else t
                  for i, t in enumerate(k.inputs)]
        b.add_kernel(k.op_type, inputs, k.outputs, name=k.name, domain=k.domain,
                     attrs=k.attrs_dict, workspace_bytes=_workspace(b, k, inputs))
    b.inputs, b.carried = list(graph.inputs), list(graph.carried)
    b.outputs = [_output(b, graph, t) if t in low_outputs else t for t in graph.outputs]
    b.meta = {**graph.meta, META_KEY: "bf16"}
    return b.build()


def _cast(b: GraphBuilder, tid: int, dtype: str, made: dict[tuple[int, str], int]) -> int:
    """The copy of `tid` in `dtype`, made by a Cast kernel at its first reader."""
    if (tid, dtype) not in made:
        # an activation even for a weight's copy: made each iteration, dead after its last
        # reader (the master stays the weight, and the one that trains)
        out = b.add_tensor(f"{b.name_of(tid)}::{_SUFFIX[dtype]}", b.shape_of(tid), dtype,
                           Role.ACTIVATION)
        b.add_kernel("Cast", [tid], [out], name=f"cast/{b.name_of(out)}", attrs={"to": dtype})
        made[(tid, dtype)] = out
    return made[(tid, dtype)]


def _workspace(b: GraphBuilder, k: Kernel, inputs: list[int]) -> int:
    """Attention's workspace follows its query's dtype (`sdpa_workspace`); others keep it."""
    if k.op_type != SDPA:
        return k.workspace_bytes
    mask = inputs[3] if len(inputs) > 3 else None
    spec = None if mask is None else (b.shape_of(mask), b.dtype_of(mask))
    return sdpa_workspace(b.shape_of(inputs[0]), b.dtype_of(inputs[0]), spec, backward=False)


def _output(b: GraphBuilder, graph: TensorGraph, tid: int) -> int:
    """An fp32 copy of bf16 output `tid`, under the output's own name."""
    out = b.add_tensor(graph.tensors[tid].name, graph.tensors[tid].shape, FP32_DTYPE,
                       graph.tensors[tid].role)
    b.add_kernel("Cast", [tid], [out], name=f"cast/{graph.tensors[tid].name}",
                 attrs={"to": FP32_DTYPE})
    return out
