"""Channels-last storage of convolution images (`ir.layout`, `--channels-last`)."""

from __future__ import annotations

import json

import pytest
import torch

from autotm_py import api
from autotm_py.errors import GraphError
from autotm_py.ir.layout import CHANNELS_LAST, channels_last_tensors, to_channels_last
from autotm_py.ir.training import derive_training
from autotm_py.kernels import run_kernel
from autotm_py.kernels.util import typed_view
from autotm_py.options import ModelOptions
from autotm_py.profiling.costmodel import OpShape
from autotm_py.profiling.scaling import skeleton
from autotm_py.profiling.torch_profiler import make_inputs
from autotm_py.runtime.reference import init_values, train_steps
from tests.test_training_models import small_cnn, tiny_decoder

STEPS = 3


def _cnn(channels_last: bool = True):
    graph = derive_training(small_cnn(), optimizer="sgd")
    return to_channels_last(graph) if channels_last else graph


def test_the_images_of_a_cnn_are_channels_last_and_nothing_else():
    graph = _cnn()
    chosen = {t.id for t in graph.tensors if t.channels_last}
    assert chosen == channels_last_tensors(graph)
    # every rank-4 tensor of the small CNN meets a convolution through layout-free kernels
    assert chosen == {t.id for t in graph.tensors if len(t.shape) == 4}
    assert all(len(graph.tensors[t].shape) == 4 for t in chosen)
    flatten = next(k for k in graph.kernels if k.op_type == "Flatten")
    assert graph.tensors[flatten.inputs[0]].channels_last
    assert not graph.tensors[flatten.outputs[0]].channels_last  # rank 2


def test_a_bf16_cnn_keeps_its_fp32_images_and_masters_channels_last_across_the_casts():
    """The casts keep the layout, as autocast's do: the fp32 batch, master weights and their
    gradients are channels-last beside their bf16 copies, so no cast transposes and a
    channels-last batch is copied in as it is (before, the fp32 batch was row-major)."""
    from autotm_py.ir.precision import with_precision

    graph = to_channels_last(derive_training(with_precision(small_cnn(), "bf16"),
                                             optimizer="sgd"))
    casts = [k for k in graph.kernels if k.op_type in ("Cast", "CastGrad")
             and len(graph.tensors[k.inputs[0]].shape) == 4]
    assert casts
    for k in casts:
        ends = (graph.tensors[k.inputs[0]], graph.tensors[k.outputs[0]])
        assert ends[0].dtype != ends[1].dtype
        assert ends[0].channels_last and ends[1].channels_last, k.name
    image = graph.tensors[graph.inputs[0]]
    assert image.dtype == "float32" and image.channels_last


def test_a_transformer_is_left_alone():
    graph = derive_training(tiny_decoder(), optimizer="sgd")
    assert any(len(t.shape) == 4 for t in graph.tensors)  # its attention tensors
    assert to_channels_last(graph) is graph


def test_signatures_and_hash_say_the_layout():
    row_major, converted = _cnn(False), _cnn()
    assert converted.model_hash != row_major.model_hash
    assert converted.meta["layout"] == CHANNELS_LAST
    for before, after in zip(row_major.kernels, converted.kernels, strict=True):
        touches = any(converted.tensors[t].channels_last for t in after.io)
        assert (before.signature != after.signature) == touches
        if touches:
            assert json.loads(after.signature) == {**json.loads(before.signature),
                                                   "layout": CHANNELS_LAST}
    # profiles scaled from another batch never cross layouts
    conv = next(k for k in converted.kernels if k.op_type == "Conv")
    assert skeleton(OpShape.of_kernel(converted, conv)) != \
        skeleton(OpShape.of_kernel(row_major, row_major.kernels[conv.id]))
    assert OpShape.of_signature(conv.signature).layout == CHANNELS_LAST


def test_training_is_derived_before_the_conversion():
    forward = to_channels_last(small_cnn())
    with pytest.raises(GraphError, match="channels-last"):
        derive_training(forward, optimizer="sgd")


def test_load_model_and_the_plan_header_record_it():
    graph = api.load_model("resnet50", batch=1, training=True, channels_last=True)
    assert ModelOptions.of_graph(graph).channels_last
    plain = api.load_model("resnet50", batch=1, training=True)
    assert not ModelOptions.of_graph(plain).channels_last
    assert ModelOptions.of_graph(plain).differences(ModelOptions.of_graph(graph)) == \
        ["channels_last True (the plan's: False)"]


def test_values_views_and_inputs_are_stored_channels_last():
    graph = _cnn()
    image = graph.tensors[graph.inputs[0]]
    assert image.channels_last
    value = init_values(graph, seed=1)[image.id]
    assert value.is_contiguous(memory_format=torch.channels_last) and not value.is_contiguous()
    region = torch.zeros(image.nbytes, dtype=torch.uint8)
    view = typed_view(region, image)
    view.copy_(value)
    # the bytes are N, H, W, C: the view's values are the logical ones
    assert torch.equal(view, value)
    assert torch.equal(region.view(torch.float32), value.permute(0, 2, 3, 1).reshape(-1))
    conv = next(k for k in graph.kernels if k.op_type == "Conv")
    args = make_inputs(graph, conv, "cpu")
    assert all(a.is_contiguous(memory_format=torch.channels_last) for a in args if a.dim() == 4)



def test_kernels_store_their_outputs_in_the_graphs_layout():
    # every output of every kernel, whatever layout torch gave it: channels-last where the
    # graph says so (the reshaped gradient of the classifier's input too), row-major elsewhere
    graph = _cnn()
    env = init_values(graph, seed=1)
    for k in graph.kernels:
        outs = run_kernel(k, [env[t] for t in k.inputs])
        for tid, value in zip(k.outputs, outs, strict=True):
            layout = torch.channels_last if graph.tensors[tid].channels_last else \
                torch.contiguous_format
            assert value.is_contiguous(memory_format=layout), (k.name, graph.name_of(tid))
            env[tid] = value
    assert {k.op_type for k in graph.kernels if k.channels_last} >= {"Conv", "ReshapeGrad"}


def test_training_in_either_layout_computes_the_same_values():
    # bitwise equality holds between plans of one layout (tests/test_executor.py, cnn-cl);
    # across layouts the convolutions add in another order: equal to rounding
    plain = train_steps(_cnn(False), steps=STEPS, seed=2)
    converted = train_steps(_cnn(), steps=STEPS, seed=2)
    for a, b in zip(plain, converted, strict=True):
        assert a.keys() == b.keys()
        for tid in a:
            torch.testing.assert_close(a[tid], b[tid], rtol=1e-4, atol=1e-5)


def test_optimize_names_the_layout_of_a_cnn_on_the_gpu():
    from types import SimpleNamespace

    from autotm_py.cli.optimize import _layout_lines
    gpu, cpu = SimpleNamespace(device="cuda"), SimpleNamespace(device="cpu")
    # not asked (`api.default_layout` chose): why, and the flag that changes it
    [row_major] = _layout_lines(_cnn(False), gpu, False)
    assert "N, C, H, W" in row_major and "--channels-last is faster on a GPU" in row_major
    [converted] = _layout_lines(_cnn(), gpu, False)
    assert "N, H, W, C, as the profiles have them (--no-channels-last" in converted
    # asked: the flag given
    assert "N, H, W, C (--channels-last)" in _layout_lines(_cnn(), gpu, True)[0]
    assert "N, C, H, W (--no-channels-last)" in _layout_lines(_cnn(False), gpu, True)[0]
    assert _layout_lines(_cnn(False), cpu, False) == []
    assert _layout_lines(derive_training(tiny_decoder(), optimizer="sgd"), gpu, False) == []
