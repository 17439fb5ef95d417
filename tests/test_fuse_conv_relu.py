"""The convolution + ReLU fusion (`frontend/fuse_conv_relu.py`): a Conv whose output only a
Relu reads becomes one `ConvRelu` kernel (on CUDA one cuDNN call with the bias and the ReLU in
its epilogue), and nothing else does. Fused graphs compute and train like the unfused ones: the
forward and three SGD steps bit for bit against our kernels on the unfused graph, and within
float32 noise against torch.autograd of the unfused graph. Profiles measured before the fusion
price ConvRelu as the Conv and the Relu it replaced. (The cuDNN path on CUDA: test_fuse_gpu.)"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from autotm_py import api
from autotm_py.frontend.fuse import fuse_graph
from autotm_py.ir import Role, TensorGraph
from autotm_py.ir.layout import to_channels_last
from autotm_py.ir.rules.fused import CONV_RELU
from autotm_py.ir.training import derive_training
from autotm_py.profiling.sources import kernel_parts
from autotm_py.runtime.reference import init_values, train_steps
from tests.test_fuse import assert_same_outputs, ops
from tests.test_fuse_training import _leaf_values, compare_with_unfused
from tests.test_training_models import Net

N, HW = 2, 6
ROOT = Path(__file__).resolve().parents[1]


def _conv(net: Net, x: int, cin: int, cout: int, *, bias: bool = True,
          pads: tuple[int, ...] = (1, 1, 1, 1), group: int = 1) -> int:
    inputs = [x, net.weight(cout, cin // group, 3, 3)] + ([net.weight(cout)] if bias else [])
    out_hw = HW + (pads[0] + pads[2] - 2, pads[1] + pads[3] - 2)[0]
    return net.op("Conv", inputs, (N, cout, out_hw, out_hw), kernel_shape=(3, 3), pads=pads,
                  strides=(1, 1), dilations=(1, 1), group=group)


def conv_relu_graph(*, bias: bool = True, pads: tuple[int, ...] = (1, 1, 1, 1),
                    group: int = 1, read_twice: bool = False, norm: bool = False) -> TensorGraph:
    """x -> Conv -> Relu -> Conv -> [BatchNorm ->] Relu [+ the second Conv's output] -> pool ->
    MatMul: both convolutions are the pattern unless `read_twice` or `norm`."""
    net = Net("convrelu")
    x = net.tensor((N, 4, HW, HW), Role.INPUT, name="x")
    h = net.op("Relu", [_conv(net, x, 4, 4, bias=bias, pads=pads, group=group)], (N, 4, HW, HW))
    z = _conv(net, h, 4, 6, bias=bias, group=group if group == 1 else 2)
    if norm:
        z = net.op("BatchNormalization", [z] + [net.weight(6) for _ in range(4)], (N, 6, HW, HW),
                   epsilon=1e-5, momentum=0.9, training_mode=0)
    y = net.op("Relu", [z], (N, 6, HW, HW))
    if read_twice:
        y = net.op("Add", [y, z], (N, 6, HW, HW))
    pooled = net.op("GlobalAveragePool", [y], (N, 6, 1, 1))
    flat = net.op("Flatten", [pooled], (N, 6), axis=1)
    return net.build(net.op("MatMul", [flat, net.weight(6, 3)], (N, 3)))


FUSED = {"bias": {}, "no-bias": {"bias": False}, "asymmetric-pads": {"pads": (1, 0, 1, 2)},
         "grouped": {"group": 2}}


@pytest.mark.parametrize("variant", sorted(FUSED))
def test_conv_relu_variants_fuse_and_compute_the_same(variant):
    graph = conv_relu_graph(**FUSED[variant])
    fused = fuse_graph(graph)
    assert fused.meta["fusion"] == {"attention": 0, "gelu": 0, "linear": 0, "conv_relu": 2,
                                    "rms_norm": 0, "silu": 0, "rotary": 0, "heads_last": 0}
    assert ops(fused) == ops(graph) - Counter({"Conv": 2, "Relu": 2}) + Counter({CONV_RELU: 2})
    for k in (k for k in fused.kernels if k.op_type == CONV_RELU):
        assert k.domain == "autotm" and len(k.inputs) == 2 + FUSED[variant].get("bias", True)
        assert fused.tensors[k.inputs[1]].role == Role.WEIGHT
    assert_same_outputs(graph, fused, rtol=0.0)
    compare_with_unfused(graph, fused)


@pytest.mark.parametrize("variant", ["read-twice", "normalized"])
def test_a_conv_whose_output_is_read_elsewhere_stays_unfused(variant):
    graph = conv_relu_graph(read_twice=variant == "read-twice", norm=variant == "normalized")
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["conv_relu"] == 1  # the first pair only
    assert ops(fused)["Conv"] == 1 and ops(fused)["Relu"] == 1
    assert_same_outputs(graph, fused, rtol=0.0)


@pytest.mark.parametrize("channels_last", [False, True])
def test_fused_training_is_bitwise_the_unfused_one(channels_last):
    """Three SGD steps of our kernels on both training graphs: loss, gradients and updated
    weights equal bit for bit (on the CPU ConvRelu is the convolution, then the ReLU in
    place); the backward is the unfused pair's ReluGrad and ConvGrad, minus one tensor."""
    graph = conv_relu_graph()
    plain, fused = derive_training(graph), derive_training(fuse_graph(graph))
    if channels_last:
        plain, fused = to_channels_last(plain), to_channels_last(fused)
        (k, *_) = [k for k in fused.kernels if k.op_type == CONV_RELU]
        assert k.channels_last == (0,) and fused.tensors[k.outputs[0]].channels_last
    values = init_values(plain)
    grads = dict(fused.meta["training"]["weight_grads"])
    ref = train_steps(plain, 3, values=values, keep=[g for _, g in
                                                     plain.meta["training"]["weight_grads"]])
    ours = train_steps(fused, 3, values=_leaf_values(plain, values, fused),
                       keep=list(grads.values()))
    names = [plain.name_of(plain.meta["training"]["loss"])]
    for w, g in plain.meta["training"]["weight_grads"]:
        names += [plain.name_of(g), f"{plain.name_of(w)}::next"]
    for want, got in zip(ref, ours, strict=True):
        for name in names:
            assert torch.equal(want[plain.by_name(name).id], got[fused.by_name(name).id]), name
    assert Counter(k.op_type for k in fused.kernels) == \
        Counter(k.op_type for k in plain.kernels) - Counter({"Conv": 2, "Relu": 2}) + \
        Counter({CONV_RELU: 2})
    assert len(fused.tensors) == len(plain.tensors) - 2  # the pre-activations
    assert fused.peak_live_bytes <= plain.peak_live_bytes


@pytest.mark.parametrize(("gpu", "profile_file"), [(None, "h100-80gb-hbm3.json"),
                                                   ("h200", "h200.json")])
def test_profiles_before_the_fusion_price_it_as_the_pair(gpu, profile_file):
    """VGG19 b64 row-major on the shipped profiles, measured before the fusion (neither has a
    row-major ConvRelu entry): every ConvRelu priced at the sum of its Conv's and its Relu's
    entries measured alone, none estimated. Channels-last, the H200's own in-context entries
    of the fused kernels (2026-11-29 night) serve them instead."""
    (profile,) = json.loads((ROOT / "profiles" / profile_file).read_text())["sets"].values()
    fused = api.load_model("vgg19", batch=64, training=True)
    costs = api.load_costs(fused, device="cuda", gpu=gpu)
    assert fused.meta["fusion"]["conv_relu"] == 16
    assert costs.summary["estimated"] == 0 and costs.summary["scaled"] == 16
    for k in (k for k in fused.kernels if k.op_type == CONV_RELU):
        assert k.signature not in profile["entries"]
        (conv, conv_at), (relu, relu_at) = kernel_parts(fused, k)
        assert json.loads(conv)["op"] == "Conv" and json.loads(relu)["op"] == "Relu"
        pair = profile["entries"][conv][conv_at]["median_s"] + \
            profile["entries"][relu][relu_at]["median_s"]
        assert costs.times_s[k.id] == pytest.approx(pair, rel=1e-12)
    if gpu == "h200":
        last = api.load_model("vgg19", batch=64, training=True, channels_last=True)
        assert api.load_costs(last, device="cuda", gpu=gpu).summary["scaled"] == 0
        for k in (k for k in last.kernels if k.op_type == CONV_RELU):
            (conv, _), _ = kernel_parts(last, k)
            assert json.loads(conv)["layout"] == "channels-last"
            assert k.signature in profile["entries"]
