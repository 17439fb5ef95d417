"""End-to-end ONNX import: torch exports (legacy and dynamo), an opset-9 zoo-style file,
dims binding and provenance. Shapes are checked against onnxruntime."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from autotm_py.errors import ModelImportError, ShapeError, UnsupportedOpError
from autotm_py.frontend.onnx import import_model, import_onnx
from autotm_py.ir.graph import Role
from tests.fixtures import onnx_models as M
from tests.fixtures.checks import assert_canonical, ort_output_shapes


def ops(graph):
    return Counter(k.op_type for k in graph.kernels)


@pytest.mark.parametrize("opset", [9, 13, 17])
def test_torch_cnn(tmp_path, opset):
    path = M.torch_cnn(tmp_path / "cnn.onnx", opset)
    g = import_onnx(path, batch=5, fuse=False)  # the file's own ops
    assert_canonical(g)
    assert {"Conv", "Relu", "MaxPool", "GlobalAveragePool", "Gemm"} <= set(ops(g))
    fused = import_onnx(path, batch=5)  # the exporter folded the batch norm: Conv -> Relu
    assert_canonical(fused)
    assert fused.meta["fusion"]["conv_relu"] == ops(fused)["ConvRelu"] == ops(g)["Conv"] == 2
    assert g.tensors[g.outputs[0]].shape == (5, 10)
    assert ort_output_shapes(path, g) == [(5, 10)]
    assert g.tensors[g.inputs[0]].role is Role.INPUT
    # conv1 W, B (BN folded in by the exporter), conv2 W, fc W and B
    assert sum(1 for t in g.tensors if t.role is Role.WEIGHT) == 5
    assert g.meta["opset"] == opset and g.meta["batch"] == 5


@pytest.mark.parametrize(("opset", "mask"), [(11, "buffer"), (14, "tril"), (17, "buffer"),
                                             (17, "tril")])
def test_torch_gpt(tmp_path, opset, mask):
    path = M.torch_gpt(tmp_path / "gpt.onnx", opset, mask=mask)
    g = import_onnx(path, batch=3, dims={"seq": 5}, fuse=False)  # the file's own ops
    assert_canonical(g)
    assert g.tensors[g.outputs[0]].shape == (3, 5, 64)
    assert ort_output_shapes(path, g) == [(3, 5, 64)]
    counts = ops(g)
    assert counts["Softmax"] == 2 and counts["Erf"] == 2 and counts["Where"] == 2
    assert counts["LayerNormalization"] == (5 if opset >= 17 else 0)
    # shape chains, masks and constants folded away: nothing but compute remains
    assert not {"Shape", "Range", "Equal", "ConstantOfShape", "Constant", "Trilu"} & set(counts)
    where = next(k for k in g.kernels if k.op_type == "Where")
    causal = g.tensors[where.inputs[0]]
    assert causal.role is Role.CONSTANT
    np.testing.assert_array_equal(g.constants[causal.id].reshape(5, 5),
                                  np.triu(np.ones((5, 5), bool), 1))
    # position embeddings: the weight keeps its full size, indices 0..T-1 are a constant
    wpe = next(k for k in g.kernels if k.op_type == "Gather"
               and g.tensors[k.inputs[0]].name == "wpe.weight")
    assert g.tensors[wpe.inputs[0]].shape == (16, 32)
    assert g.constants[wpe.inputs[1]].tolist() == [0, 1, 2, 3, 4]
    # tied / deduplicated weights are one tensor each, never copied or given values
    weights = [t for t in g.tensors if t.role is Role.WEIGHT]
    assert len({t.name for t in weights}) == len(weights)
    assert not any(t.id in g.constants for t in weights)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_torch_gpt_dynamo_exporter(tmp_path):
    """torch's default (dynamo, onnxscript) exporter at opset 18."""
    import torch

    def export(module, args, path, opset, names, dynamic):
        dims = {k: torch.export.Dim(v, min=1, max=16) for k, v in dynamic[names[0]].items()}
        torch.onnx.export(module.eval(), args, str(path), opset_version=opset, dynamo=True,
                          input_names=list(names[:-1]), output_names=[names[-1]],
                          dynamic_shapes={names[0]: dims}, verbose=False)
        return path

    original = M.torch_export
    M.torch_export = export
    try:
        path = M.torch_gpt(tmp_path / "gpt.onnx", 18, layers=1)
    finally:
        M.torch_export = original
    g = import_onnx(path, dims={"batch": 2, "seq": 7})
    assert_canonical(g)
    assert ort_output_shapes(path, g) == [(2, 7, 64)] == [g.tensors[g.outputs[0]].shape]


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_torch_decoder_pad_convtranspose_clip_resize(tmp_path, opset):
    path = M.torch_decoder(tmp_path / "dec.onnx", opset)
    g = import_onnx(path, batch=3)
    assert_canonical(g)
    assert [k.op_type for k in g.kernels] == ["Pad", "ConvTranspose", "Clip", "Resize",
                                              "Resize"]
    pad, convt, clip, nearest, bilinear = (k.attrs_dict for k in g.kernels)
    assert pad["pads"] == (0, 0, 0, 1, 0, 0, 1, 2) and pad["constant_value"] == 0.5
    assert convt["output_padding"] == (1, 1) and convt["pads"] == (1, 1, 1, 1)
    assert (clip["min"], clip["max"]) == (-1.0, 1.0)
    assert nearest["scales"] == (1.0, 1.0, 2.0, 2.0) and nearest["mode"] == "nearest"
    assert bilinear["sizes"] == (3, 4, 20, 20) and bilinear["mode"] == "linear"
    assert ort_output_shapes(path, g) == [(3, 4, 20, 20)]


def test_opset9_model_zoo_style():
    model = M.opset9_zoo()
    g = import_model(model)
    assert_canonical(g)
    assert ort_output_shapes(model.SerializeToString(), g) == [(1, 10)]
    counts = ops(g)
    assert counts["LRN"] == 1 and counts["Sum"] == 1 and counts["Dropout"] == 1
    assert counts["Resize"] == 1 and "ConstantOfShape" not in counts
    conv1 = g.by_name("conv1.W")  # made by ConstantOfShape: a weight, no value kept
    assert conv1.role is Role.WEIGHT and conv1.shape == (8, 3, 3, 3)
    assert conv1.id not in g.constants
    dropout = next(k for k in g.kernels if k.op_type == "Dropout")
    assert dropout.attrs_dict == {"ratio": 0.3, "training_mode": 0}
    assert len(dropout.outputs) == 1  # the unread mask output is dropped
    assert g.tensors[g.outputs[0]].shape == (1, 10)
    # --batch rebinds the fixed first dim; Reshape's 0 copies it, so the graph follows
    assert import_model(model, batch=4).tensors[g.outputs[0]].shape == (4, 10)


def test_default_dims_from_metadata_and_overrides():
    model = M.dynamic_relu(default_dims={"batch": 6, "seq": 4})
    assert import_model(model).tensors[0].shape == (6, 4, 8)
    assert import_model(model, dims={"seq": 9}).tensors[0].shape == (6, 9, 8)
    g = import_model(model, batch=2)
    assert g.tensors[0].shape == (2, 4, 8) and g.meta["dims"] == {"batch": 2, "seq": 4}


def test_unknown_dim_after_binding_is_a_shape_error():
    with pytest.raises(ShapeError, match=r"'seq'.*--dim seq=VALUE"):
        import_model(M.dynamic_relu(), batch=2)


def test_provenance_in_meta(tmp_path):
    path = tmp_path / "relu.onnx"
    onnx.save(M.dynamic_relu(default_dims={"batch": 2, "seq": 3}), path)
    g = import_onnx(path)
    assert g.name == "relu"
    meta = g.meta
    assert meta["source"] == str(path) and meta["opset"] == 17
    assert meta["producer"] == "autotm-tests" and meta["dims"] == {"batch": 2, "seq": 3}
    assert len(meta["onnx_hash"]) == 16
    other = M.dynamic_relu(default_dims={"batch": 2, "seq": 3})
    assert import_model(other).meta["onnx_hash"] == meta["onnx_hash"]


def test_external_weights_are_shapes_only(tmp_path):
    path = tmp_path / "ext.onnx"
    onnx.save(M.external_weight("weights.bin"), path)  # the data file does not exist
    g = import_onnx(path, batch=2)
    w = g.by_name("W")
    assert w.role is Role.WEIGHT and w.shape == (4, 3) and w.id not in g.constants


def test_zoo_style_in_memory_model_keeps_graph_name():
    model = M.dynamic_relu(default_dims={"batch": 1, "seq": 1})
    assert import_model(model).name == "g"
    assert import_model(model, name="custom").name == "custom"


FIXTURES = M.__file__.rsplit("/", 1)[0]


@pytest.mark.parametrize(("name", "kwargs", "outcome"), [
    ("zoo9.onnx", {}, (1, 10)),
    ("tiny_cnn_opset13.onnx", {"batch": 2}, (2, 10)),
    ("tiny_gpt_opset17.onnx", {"dims": {"batch": 2, "seq": 4}}, (2, 4, 64)),
    ("dynamic_relu.onnx", {}, (8, 16, 8)),
    ("unsupported_op.onnx", {}, UnsupportedOpError),
    ("cycle.onnx", {}, ModelImportError),
    ("dangling.onnx", {}, ModelImportError),
    ("escaping_data.onnx", {"batch": 1}, ModelImportError),
    ("hardcoded_batch.onnx", {"batch": 3}, ShapeError),
])
def test_committed_fixtures(name, kwargs, outcome):
    """The files `make_fixtures.py` wrote import (or fail) as their builders say."""
    path = f"{FIXTURES}/{name}"
    if isinstance(outcome, tuple):
        g = import_onnx(path, **kwargs)
        assert_canonical(g)
        assert g.tensors[g.outputs[0]].shape == outcome
    else:
        with pytest.raises(outcome):
            import_onnx(path, **kwargs)


def test_local_functions_are_inlined():
    fn = onnx.helper.make_function("local", "Gelu2", ["a"], ["b"],
                                   [M.node("Erf", ["a"], ["b"])],
                                   [onnx.helper.make_opsetid("", 17)])
    model = M.make([onnx.helper.make_node("Gelu2", ["x"], ["y"], domain="local")],
                   [M.inp("x", [3])], ["y"], extra_opsets=[("local", 1)])
    model.functions.append(fn)
    g = import_model(model)
    assert [k.op_type for k in g.kernels] == ["Erf"]


def test_equal_constant_tables_are_one_tensor_and_small_constants_stay_apart():
    """An exporter's per-layer copies of one table (transformers' Llama: each layer's rotary
    cos and sin) import as one constant, uploaded once per replay and held in one buffer;
    equal scalars keep tensors of their own, and unequal tables are never merged."""
    from onnx import TensorProto, helper, numpy_helper

    table = np.arange(256, dtype=np.float32).reshape(16, 16)
    consts = {"t1": table, "t2": table.copy(), "t3": table + 1, "s1": np.float32(2.0),
              "s2": np.float32(2.0)}
    nodes = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.asarray(value), name)) for name, value in consts.items()]
    nodes += [helper.make_node("Add", ["x", "t1"], ["a"]),
              helper.make_node("Add", ["a", "t2"], ["b"]),
              helper.make_node("Add", ["b", "t3"], ["c"]),
              helper.make_node("Mul", ["c", "s1"], ["d"]),
              helper.make_node("Mul", ["d", "s2"], ["y"])]
    graph = helper.make_graph(
        nodes, "tables", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 16])])
    g = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    constants = [t for t in g.tensors if t.role == Role.CONSTANT]
    assert sorted(t.shape for t in constants) == [(), (), (16, 16), (16, 16)]
    adds = [k for k in g.kernels if k.op_type == "Add"]
    assert adds[0].inputs[1] == adds[1].inputs[1] != adds[2].inputs[1]
