"""Direct outputs (`kernels/into.py`): written into given buffers, bitwise what `run_kernel`
computes, for every kernel of the test models whose op has a direct implementation; and the
planner's torch-free list of those ops (`memory.scratch.DIRECT_OPS`) matches them."""

from __future__ import annotations

import collections

import pytest
import torch

from autotm_py.frontend.fuse import fuse_graph
from autotm_py.ir.training import derive_training
from autotm_py.kernels import INTO, run_kernel, run_kernel_into
from autotm_py.kernels.util import TORCH_DTYPES
from autotm_py.memory.scratch import DIRECT_OPS, writes_in_place
from autotm_py.runtime.reference import init_values, run_graph
from tests.test_training_models import small_cnn, tiny_decoder


def test_the_planner_knows_every_direct_kernel():
    assert set(INTO) == set(DIRECT_OPS)


def _every_value(graph):
    values = init_values(graph, seed=5)
    return {**values, **run_graph(graph, values, keep=range(len(graph.tensors)))}


def _kernels_and_inputs(graph, ops):
    """Each kernel of `graph` whose op is one of `ops`, with its inputs' values."""
    values = _every_value(graph)
    for kernel in graph.kernels:
        if kernel.op_type in ops:
            yield kernel, [values[t] for t in kernel.inputs]


def _fused(make):
    def build():
        return fuse_graph(make())

    build.__name__ = f"fused_{make.__name__}"
    return build


fused_cnn, fused_decoder = _fused(small_cnn), _fused(tiny_decoder)


def corpus_llama():
    """The corpus Llama, fused: rotary embeddings in the heads-last layout (`fuse_heads`)."""
    from autotm_py import api
    from tests.test_fuse_llama import LLAMA

    return api.import_onnx(LLAMA)


@pytest.mark.parametrize("make", [small_cnn, tiny_decoder, fused_cnn, fused_decoder,
                                  corpus_llama], ids=lambda m: m.__name__)
def test_direct_outputs_are_bitwise_the_kernels(make):
    graph = derive_training(make(), optimizer="sgd")
    values = _every_value(graph)
    written = collections.Counter()
    for kernel in graph.kernels:
        if kernel.op_type not in INTO:
            continue
        args = [values[t] for t in kernel.inputs]
        want = run_kernel(kernel, args)
        outs = [torch.full(graph.tensors[t].shape, float("nan")).to(
            TORCH_DTYPES[graph.tensors[t].dtype]) for t in kernel.outputs]
        addresses = [o.data_ptr() for o in outs]
        if not run_kernel_into(kernel, args, outs):
            assert not writes_in_place(graph, kernel) or kernel.op_type == "Conv", kernel.name
            continue
        assert [o.data_ptr() for o in outs] == addresses, kernel.name
        for got, expected in zip(outs, want, strict=True):
            assert torch.equal(got, expected), f"{kernel.name} ({kernel.op_type})"
        written[kernel.op_type] += 1
    must = {"Add", "Relu", "ReluGrad", "BatchNormalization", "GradAccumulate", "SGDUpdate",
            "SoftmaxCrossEntropy", "SoftmaxCrossEntropyGrad", "Concat", "AveragePool"} \
        if make in (small_cnn, fused_cnn) \
        else {"Add", "MatMul", "MatMulGradA", "MatMulGradB", "SGDUpdate",
              "SoftmaxCrossEntropy", "SoftmaxCrossEntropyGrad"}
    if make is corpus_llama:  # (B, L, H, E) operands, tables read with two axes swapped
        must |= {"RotaryEmbedding", "RotaryEmbeddingGrad"}
    if make is fused_decoder:  # the MLP's products (with a bias) and the tied embedding's
        must |= {"Linear", "LinearGrad"}
        transposed = [k for k in graph.kernels if k.op_type == "Linear" and k.attr("transB", 0)]
        assert transposed and written["Linear"] == 2, written
    assert must <= set(written), written


@pytest.mark.parametrize("make", [small_cnn, fused_decoder], ids=lambda m: m.__name__)
def test_bf16_casts_are_written_into_their_slots(make):
    """A bf16 graph's casts (weights to bf16, gradients back to fp32, activations between
    autocast's lists) convert straight into the slot, bitwise `.to`, so the planner counts no
    copy after them (BERT-base's 398 casts were priced as copies no replay ran)."""
    from autotm_py.ir.precision import with_precision
    from autotm_py.memory.scratch import allocated_outputs

    graph = derive_training(with_precision(make(), "bf16"), optimizer="sgd")
    casts = collections.Counter()
    for kernel, args in _kernels_and_inputs(graph, ("Cast", "CastGrad")):
        (want,) = run_kernel(kernel, args)
        out = torch.full(want.shape, float("nan"), dtype=want.dtype)
        assert run_kernel_into(kernel, args, [out]), kernel.name
        assert torch.equal(out, want) and out.dtype != args[0].dtype, kernel.name
        assert writes_in_place(graph, kernel) and not allocated_outputs(graph, kernel)
        casts[kernel.op_type] += 1
    assert casts["Cast"] > 0 and casts["CastGrad"] > 0, casts


def test_the_llama_gated_mlp_is_written_in_place():
    """The corpus Llama's SwiGLU (Silu, its gradient, the gate and up products' gradients) is
    written into its slots, bitwise; a MulGrad that sums a broadcast operand back is copied."""
    from pathlib import Path

    from autotm_py.frontend.onnx import import_onnx
    from autotm_py.ir import GraphBuilder, Role

    path = Path(__file__).resolve().parent.parent / "models" / "corpus" / "llama_gqa.onnx"
    graph = derive_training(import_onnx(path), optimizer="sgd")
    values = _every_value(graph)
    written = collections.Counter()
    for kernel in graph.kernels:
        if kernel.op_type not in ("Silu", "SiluGrad", "MulGrad"):
            continue
        args = [values[t] for t in kernel.inputs]
        outs = [torch.full(graph.tensors[t].shape, float("nan")) for t in kernel.outputs]
        assert run_kernel_into(kernel, args, outs) == writes_in_place(graph, kernel)
        if writes_in_place(graph, kernel):
            assert torch.equal(outs[0], run_kernel(kernel, args)[0]), kernel.name
            written[kernel.op_type] += 1
    assert written["Silu"] == written["SiluGrad"] >= 1 and written["MulGrad"] >= 2, written
    b = GraphBuilder("broadcast")
    dy = b.add_tensor("dy", (4, 3), "float32", Role.INPUT)
    row = b.add_tensor("row", (3,), "float32", Role.INPUT)
    out = b.add_tensor("drow", (3,), "float32", Role.OUTPUT)
    b.add_kernel("MulGrad", [dy, row], [out], domain="autotm", attrs={"shape": (3,)})
    b.inputs, b.outputs = [dy, row], [out]
    g = b.build()
    assert not writes_in_place(g, g.kernels[0])
    assert not run_kernel_into(g.kernels[0], [torch.ones(4, 3), torch.ones(3)],
                               [torch.empty(3)])


@pytest.mark.parametrize("bias", ["none", "last"])
@pytest.mark.parametrize("weight", ["plain", "transposed"])
def test_linear_forms_are_bitwise_the_kernels(bias, weight):
    """Every Linear and LinearGrad form (bias or none, plain or transposed weight, each
    gradient mask the derivation emits) writes into its slots what the kernel returns."""
    from tests.test_fuse_linear import linear_graph

    graph = derive_training(fuse_graph(linear_graph(bias=bias, weight=weight)),
                            optimizer="sgd")
    seen = collections.Counter()
    for kernel, args in _kernels_and_inputs(graph, ("Linear", "LinearGrad")):
        outs = [torch.full(graph.tensors[t].shape, float("nan")) for t in kernel.outputs]
        assert run_kernel_into(kernel, args, outs), kernel.name
        for got, expected in zip(outs, run_kernel(kernel, args), strict=True):
            assert torch.equal(got, expected), kernel.name
        seen[kernel.op_type] += 1
    fused = not (bias == "none" and weight == "plain")  # a bare product stays a MatMul
    assert (seen["Linear"] >= 1 and seen["LinearGrad"] >= 1) == fused, seen


def test_new_native_kernels_are_copied_and_their_scratch_counted():
    """Kernels with no direct form (ConvGrad: aten's out= variant allocates; the batch-norm
    gradient, on either pair) run as usual and are copied into their slots, so the planner
    counts their outputs as scratch; a training batch norm is written in place on either
    pair (cuDNN's `cudnn_batch_norm.out` is a real out= kernel) and counts none."""
    from autotm_py.memory.scratch import allocated_outputs

    graph = derive_training(fuse_graph(small_cnn()), optimizer="sgd")
    for op in ("ConvGrad", "BatchNormGrad"):
        kernel = next(k for k in graph.kernels if k.op_type == op)
        assert not writes_in_place(graph, kernel), op
        assert set(allocated_outputs(graph, kernel)) == set(kernel.outputs), op
    batch_norm = next(k for k in graph.kernels if k.op_type == "BatchNormalization")
    assert writes_in_place(graph, batch_norm)  # the running statistics (carried) go through
    assert batch_norm.outputs[0] not in allocated_outputs(graph, batch_norm)  # scratch
    assert "ConvGrad" not in INTO


def test_relu_in_place_keeps_nan_and_signed_zero():
    from autotm_py.ir import GraphBuilder, Role

    b = GraphBuilder("relu")
    x = b.add_tensor("x", (6,), "float32", Role.INPUT)
    y = b.add_tensor("y", (6,), "float32", Role.ACTIVATION)
    b.inputs.append(x)
    b.add_kernel("Relu", [x], [y])
    b.outputs.append(y)
    graph = b.build()
    arg = torch.tensor([float("nan"), -0.0, 0.0, -1.0, float("inf"), float("-inf")])
    out = torch.empty(6)
    assert run_kernel_into(graph.kernels[0], [arg], [out])
    want = run_kernel(graph.kernels[0], [arg])[0]
    assert torch.equal(out.isnan(), want.isnan())
    same = ~want.isnan()
    assert torch.equal(out[same], want[same])
    assert torch.equal(torch.signbit(out[same]), torch.signbit(want[same]))


def test_conv_writes_in_place_only_on_cuda():
    graph = derive_training(small_cnn(), optimizer="sgd")
    values = init_values(graph, seed=1)
    conv = next(k for k in graph.kernels if k.op_type == "Conv")
    assert writes_in_place(graph, conv)  # what the planner assumes for the GPU
    args = [values[t] if t in values else torch.randn(graph.tensors[t].shape)
            for t in conv.inputs]
    assert not run_kernel_into(conv, args, [torch.empty(graph.tensors[conv.outputs[0]].shape)])
