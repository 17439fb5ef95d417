"""The NaN guard torch's dynamo exporter writes after an attention softmax, dropped where it
cannot change a value.

torch exports `scaled_dot_product_attention` with a mask (transformers' BERT and Llama with
`attn_implementation="sdpa"` pass one) as torch's own `_safe_softmax` computes it:

    P = Softmax(X, axis=-1);  G = Where(IsNaN(P), 0, P);  O = MatMul(G, V)
    X = S + M  |  Where(C, S, F)  |  S             (S the scaled scores Q K^T)

so that a row whose scores are all -inf gives zeros, not NaN. `IsNaN` is no kernel of ours, and
the guard hides the attention from its fusion. A softmax of finite scores is NaN only in a row
whose every score is -inf: when the mask is constant (it derives from initializers and Constant
nodes only) and leaves a value above -inf in every row, or there is no mask, the guard is the
identity, and `drop_softmax_guards` replaces its Where by an Identity (an alias at import) and
drops the IsNaN. The attention fusion then sees its usual pattern. A guard over a run-time or a
fully masked row stays, and the import names IsNaN as unsupported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autotm_py.errors import ModelImportError
from autotm_py.frontend.fold_eval import EvalContext, evaluate
from autotm_py.frontend.onnx_graph import OnnxGraph, OnnxNode

MAX_STATIC_ELEMENTS = 1 << 26  # a mask larger than this is not evaluated (the guard stays)


class _Static:
    """Values of the tensors that derive from initializers and Constant nodes only."""

    def __init__(self, graph: OnnxGraph, opsets: Sequence[onnx.OperatorSetIdProto]) -> None:
        self.graph = graph
        self.producer = {o: n for n in graph.nodes for o in n.outputs if o}
        self.ctx = EvalContext(opset=graph.opset, opsets=opsets, shape_of=lambda _: None,
                               load_tensor=numpy_helper.to_array)
        self.memo: dict[str, np.ndarray | None] = {}
        # what derives from a graph input (nodes are in topological order): never evaluated,
        # so asking about the scores loads no weight
        self.dynamic = set(graph.inputs)
        for node in graph.nodes:
            if any(i in self.dynamic for i in node.inputs):
                self.dynamic.update(node.outputs)

    def value(self, name: str) -> np.ndarray | None:
        if name in self.memo:
            return self.memo[name]
        if name in self.dynamic:
            return None
        self.memo[name] = None  # a cycle, or a failure below, is "not static"
        found: np.ndarray | None = None
        if name in self.graph.initializers:
            tensor = self.graph.initializers[name]
            if not tensor.external_data:
                found = numpy_helper.to_array(tensor)
        elif name in self.producer:
            found = self._evaluate(self.producer[name], name)
        self.memo[name] = found
        return found

    def _evaluate(self, node: OnnxNode, name: str) -> np.ndarray | None:
        if node.domain != "" or node.op_type in ("Shape", "Size"):
            return None
        args: list[np.ndarray | None] = []
        for i in node.inputs:
            if not i:
                args.append(None)
                continue
            arg = self.value(i)
            if arg is None:
                return None
            args.append(arg)
        try:
            outs = evaluate(node, args, self.ctx)
        except ModelImportError:
            return None
        for out_name, out in zip(node.outputs, outs, strict=False):
            if out.size <= MAX_STATIC_ELEMENTS:
                self.memo[out_name] = out
        return self.memo.get(name)


def _scalar(value: np.ndarray | None) -> float | None:
    if value is None or value.size != 1 or value.dtype.kind not in "fiu":
        return None
    return float(value.reshape(-1)[0])


def _rows_keep_one(static: _Static, x: str) -> bool:
    """Whether every row (last axis) of the softmax input `x` keeps a score above -inf for
    finite scores: no mask, a constant additive mask with a value above -inf in every row, or
    a Where whose constant condition keeps one score per row."""
    node = static.producer.get(x)
    if node is None or node.domain != "":
        return False
    if node.op_type in ("MatMul", "Mul", "Div"):
        return True  # the scores themselves (scaled): finite where Q and K are
    if node.op_type == "Add":
        for mask in node.inputs:
            value = static.value(mask)
            if value is not None and value.dtype.kind == "f" and value.ndim >= 1 and \
                    not np.isnan(value).any() and bool((value > -np.inf).any(axis=-1).all()):
                return True
        return False
    if node.op_type == "Where":
        cond, a, b = node.inputs
        keep = static.value(cond)
        if keep is None or keep.dtype != np.bool_ or keep.ndim < 1:
            return False
        for fill, keep_is_cond in ((b, True), (a, False)):
            if _scalar(static.value(fill)) is not None:
                kept = keep if keep_is_cond else ~keep
                return bool(kept.any(axis=-1).all())
    return False


def drop_softmax_guards(graph: OnnxGraph, opsets: Sequence[onnx.OperatorSetIdProto]
                        ) -> tuple[OnnxGraph, int]:
    """`graph` with every softmax NaN guard that cannot fire replaced by an Identity (see the
    module docstring), and how many were."""
    if not any(n.op_type == "IsNaN" for n in graph.nodes):
        return graph, 0
    static = _Static(graph, opsets)
    users: dict[str, list[OnnxNode]] = {}
    for node in graph.nodes:
        for i in node.inputs:
            if i:
                users.setdefault(i, []).append(node)
    drop: set[int] = set()
    swap: dict[int, OnnxNode] = {}
    for isnan in graph.nodes:
        if isnan.op_type != "IsNaN" or isnan.domain != "":
            continue
        p = isnan.inputs[0]
        softmax = static.producer.get(p)
        if softmax is None or softmax.op_type != "Softmax" or softmax.domain != "" or \
                int(softmax.attrs.get("axis", -1)) != -1 or p in graph.outputs:
            continue
        where = users.get(isnan.outputs[0], [])
        if len(where) != 1 or isnan.outputs[0] in graph.outputs:
            continue
        w = where[0]
        if w.op_type != "Where" or w.domain != "" or len(w.inputs) != 3 or \
                w.inputs[0] != isnan.outputs[0] or w.inputs[2] != p or w.inputs[1] == p or \
                _scalar(static.value(w.inputs[1])) != 0.0 or \
                {n.index for n in users.get(p, [])} != {isnan.index, w.index}:
            continue
        if not _rows_keep_one(static, softmax.inputs[0]):
            continue
        identity = helper.make_node("Identity", [p], [w.outputs[0]],
                                    name=f"{w.name or 'Where'}::unguarded")
        drop.add(isnan.index)
        swap[w.index] = OnnxNode(w.index, identity.name, "Identity", "", (p,),
                                 (w.outputs[0],), {}, identity)
    if not swap:
        return graph, 0
    nodes = tuple(swap.get(n.index, n) for n in graph.nodes if n.index not in drop)
    return replace(graph, nodes=nodes), len(swap)
