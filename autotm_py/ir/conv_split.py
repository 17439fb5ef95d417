"""Split fused convolution backward kernels into their parts (`split_conv_grads`).

The training rules (`ir/rules/nn.py`) give a convolution whose input and filter both need
gradients one `ConvGrad` kernel (dY, X, W -> dX, dW[, dB]), as autograd runs one
`convolution_backward`: its working set holds dY, X, W, dX and dW at once, and on large images
that one kernel can set the smallest feasible budget of the whole graph (a U-Net's 69% of its
peak). The same work as separate kernels, ConvGradFilter (dY, X -> dW), ConvGradBias (dY -> dB)
then ConvGradData (dY, W -> dX), never holds X and dX together: on a GPU torch runs the data
and filter gradients as two cuDNN calls anyway, so the split costs about one launch. The
planner splits the kernels that keep a budget infeasible (`pipeline.optimize`,
`--split-conv-grads`; docs/planning.md, "Splitting convolution backward kernels").

A split graph records the names of the kernels it split under `META_KEY`, which
`options.ModelOptions.of_graph` reads back, so a plan made for it rebuilds it.
"""

from __future__ import annotations

from collections.abc import Iterable

from autotm_py.errors import GraphError
from autotm_py.ir.builder import GraphBuilder
from autotm_py.ir.graph import Kernel, TensorGraph
from autotm_py.ir.layout import META_KEY as LAYOUT_KEY
from autotm_py.ir.layout import is_channels_last, to_channels_last
from autotm_py.options import SPLIT_KEY

META_KEY = SPLIT_KEY  # graph.meta[META_KEY]: the names of the fused kernels split

# fused op -> (its data part, its filter part): what the training rules emit where only one
# gradient is needed (`ir/rules/nn.py`, `_conv_like`); profiling prices a fused kernel from
# them (`profiling.sources.PARTS`)
CONV_GRAD_PARTS = {"ConvGrad": ("ConvGradData", "ConvGradFilter"),
                   "ConvTransposeGrad": ("ConvTransposeGradData", "ConvTransposeGradFilter")}
BIAS_PART = "ConvGradBias"


def fused_conv_grads(graph: TensorGraph) -> list[int]:
    """The ids of the fused convolution backward kernels of `graph`."""
    return [k.id for k in graph.kernels if k.op_type in CONV_GRAD_PARTS]


def split_names(graph: TensorGraph) -> tuple[str, ...]:
    """The names of the fused kernels a split graph split (() for any other graph)."""
    return tuple(graph.meta.get(META_KEY) or ())


def split_conv_grads(graph: TensorGraph, names: Iterable[str] | None = None) -> TensorGraph:
    """`graph` with each fused convolution backward kernel named in `names` (None: every one)
    replaced, at its place, by ConvGradFilter (dY, X -> dW), ConvGradBias (dY -> dB) where it
    computed dB, then ConvGradData (dY, W -> dX). The tensors (ids, names, roles) are the same;
    the kernels after a split one move up by one or two ids. A graph without those kernels
    comes back unchanged. A name that is no fused kernel of `graph` is a `GraphError`."""
    kernels = {k.name: k for k in graph.kernels if k.op_type in CONV_GRAD_PARTS}
    wanted = set(kernels) if names is None else set(names)
    unknown = sorted(wanted - set(kernels))
    if unknown:
        raise GraphError(f"cannot split {', '.join(map(repr, unknown[:3]))}: no fused "
                         f"convolution backward kernel of that name in graph {graph.name!r}")
    if not wanted:
        return graph
    b = GraphBuilder(graph.name)
    for t in graph.tensors:
        b.add_tensor(t.name, t.shape, t.dtype, t.role)
    b.constants.update(graph.constants)
    for k in graph.kernels:
        if k.name in wanted:
            _add_parts(b, graph, k)
        else:
            b.add_kernel(k.op_type, k.inputs, k.outputs, name=k.name, domain=k.domain,
                         attrs=k.attrs_dict, workspace_bytes=k.workspace_bytes)
    b.inputs, b.outputs, b.carried = list(graph.inputs), list(graph.outputs), list(graph.carried)
    meta = {key: value for key, value in graph.meta.items() if key != LAYOUT_KEY}
    b.meta = {**meta, META_KEY: tuple(sorted({*split_names(graph), *wanted}))}
    out = b.build()
    # the same tensors channels-last: each part joins tensors the fused kernel joined
    return to_channels_last(out) if is_channels_last(graph) else out


def _add_parts(b: GraphBuilder, graph: TensorGraph, k: Kernel) -> None:
    """The parts of fused kernel `k`, in the order that holds the least at once.

    Filter first: ConvGradFilter holds dY, X and dW; then X, where no later kernel reads it,
    is dead before ConvGradData makes dX, which then holds dY, W, dX (and dW, alive until its
    update). Data first would hold X beside dX (the filter part still reads X): one
    activation-sized tensor more at its peak, where dW and W are filter-sized. The bias part
    reads only dY and goes between them, so dY dies with the last part as it did with `k`."""
    data_op, filter_op = CONV_GRAD_PARTS[k.op_type]
    dy, x, w = k.inputs[:3]
    dx, dw = k.outputs[:2]
    attrs = {key: value for key, value in k.attrs_dict.items() if key != "output_mask"}
    stem = k.name.removesuffix("/grad")  # the rules' names: <conv>/grad -> <conv>/grad_data
    tensors = graph.tensors
    # each part keeps the fused kernel's own workspace (none from the rules: measured
    # workspace comes with the costs, `KernelCosts.spliced`)
    b.add_kernel(filter_op, [dy, x], [dw], name=f"{stem}/grad_filter", domain=k.domain,
                 attrs={**attrs, "shape": tensors[dw].shape}, workspace_bytes=k.workspace_bytes)
    if len(k.outputs) > 2:
        db = k.outputs[2]
        b.add_kernel(BIAS_PART, [dy], [db], name=f"{stem}/grad_bias", domain=k.domain,
                     attrs={"shape": tensors[db].shape})
    b.add_kernel(data_op, [dy, w], [dx], name=f"{stem}/grad_data", domain=k.domain,
                 attrs={**attrs, "shape": tensors[dx].shape}, workspace_bytes=k.workspace_bytes)


def part_origins(graph: TensorGraph, split: TensorGraph) -> list[tuple[int, bool]]:
    """For each kernel of `split` (`split_conv_grads(graph, ...)`): the id of the kernel of
    `graph` it is or is a part of, and whether it is a part. The split keeps the order."""
    out: list[tuple[int, bool]] = []
    j = 0
    for k in graph.kernels:
        mine = split.kernels[j] if j < len(split.kernels) else None
        if mine is not None and mine.op_type == k.op_type and mine.name == k.name:
            out.append((k.id, False))
            j += 1
            continue
        if k.op_type not in CONV_GRAD_PARTS:
            raise GraphError(f"graph {split.name!r} is no split of {graph.name!r}: kernel "
                             f"#{k.id} {k.name!r} is missing")
        parts = 3 if len(k.outputs) > 2 else 2
        out.extend([(k.id, True)] * parts)
        j += parts
    return out
