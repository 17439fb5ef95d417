"""The roofline cost model and batch scaling."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotm_py.ir import GraphBuilder, Role
from autotm_py.profiling.cache import ProfileEntry, profile_path, write_entries
from autotm_py.profiling.costmodel import (
    CPU_REFERENCE,
    FLOP_RULES,
    H100_SXM,
    OpShape,
    Roofline,
    flops_of,
    matrix_product_flops,
)
from autotm_py.profiling.fingerprint import Fingerprint
from autotm_py.profiling.profile import load_costs
from autotm_py.profiling.scaling import BatchIndex, batch_ratio, scale_time


def shape(op, ins, outs, domain="", **attrs):
    return OpShape(op, domain, attrs, tuple((s, "float32") for s in ins),
                   tuple((s, "float32") for s in outs))


def conv_graph(batch: int, name: str = "conv"):
    """x -> Conv(3x3, 16->32) -> Relu, plus the conv's backward kernels."""
    b = GraphBuilder(name)
    x = b.add_tensor("x", (batch, 16, 28, 28), "float32", Role.INPUT)
    w = b.add_tensor("w", (32, 16, 3, 3), "float32", Role.WEIGHT)
    y = b.add_tensor("y", (batch, 32, 28, 28), "float32", Role.ACTIVATION)
    r = b.add_tensor("r", (batch, 32, 28, 28), "float32", Role.OUTPUT)
    dw = b.add_tensor("dw", (32, 16, 3, 3), "float32", Role.WEIGHT_GRADIENT)
    w2 = b.add_tensor("w2", (32, 16, 3, 3), "float32", Role.WEIGHT)
    b.inputs.append(x)
    conv = {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1), "strides": (1, 1)}
    b.add_kernel("Conv", [x, w], [y], attrs=conv)
    b.add_kernel("Relu", [y], [r])
    b.add_kernel("ConvGradFilter", [r, x], [dw], domain="autotm",
                 attrs={**conv, "shape": (32, 16, 3, 3)})
    b.add_kernel("SGDUpdate", [w, dw], [w2], domain="autotm", attrs={"lr": 0.01})
    b.outputs.append(r)
    b.carried.append((w, w2))
    b.meta["batch"] = batch
    return b.build()


def test_conv_and_its_gradients_have_the_same_flops():
    x, w, y = (8, 16, 28, 28), (32, 16, 3, 3), (8, 32, 28, 28)
    forward = flops_of(shape("Conv", [x, w], [y]))
    assert forward == 2 * 8 * 32 * 28 * 28 * 16 * 9
    assert flops_of(shape("ConvGradData", [y, w], [x], "autotm")) == forward
    assert flops_of(shape("ConvGradFilter", [y, x], [w], "autotm")) == forward
    # one kernel for both gradients (and the bias): their sum
    assert flops_of(shape("ConvGrad", [y, x, w], [x, w], "autotm")) == 2 * forward
    assert flops_of(shape("ConvGrad", [y, x, w], [x, w, (32,)], "autotm")) == \
        2 * forward + 8 * 32 * 28 * 28
    assert flops_of(shape("ConvTransposeGrad", [x, y, (32, 16, 3, 3)], [y, (32, 16, 3, 3)],
                          "autotm")) == 2 * flops_of(shape("ConvTranspose", [y, (32, 16, 3, 3)],
                                                           [x]))
    grouped = flops_of(shape("Conv", [x, (32, 4, 3, 3)], [y], group=4))
    assert grouped == forward / 4


def test_fused_linear_flops():
    x, w, y = (4, 16, 32), (32, 64), (4, 16, 64)
    product = 2 * 4 * 16 * 32 * 64
    assert flops_of(shape("Linear", [x, w], [y], "autotm")) == product
    assert flops_of(shape("Linear", [x, (64, 32), (64,)], [y], "autotm", transB=1)) == \
        product + 4 * 16 * 64
    grad = shape("LinearGrad", [y, x, w], [x, w, (64,)], "autotm", output_mask=(1, 1, 1))
    assert flops_of(grad) == 2 * product + 4 * 16 * 64
    weights_only = shape("LinearGrad", [y, x, w], [w], "autotm", output_mask=(0, 1, 0))
    assert flops_of(weights_only) == product


def test_gemm_and_matmul_flops():
    assert flops_of(shape("Gemm", [(64, 128), (128, 10)], [(64, 10)])) == 2 * 64 * 128 * 10
    assert flops_of(shape("Gemm", [(128, 64), (10, 128)], [(64, 10)], transA=1,
                          transB=1)) == 2 * 64 * 128 * 10
    assert flops_of(shape("MatMul", [(4, 8, 16, 32), (4, 8, 32, 16)],
                          [(4, 8, 16, 16)])) == 2 * 32 * 16 * 16 * 32
    # weight gradient of a batched product against a broadcast weight: sums over the batch
    grad_b = shape("MatMulGradB", [(6, 10, 20), (6, 10, 30)], [(30, 20)], "autotm")
    assert flops_of(grad_b) == pytest.approx(2 * 6 * 10 * 20 * 30)


@given(st.integers(1, 5), st.integers(1, 40), st.integers(1, 40), st.integers(1, 40),
       st.permutations([0, 1, 2]))
def test_matrix_product_flops_is_role_blind(batch, m, n, k, order):
    shapes = [(batch, m, k), (batch, k, n), (batch, m, n)]
    a, b, y = (shapes[i] for i in order)
    assert matrix_product_flops(a, b, y) == pytest.approx(2 * batch * m * n * k)


def test_every_training_op_has_a_flop_rule():
    from autotm_py.ir.rules import TRAINING_OPS

    no_arithmetic = {"ReshapeGrad", "TransposeGrad", "ConcatGrad", "SplitGrad", "SliceGrad",
                     "PadGrad", "TriluGrad"}  # pure data movement: bytes only, on purpose
    missing = set(TRAINING_OPS) - set(FLOP_RULES) - no_arithmetic
    assert not missing


def test_roofline_picks_the_binding_limit_and_adds_launch():
    big_gemm = shape("Gemm", [(4096, 4096), (4096, 4096)], [(4096, 4096)])
    relu = shape("Relu", [(1 << 24,)], [(1 << 24,)])
    r = H100_SXM
    compute = flops_of(big_gemm) / (r.peak_flops["float32"] * r.compute_eff)
    assert r.time_s(big_gemm) == pytest.approx(r.launch_s + compute)
    memory = relu.bytes / (r.mem_bw * r.memory_eff)
    assert r.time_s(relu) == pytest.approx(r.launch_s + memory)
    unknown = shape("SomethingNew", [(1000,)], [(1000,)], "custom")
    assert flops_of(unknown) == 0 and r.time_s(unknown) > r.launch_s  # bytes only
    conv = shape("Conv", [(8, 64, 56, 56), (64, 64, 3, 3)], [(8, 64, 56, 56)])
    assert r.peak(conv.dtype, conv=True) == r.peak_flops["tf32"]  # cuDNN's TF32 default
    assert Roofline.from_dict(r.to_dict()) == r
    assert CPU_REFERENCE.time_s(conv) > r.time_s(conv)


def test_signature_round_trip():
    g = conv_graph(2)
    for k in g.kernels:
        assert OpShape.of_signature(k.signature) == OpShape.of_kernel(g, k)


def test_batch_ratio_requires_one_common_ratio_and_equal_structure():
    small = OpShape.of_kernel(conv_graph(2), conv_graph(2).kernels[2])
    big = OpShape.of_kernel(conv_graph(8), conv_graph(8).kernels[2])
    assert batch_ratio(big, small) == Fraction(4)  # includes the scalable 'shape' attr
    target = shape("Add", [(8, 10), (8, 10)], [(8, 10)])
    assert batch_ratio(target, shape("Add", [(2, 10), (4, 10)], [(2, 10)])) is None
    assert batch_ratio(target, shape("Add", [(2, 10), (2, 10)], [(2, 10)])) == 4
    assert batch_ratio(target, target) is None  # identical: not a scaling
    k3 = shape("Conv", [(6, 64, 8, 8), (64, 64, 3, 3)], [(6, 64, 8, 8)], kernel_shape=(3, 3))
    k1 = shape("Conv", [(2, 64, 8, 8), (64, 64, 1, 1)], [(2, 64, 8, 8)], kernel_shape=(1, 1))
    index = BatchIndex({_sig(k1): {"FFF": ProfileEntry(1.0, 1.0, 1.0, 3)}})
    assert index.find(k3, "FFF", CPU_REFERENCE) is None  # kernel_shape is structural


def _sig(s: OpShape) -> str:
    from autotm_py.ir.graph import freeze_attrs, kernel_signature

    return kernel_signature(s.op, s.domain, freeze_attrs(s.attrs), s.inputs, s.outputs)


def test_scale_time_keeps_the_launch_cost_fixed():
    assert scale_time(10e-6, 4.0, 2e-6) == pytest.approx(2e-6 + 8e-6 * 4)
    assert scale_time(1e-6, 4.0, 2e-6) == pytest.approx(1e-6)  # all launch: unchanged


def test_load_costs_scales_from_another_batch(tmp_path):
    fp = Fingerprint("cpu", "Test CPU", "2.0", threads=2)
    small = conv_graph(2)
    entries = {k.signature: {"F" * len(k.io): ProfileEntry(1e-3, 8e-4, 2e-3, 5, batch=2)}
               for k in small.kernels}
    write_entries(profile_path(tmp_path, fp), fp, entries, roofline=CPU_REFERENCE.to_dict())
    big = conv_graph(32, "conv32")
    costs = load_costs(big, device="cpu", profiles_dir=tmp_path / "none", shipped_dir=tmp_path)
    assert costs.scaled == (True, True, True, False)  # the SGD update is batch-free: exact
    assert not any(costs.estimated)
    assert costs.times_s[3] == 1e-3
    launch = CPU_REFERENCE.launch_s
    # the conv and its filter gradient are compute-bound: FLOPs grow 16x
    assert costs.times_s[0] == pytest.approx(launch + (1e-3 - launch) * 16, rel=1e-6)
    assert costs.times_s[2] == pytest.approx(launch + (1e-3 - launch) * 16, rel=1e-6)
    # Relu is memory-bound: its bytes grow 16x as well (all activations)
    assert costs.times_s[1] == pytest.approx(launch + (1e-3 - launch) * 16, rel=1e-6)
    assert costs.p10_s[0] < costs.times_s[0] < costs.p90_s[0]
    assert costs.summary["scaled"] == 3 and costs.n_scaled == 3


def test_batch_mismatch_with_known_batches_is_not_scaled(tmp_path):
    fp = Fingerprint("cpu", "Test CPU", "2.0", threads=2)
    small = conv_graph(2)
    # recorded as measured at batch 4 although its shapes say 2: the ratio disagrees
    entries = {k.signature: {"F" * len(k.io): ProfileEntry(1e-3, 1e-3, 1e-3, 5, batch=4)}
               for k in small.kernels}
    write_entries(profile_path(tmp_path, fp), fp, entries)
    costs = load_costs(conv_graph(8), device="cpu", profiles_dir=tmp_path / "none",
                       shipped_dir=tmp_path)
    assert costs.estimated == (True, True, True, False)
    assert math.isclose(costs.times_s[3], 1e-3)


def test_the_same_layer_wins_over_one_whose_spatial_size_scales_alike():
    """VGG halves the image size where batch doubles: (4,64,224,224) matches both the same
    layer at batch 2 and the 112x112 layer at batch 2 with one ratio, 2."""
    w = (64, 64, 3, 3)
    attrs = {"kernel_shape": (3, 3)}
    target = shape("Conv", [(4, 64, 224, 224), w], [(4, 64, 224, 224)], **attrs)
    twin = shape("Conv", [(2, 64, 224, 224), w], [(2, 64, 224, 224)], **attrs)
    smaller = shape("Conv", [(2, 64, 112, 112), w], [(2, 64, 112, 112)], **attrs)
    index = BatchIndex({_sig(smaller): {"FFF": ProfileEntry(1.0, 1.0, 1.0, 3, batch=2)},
                        _sig(twin): {"FFF": ProfileEntry(2.0, 2.0, 2.0, 3, batch=2)}})
    hit = index.find(target, "FFF", CPU_REFERENCE, batch=4)
    assert hit.source_signature == _sig(twin)
    assert hit.median_s == pytest.approx(2.0 * 2, rel=1e-3)  # FLOPs double with the batch


def test_a_kernel_that_fits_the_cache_streams_at_cache_bandwidth():
    r = Roofline("r", {"float32": 1e15}, mem_bw=1e10, launch_s=0.0, compute_eff=1.0,
                 memory_eff=1.0, cache_bw=1e11, cache_bytes=1 << 20)
    small = shape("Relu", [(1 << 16,)], [(1 << 16,)])  # 512 KiB of traffic
    large = shape("Relu", [(1 << 20,)], [(1 << 20,)])  # 8 MiB
    assert r.time_s(small) == pytest.approx(small.bytes / 1e11)
    assert r.time_s(large) == pytest.approx(large.bytes / 1e10)
    assert Roofline.from_dict(r.to_dict()) == r


def test_validate_reports_roofline_accuracy(tmp_path):
    from autotm_py.profiling.cache import read_profile_file
    from autotm_py.profiling.validate import roofline_accuracy

    fp = Fingerprint("cpu", "Test CPU", "2.0", threads=1)
    g = conv_graph(2)
    entries = {k.signature: {"F" * len(k.io): ProfileEntry(
        2 * CPU_REFERENCE.time_s(OpShape.of_kernel(g, k)), 0, 0, 3)} for k in g.kernels}
    path = profile_path(tmp_path, fp)
    write_entries(path, fp, entries, roofline=CPU_REFERENCE.to_dict())
    result = roofline_accuracy(next(iter(read_profile_file(path).values())))
    assert result["n"] == 4 and result["median"] == pytest.approx(0.5)
    assert result["sum_ratio"] == pytest.approx(0.5)


def test_a_scaled_workspace_follows_the_operands_bytes_not_the_batch_ratio():
    """A small layer matched to one whose every dim is 8x larger (one common ratio, 1/8):
    its time scales by the work, its workspace by the operands' bytes (8^4 fewer), not by the
    ratio alone (the H200's tiny test CNN got 12 MiB of MaxPoolGrad workspace that way, and no
    feasible budget below its peak). The same layer at another batch keeps the batch ratio
    (`scaling.workspace_ratio`: its weights, which do not scale, would make the bytes' ratio
    nearer 1)."""
    attrs = {"kernel_shape": (2, 2), "strides": (2, 2)}
    big = shape("MaxPoolGrad", [(32, 64, 64, 64), (32, 64, 128, 128)], [(32, 64, 128, 128)],
                "autotm", **attrs)
    tiny = shape("MaxPoolGrad", [(4, 8, 8, 8), (4, 8, 16, 16)], [(4, 8, 16, 16)], "autotm",
                 **attrs)
    half = shape("MaxPoolGrad", [(16, 64, 64, 64), (16, 64, 128, 128)], [(16, 64, 128, 128)],
                 "autotm", **attrs)
    index = BatchIndex({_sig(big): {"FFF": ProfileEntry(1e-3, 1e-3, 1e-3, 3, batch=32,
                                                        workspace_bytes=100 << 20)}})
    hit = index.find(tiny, "FFF", CPU_REFERENCE, batch=4)
    assert hit.ratio == Fraction(1, 8)
    assert hit.workspace_bytes == (100 << 20) // 8 ** 4
    assert index.find(half, "FFF", CPU_REFERENCE, batch=16).workspace_bytes == 50 << 20
    # the other way (from the tiny entry up to the large layer): the bytes' ratio again
    up = BatchIndex({_sig(tiny): {"FFF": ProfileEntry(1e-5, 1e-5, 1e-5, 3, batch=4,
                                                      workspace_bytes=1 << 10)}})
    assert up.find(big, "FFF", CPU_REFERENCE, batch=32).workspace_bytes == (1 << 10) * 8 ** 4
