"""The softmax NaN guard of torch's dynamo export (`frontend/softmax_guard.py`) and the masks
transformers builds (`frontend/fuse_attention.py`): `scaled_dot_product_attention` with a
constant boolean mask exports as Softmax, `Where(IsNaN(P), 0, P)`, MatMul; the guard is dropped
where no row is fully masked and the attention fuses (a causal mask to `is_causal`, a mask of
zeros to none) computing what the module computes; a guard that could fire stays and the import
refuses IsNaN. Also the fold of GatherElements over a broadcast input (BERT's token types)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autotm_py.errors import UnsupportedOpError
from autotm_py.frontend.capture import capture_module
from autotm_py.frontend.fold_eval import EvalContext, evaluate
from autotm_py.frontend.onnx import import_model
from autotm_py.frontend.onnx_graph import OnnxNode
from tests.test_capture import computes_the_module

B, H, L, E = 2, 2, 8, 4


class Attend(nn.Module):
    """q, k, v from one projection; SDPA with a constant mask of (B, 1, L, L), as transformers
    passes its masks (bool keep-mask, or an additive float mask)."""

    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__()
        self.proj = nn.Linear(H * E, 3 * H * E)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (z.reshape(B, L, H, E).transpose(1, 2) for z in self.proj(x).chunk(3, -1))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask) \
            .transpose(1, 2).reshape(B, L, H * E)


def _captured(mask: torch.Tensor):
    torch.manual_seed(0)
    module, x = Attend(mask), torch.randn(B, L, H * E)
    return module, x, capture_module(module, (x,))




def _attention(graph):
    return [k for k in graph.kernels if k.op_type == "ScaledDotProductAttention"]


def test_a_causal_bool_mask_drops_the_guard_and_fuses_as_causal():
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool)).expand(B, 1, L, L).contiguous()
    module, x, captured = _captured(causal)
    exported = Counter(n.op_type for n in captured.model.graph.node)
    assert exported["IsNaN"] == 1 and exported["Softmax"] == 1  # the form this is about
    graph = import_model(captured.model, name="attend", initializer_weights=True)
    (sdpa,) = _attention(graph)
    assert sdpa.attr("is_causal") == 1 and len(sdpa.inputs) == 3  # no (B, 1, L, L) mask
    assert not {"Softmax", "Where", "IsNaN"} & {k.op_type for k in graph.kernels}
    computes_the_module(module, x, captured, graph)
    unfused = import_model(captured.model, name="attend", initializer_weights=True, fuse=False)
    assert "Softmax" in {k.op_type for k in unfused.kernels}  # the guard went, not the softmax
    computes_the_module(module, x, captured, unfused)


def test_a_mask_of_zeros_is_no_mask():
    keep = torch.ones(B, 1, L, L, dtype=torch.bool)  # attend everywhere: Add of zeros
    module, x, captured = _captured(keep)
    graph = import_model(captured.model, name="attend", initializer_weights=True)
    (sdpa,) = _attention(graph)
    assert sdpa.attr("is_causal") == 0 and len(sdpa.inputs) == 3
    computes_the_module(module, x, captured, graph)


def test_a_general_constant_mask_stays_the_fused_ops_mask():
    """A constant mask that is neither causal nor all-keep is the fused op's mask. (torch's
    export fills masked scores with the dtype's lowest value, not -inf, so the guard cannot
    fire even on a fully masked row; such a row then averages V where torch's eager SDPA gives
    zeros: the exporter's difference, kept out of this comparison.)"""
    gen = torch.Generator().manual_seed(3)
    keep = torch.rand(B, 1, L, L, generator=gen) > 0.5
    keep[..., 0] = True  # every row keeps a key
    module, x, captured = _captured(keep)
    graph = import_model(captured.model, name="attend", initializer_weights=True)
    (sdpa,) = _attention(graph)
    assert sdpa.attr("is_causal") == 0 and len(sdpa.inputs) == 4
    computes_the_module(module, x, captured, graph)


def _guarded(mask: np.ndarray | None) -> onnx.ModelProto:
    """Softmax(S + M) guarded as torch exports it, then MatMul by V; M a Constant node, or a
    graph input when None."""
    from onnx import TensorProto, helper, numpy_helper

    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f32, (B, L, L)) for n in ("s", "v")]
    nodes = [helper.make_node("Constant", [], ["zero"],
                              value=numpy_helper.from_array(np.array(0, np.float32))),
             helper.make_node("Add", ["s", "m"], ["x"]),
             helper.make_node("Softmax", ["x"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["nan"]),
             helper.make_node("Where", ["nan", "zero", "p"], ["g"]),
             helper.make_node("MatMul", ["g", "v"], ["y"])]
    if mask is None:
        inputs.append(helper.make_tensor_value_info("m", f32, (B, L, L)))
    else:
        nodes.insert(0, helper.make_node("Constant", [], ["m"],
                                         value=numpy_helper.from_array(mask)))
    graph = helper.make_graph(nodes, "guarded", inputs,
                              [helper.make_tensor_value_info("y", f32, (B, L, L))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_guard_that_could_fire_stays_and_is_refused():
    """A row of -inf (the guard's zeros differ from the softmax's NaN there) or a mask known
    only at run time: the guard stays, and IsNaN is no kernel of ours."""
    mask = np.zeros((B, L, L), np.float32)
    graph = import_model(_guarded(mask), name="guarded")  # no row fully masked: dropped
    assert "IsNaN" not in {k.op_type for k in graph.kernels}
    mask[1, 2] = -np.inf
    for model in (_guarded(mask), _guarded(None)):
        with pytest.raises(UnsupportedOpError, match="IsNaN"):
            import_model(model, name="guarded")


def test_gather_elements_folds_over_a_broadcast_input():
    node = OnnxNode(0, "g", "GatherElements", "", ("d", "i"), ("y",), {"axis": 1},
                    onnx.helper.make_node("GatherElements", ["d", "i"], ["y"], axis=1))
    ctx = EvalContext(opset=18, opsets=[onnx.helper.make_opsetid("", 18)],
                      shape_of=lambda _: None, load_tensor=onnx.numpy_helper.to_array)
    data = np.broadcast_to(np.arange(16, dtype=np.int64).reshape(1, 16), (1, 16))
    index = np.array([[0, 3, 5, -1]], dtype=np.int64)
    (out,) = evaluate(node, [data, index], ctx)
    assert out.tolist() == [[0, 3, 5, 15]]
