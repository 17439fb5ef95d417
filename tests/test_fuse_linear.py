"""The Linear fusion (`frontend/fuse_linear.py`): MatMul with a 2-d weight plus a bias per
output column, or MatMul by a transposed 2-d weight, becomes one `Linear` kernel (one addmm;
one backward kernel for dX, dW and dB) where it computes the same function, and nowhere else.
Fused graphs compute and train like the unfused ones (loss, every gradient, every updated
weight against torch.autograd of the unfused graph); `fuse=False` keeps the graph as it is."""

from __future__ import annotations

from collections import Counter

import pytest

from autotm_py.frontend.fuse import fuse_graph
from autotm_py.frontend.zoo import build_graph
from autotm_py.ir import Role, TensorGraph
from autotm_py.ir.rules.fused import LINEAR, LINEAR_GRAD
from autotm_py.ir.training import derive_training
from tests.test_fuse import assert_same_outputs, ops
from tests.test_fuse_training import compare_with_unfused
from tests.test_training_models import Net
from tests.test_training_ops import compare_training

B, L, K, N = 2, 3, 4, 5


def linear_graph(*, x_rank: int = 3, bias: str = "last", order: str = "y-first",
                 weight: str = "plain", extra_reader: bool = False) -> TensorGraph:
    """x -> MatMul(x, W) [+ bias] -> Relu -> MatMul(., V): the first product is the pattern.

    bias: "none", "last" (N,), "ones" (1, 1, N), "rows" (L, N), "scalar" (1,), "grows" (2, 1, 1,
    N: broadcasting adds an axis); weight: "plain" (K, N), "transposed" (Transpose of (N, K)),
    "transposed-shared" (the Transpose also read elsewhere), "batched" (B, K, N)."""
    net = Net("linear")
    lead = (B, L) if x_rank == 3 else (B * L,)
    x = net.tensor((*lead, K), Role.INPUT, name="x")
    if weight == "batched":
        w = net.weight(B, K, N)
    elif weight.startswith("transposed"):
        w = net.op("Transpose", [net.weight(N, K)], (K, N), perm=(1, 0))
    else:
        w = net.weight(K, N)
    y = product = net.op("MatMul", [x, w], (*lead, N))
    out_shape = (*lead, N)
    if bias != "none":
        bshape = {"last": (N,), "ones": (1, 1, N), "rows": (L, N), "scalar": (1,),
                  "grows": (2, 1, 1, N)}[bias]
        b = net.weight(*bshape)
        if bias == "grows":
            out_shape = (2, *lead, N)
        y = net.op("Add", [y, b] if order == "y-first" else [b, y], out_shape)
    h = net.op("Relu", [y], out_shape)
    if extra_reader:  # the product is read twice: it must stay a tensor
        h = net.op("Add", [h, product], out_shape)
    if weight == "transposed-shared":
        h = net.op("Add", [h, net.op("ReduceSum", [w], (1, N), axes=(0,), keepdims=1)],
                   out_shape)
    return net.build(net.op("MatMul", [h, net.weight(N, 2)], (*out_shape[:-1], 2)))


FUSED = {
    "bias": {},
    "bias-first": {"order": "b-first"},
    "bias-leading-ones": {"bias": "ones"},
    "rows-2d": {"x_rank": 2},
    "transposed-weight-bias": {"weight": "transposed"},
    "transposed-weight-no-bias": {"weight": "transposed", "bias": "none"},
}


@pytest.mark.parametrize("variant", sorted(FUSED))
def test_linear_variants_fuse_and_compute_the_same(variant):
    spec = FUSED[variant]
    graph = linear_graph(**spec)
    fused = fuse_graph(graph)
    assert fused.meta["fusion"] == {"attention": 0, "gelu": 0, "linear": 1, "conv_relu": 0,
                                    "rms_norm": 0, "silu": 0, "rotary": 0, "heads_last": 0}
    (k,) = [k for k in fused.kernels if k.op_type == LINEAR]
    transposed = spec.get("weight") == "transposed"
    assert k.domain == "autotm" and k.attr("transB") == int(transposed)
    assert len(k.inputs) == (2 if spec.get("bias") == "none" else 3)
    gone = Counter({"MatMul": 1, "Add": int(spec.get("bias") != "none"),
                    "Transpose": int(transposed)})
    assert ops(fused) == ops(graph) - gone + Counter({LINEAR: 1})
    assert fused.tensors[k.inputs[1]].role == Role.WEIGHT  # W itself, even when transposed
    assert_same_outputs(graph, fused)


NEAR_MISSES = {
    "plain-matmul": {"bias": "none"},  # nothing to gain
    "bias-per-position": {"bias": "rows"},
    "bias-one-value": {"bias": "scalar"},
    "bias-grows-the-output": {"bias": "grows"},
    "product-read-twice": {"extra_reader": True},
    "batched-weight": {"weight": "batched"},
    "transpose-read-elsewhere": {"weight": "transposed-shared", "bias": "none"},
}


@pytest.mark.parametrize("variant", sorted(NEAR_MISSES))
def test_linear_near_misses_stay_unfused(variant):
    graph = linear_graph(**NEAR_MISSES[variant])
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["linear"] == 0
    assert fused.kernels == graph.kernels and fused.tensors == graph.tensors


def test_a_transpose_read_elsewhere_keeps_the_bias_fusion():
    graph = linear_graph(weight="transposed-shared")
    fused = fuse_graph(graph)
    (k,) = [k for k in fused.kernels if k.op_type == LINEAR]
    assert k.attr("transB") == 0 and len(k.inputs) == 3  # the bias only; W^T stays a tensor
    assert "Transpose" in ops(fused)
    assert_same_outputs(graph, fused)


@pytest.mark.parametrize("variant", sorted(FUSED))
def test_fused_linear_trains_like_unfused_autograd(variant):
    graph = linear_graph(**FUSED[variant])
    fused = fuse_graph(graph)
    compare_with_unfused(graph, fused)
    train = compare_training(fused, steps=2)  # our LinearGrad vs autograd of the fused forward
    (grad,) = [k for k in train.kernels if k.op_type == LINEAR_GRAD]
    (lin,) = [k for k in train.kernels if k.op_type == LINEAR]
    assert grad.inputs[1:] == lin.inputs[:2]  # saves X and W, as the MatMul did
    # x is an input: no dX; dW and (if there is one) dB
    assert grad.attr("output_mask") == (0, 1, int(len(lin.inputs) > 2))
    assert not any(k.op_type in ("SumToShape", "MatMulGradB") and k.name.startswith(lin.name)
                   for k in train.kernels)


def test_linear_backward_replaces_three_kernels_and_saves_no_product():
    graph = linear_graph()
    plain, fused = derive_training(graph), derive_training(fuse_graph(graph))
    grads = Counter(k.op_type for k in fused.kernels if k.domain == "autotm")
    assert grads[LINEAR_GRAD] == 1 and grads["SumToShape"] == 0
    # the Add goes; MatMulGradB and SumToShape become one LinearGrad (x is an input: no dX)
    assert len(fused.kernels) == len(plain.kernels) - 2
    assert fused.peak_live_bytes <= plain.peak_live_bytes


def test_zoo_bert_trains_like_unfused_with_linear_fused(monkeypatch):
    """BERT's own builder at reduced size: every projection and the tied, biased decoder
    fused; 3 SGD steps of every weight against autograd of the unfused graph."""
    from autotm_py.frontend.zoo import transformer as builders

    for key, value in {"layers": 1, "d": 16, "dff": 32, "heads": 2, "vocab": 31}.items():
        monkeypatch.setitem(builders.BERT, key, value)
    fused = build_graph("bert_base", batch=2, dims={"seq": 5})
    plain = build_graph("bert_base", batch=2, dims={"seq": 5}, fuse=False)
    assert fused.meta["fusion"]["linear"] == 8 and LINEAR not in ops(plain)
    compare_with_unfused(plain, fused)
