"""The imported graph computes what the ONNX file computes: run it with the project's torch
kernels on the file's own weights and compare with onnxruntime. This checks the canonical
form's semantics (old-opset Softmax, Upsample/Resize-10, Slice clamping, folded masks, Pad
layouts...) end to end, not just shapes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from autotm_py.frontend.onnx import import_model
from autotm_py.ir.graph import Role, TensorGraph
from tests.fixtures import onnx_models as M

BIG = np.iinfo(np.int64).max


def _leaf_values(model: onnx.ModelProto, graph: TensorGraph, feeds: dict) -> dict:
    """Values of the graph's leaves: inputs as fed, constants as imported, weights from the
    file (initializers), or fetched from onnxruntime (weights the importer derived)."""
    import onnxruntime as ort
    import torch

    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    derived = [t.name for t in graph.tensors if t.role is Role.WEIGHT and t.name not in inits]
    if derived:
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in derived)
        fetched = ort.InferenceSession(probe.SerializeToString()).run(derived, feeds)
        inits.update(zip(derived, fetched, strict=True))
    values = {}
    for t in graph.tensors:
        if t.producer is not None:
            continue
        if t.id in graph.constants:
            values[t.id] = torch.from_numpy(np.array(graph.constants[t.id]))
        elif t.role is Role.WEIGHT:
            values[t.id] = torch.from_numpy(np.array(inits[t.name]))
        else:
            values[t.id] = torch.from_numpy(feeds[t.name])
    return values


def assert_same_as_onnxruntime(model: onnx.ModelProto, **kwargs) -> TensorGraph:
    import onnxruntime as ort

    from autotm_py.runtime.reference import run_graph

    graph = import_model(model, **kwargs)
    rng = np.random.default_rng(1)
    feeds = {graph.tensors[t].name: (rng.integers(0, 8, graph.tensors[t].shape)
                                     if graph.tensors[t].dtype == "int64" else
                                     rng.standard_normal(graph.tensors[t].shape))
             .astype(graph.tensors[t].dtype) for t in graph.inputs}
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    ours = run_graph(graph, _leaf_values(model, graph, feeds))
    for tid, want in zip(graph.outputs, expected, strict=True):
        np.testing.assert_allclose(ours[tid].numpy(), want, rtol=1e-4, atol=1e-5)
    return graph


def test_opset9_zoo_file():
    assert_same_as_onnxruntime(M.opset9_zoo())


@pytest.mark.parametrize(("opset", "mask"), [(11, "buffer"), (14, "tril"), (17, "buffer")])
def test_torch_gpt(tmp_path, opset, mask):
    model = onnx.load(M.torch_gpt(tmp_path / "gpt.onnx", opset, mask=mask))
    assert_same_as_onnxruntime(model, dims={"batch": 2, "seq": 6})


@pytest.mark.parametrize("opset", [11, 18])
def test_torch_decoder(tmp_path, opset):
    model = onnx.load(M.torch_decoder(tmp_path / "dec.onnx", opset))
    assert_same_as_onnxruntime(model, batch=2)


def test_old_softmax_and_slices():
    nodes = [M.node("Softmax", ["x"], ["s"], axis=1),
             M.node("Slice", ["s"], ["a"], starts=[2, 1], ends=[BIG, -1], axes=[1, 3]),
             M.node("Unsqueeze", ["a"], ["u"], axes=[0]),
             M.node("Squeeze", ["u"], ["q"], axes=[0]),
             M.node("ReduceMean", ["q"], ["y"], axes=[2], keepdims=0)]
    model = M.make(nodes, [M.inp("x", [2, 4, 3, 5])], ["y"], opset=9)
    graph = assert_same_as_onnxruntime(model)
    assert [k.op_type for k in graph.kernels][:3] == ["Reshape", "Softmax", "Reshape"]


def test_pad_split_transpose_weights():
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((6, 4))
                                .astype(np.float32), "W")
    nodes = [M.const("pads", [0, 1, 0, 2]), M.node("Pad", ["x", "pads"], ["p"], mode="edge"),
             M.node("Transpose", ["W"], ["Wt"]), M.node("MatMul", ["p", "Wt"], ["m"]),
             helper.make_node("Split", ["m"], ["a", "b"], axis=1, num_outputs=2),
             M.node("Sub", ["a", "b"], ["y"])]
    model = M.make(nodes, [M.inp("x", [3, 1])], ["y"], [w], opset=18)
    graph = assert_same_as_onnxruntime(model)
    assert graph.by_name("Wt").role is Role.WEIGHT  # derived weight, fetched from ORT


def test_batchnorm_lrn_pool_gemm_opset9():
    rng = np.random.default_rng(2)

    def w(name, *shape, positive=False):
        value = rng.random(shape) + 0.5 if positive else rng.standard_normal(shape)
        return numpy_helper.from_array(value.astype(np.float32), name)

    inits = [w("cw", 4, 3, 3, 3), w("s", 4, positive=True), w("b", 4), w("m", 4),
             w("v", 4, positive=True), w("fw", 5, 4), w("fb", 5)]
    nodes = [M.node("Conv", ["x", "cw"], ["c"], kernel_shape=[3, 3], auto_pad="SAME_LOWER",
                    strides=[2, 2]),
             M.node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], epsilon=1e-3),
             M.node("LRN", ["n"], ["l"], size=3),
             M.node("AveragePool", ["l"], ["p"], kernel_shape=[2, 2], pads=[0, 0, 1, 1],
                    count_include_pad=1),
             M.node("GlobalMaxPool", ["p"], ["g"]), M.node("Flatten", ["g"], ["f"]),
             M.node("Gemm", ["f", "fw", "fb"], ["y"], transB=1, alpha=0.5)]
    model = M.make(nodes, [M.inp("x", ["N", 3, 9, 9])], ["y"], inits, opset=9)
    assert_same_as_onnxruntime(model, batch=2)
