"""The canonical kernel form, op by op and opset by opset, and constant folding with roles."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from autotm_py.errors import ModelImportError
from autotm_py.frontend.canonical import REGISTRY, importable_ops
from autotm_py.frontend.onnx import import_model
from autotm_py.ir.graph import Role
from autotm_py.ir.ops import FORWARD_OPS
from tests.fixtures.checks import assert_canonical, ort_output_shapes
from tests.fixtures.onnx_models import F32, I64, const, inp, make, node

BIG = np.iinfo(np.int64).max


def one(nodes, x_dims, opset=17, inits=(), outputs=("y",), check_ort=True):
    """Import a one-input model; return (graph, [(op, attrs) of every kernel])."""
    model = make(nodes, [inp("x", x_dims)], list(outputs), list(inits), opset=opset)
    g = import_model(model)
    assert_canonical(g)
    if check_ort:
        assert ort_output_shapes(model.SerializeToString(), g) == \
            [g.tensors[t].shape for t in g.outputs]
    return g, [(k.op_type, k.attrs_dict) for k in g.kernels]


def test_every_vocabulary_op_has_a_canonicalizer():
    assert set(FORWARD_OPS) <= set(REGISTRY)
    assert "Upsample" in importable_ops()


def test_softmax_old_opset_flattens_unless_last_axis():
    _, ks = one([node("Softmax", ["x"], ["y"], axis=1)], [2, 3, 4, 5], opset=11)
    assert [op for op, _ in ks] == ["Reshape", "Softmax", "Reshape"]
    assert ks[0][1]["shape"] == (2, 60) and ks[1][1]["axis"] == 1
    assert ks[2][1]["shape"] == (2, 3, 4, 5)
    _, ks = one([node("Softmax", ["x"], ["y"], axis=-1)], [2, 3, 4], opset=11)
    assert ks == [("Softmax", {"axis": 2})]
    _, ks = one([node("LogSoftmax", ["x"], ["y"])], [2, 3, 4], opset=13)
    assert ks == [("LogSoftmax", {"axis": 2})]


def test_nary_max_and_sum_become_chains():
    _, ks = one([node("Max", ["x", "x", "x"], ["y"])], [4])
    assert [op for op, _ in ks] == ["Max", "Max"]
    _, ks = one([node("Sum", ["x"] * 10, ["y"])], [4])
    assert [op for op, _ in ks] == ["Sum", "Sum"]
    _, ks = one([node("Sum", ["x"], ["s"]), node("Relu", ["s"], ["y"])], [4])
    assert ks == [("Relu", {})]  # a one-input Sum is an alias


@pytest.mark.parametrize("opset", [9, 13])
def test_slice_is_explicit_and_clamped(opset):
    if opset == 9:
        nodes = [node("Slice", ["x"], ["y"], starts=[-3, 1], ends=[BIG, 100], axes=[1, 2])]
        inits = []
    else:
        nodes = [node("Slice", ["x", "s", "e", "a"], ["y"])]
        inits = [numpy_helper.from_array(np.array(v, np.int64), n)
                 for n, v in (("s", [-3, 1]), ("e", [BIG, 100]), ("a", [1, -1]))]
    _, ks = one(nodes, [2, 5, 6], opset=opset, inits=inits)
    assert ks == [("Slice", {"starts": (2, 1), "ends": (5, 6), "axes": (1, 2),
                             "steps": (1, 1)})]


@pytest.mark.parametrize(("starts", "ends", "steps"), [([-1], [-BIG], [-1]), ([5], [1], [-2]),
                                                       ([-7], [BIG], [2])])
def test_slice_attrs_reproduce_onnxruntime(starts, ends, steps):
    import onnxruntime as ort

    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("s", starts), ("e", ends), ("a", [0]), ("st", steps))]
    model = make([node("Slice", ["x", "s", "e", "a", "st"], ["y"])], [inp("x", [6, 3])], ["y"],
                 inits)
    attrs = import_model(model).kernels[0].attrs_dict
    x = np.arange(18, dtype=np.float32).reshape(6, 3)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    ours = x[slice(attrs["starts"][0], attrs["ends"][0], attrs["steps"][0])]
    np.testing.assert_array_equal(ours, expected)
    if starts == [-1]:  # "through index 0" is -dim-1: ONNX's clamping leaves it unchanged
        assert attrs == {"starts": (5,), "ends": (-7,), "axes": (0,), "steps": (-1,)}


def test_pad_axes_and_constant_value_at_opset18():
    nodes = [const("p", [1, 2]), const("v", 1.5, np.float32), const("a", [-1]),
             node("Pad", ["x", "p", "v", "a"], ["y"], mode="reflect")]
    _, ks = one(nodes, [2, 3, 8], opset=18)
    assert ks == [("Pad", {"pads": (0, 0, 1, 0, 0, 2), "constant_value": 1.5,
                           "axes": (0, 1, 2), "mode": "reflect"})]


@pytest.mark.parametrize(("opset", "extra"), [(11, {"split": [2, 4]}), (13, {}),
                                              (18, {"num_outputs": 2})])
def test_split_sizes_are_explicit(opset, extra):
    inputs = ["x", "sizes"] if opset == 13 else ["x"]
    nodes = ([const("sizes", [2, 4])] if opset == 13 else []) + [
        helper.make_node("Split", inputs, ["a", "b"], axis=-1, **extra)]
    _, ks = one(nodes, [3, 6], opset=opset, outputs=("a", "b"))
    sizes = (3, 3) if opset == 18 else (2, 4)
    assert ks == [("Split", {"axis": 1, "split": sizes})]


def test_squeeze_unsqueeze_reduce_axes():
    _, ks = one([node("Squeeze", ["x"], ["y"])], [1, 3, 1, 2], opset=13)
    assert ks == [("Squeeze", {"axes": (0, 2)})]
    _, ks = one([node("Unsqueeze", ["x"], ["y"], axes=[-1, 0])], [3, 2], opset=11)
    assert ks == [("Unsqueeze", {"axes": (0, 3)})]
    nodes = [const("ax", [-1]), node("ReduceMean", ["x", "ax"], ["y"], keepdims=0)]
    _, ks = one(nodes, [2, 3, 4], opset=18)
    assert ks == [("ReduceMean", {"axes": (2,), "keepdims": 0})]
    _, ks = one([node("ReduceMean", ["x"], ["y"], axes=[1])], [2, 3, 4], opset=13)
    assert ks == [("ReduceMean", {"axes": (1,), "keepdims": 1})]
    _, ks = one([node("ReduceSum", ["x"], ["y"])], [2, 3], opset=13)
    assert ks == [("ReduceSum", {"axes": (0, 1), "keepdims": 1})]


def test_auto_pad_resolved_into_pads():
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    nodes = [node("Conv", ["x", "w"], ["c"], auto_pad="SAME_UPPER", strides=[2, 2]),
             node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], auto_pad="SAME_LOWER")]
    _, ks = one(nodes, [1, 3, 8, 8], inits=[w])
    conv, pool = ks
    assert conv == ("Conv", {"dilations": (1, 1), "group": 1, "kernel_shape": (3, 3),
                             "pads": (0, 0, 1, 1), "strides": (2, 2)})
    assert pool[1]["pads"] == (1, 1, 0, 0) and pool[1]["strides"] == (1, 1)


def test_conv_transpose_output_shape_becomes_pads():
    w = numpy_helper.from_array(np.ones((3, 2, 3, 3), np.float32), "w")
    nodes = [node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], output_shape=[10, 10])]
    g, ks = one(nodes, [1, 3, 5, 5], inits=[w])
    attrs = ks[0][1]
    assert g.tensors[g.outputs[0]].shape == (1, 2, 10, 10)
    assert attrs["pads"] == (1, 1, 0, 0) and attrs["output_padding"] == (0, 0)


def test_gather_negative_constant_indices_become_non_negative():
    nodes = [const("i", [-1, 0]), node("Gather", ["x", "i"], ["y"], axis=1)]
    g, ks = one(nodes, [2, 5])
    k = g.kernels[0]
    assert g.constants[k.inputs[1]].tolist() == [4, 0] and ks[0][1] == {"axis": 1}


def test_identity_renames_into_graph_output_or_copies_an_input():
    g, ks = one([node("Relu", ["x"], ["r"]), node("Identity", ["r"], ["y"])], [4])
    assert ks == [("Relu", {})] and g.tensors[g.outputs[0]].name == "y"
    assert g.tensors[g.outputs[0]].role is Role.OUTPUT
    g, ks = one([node("Identity", ["x"], ["y"])], [4])
    assert ks == [("Identity", {})]


def test_clip_dropout_cast_defaults():
    nodes = [const("lo", 0.0, np.float32), node("Clip", ["x", "lo"], ["c"]),
             const("r", 0.25, np.float32), node("Dropout", ["c", "r"], ["d"]),
             node("Cast", ["d"], ["y"], to=TensorProto.FLOAT16)]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)
    g, ks = one(nodes, [4], opset=13, outputs=(out,))
    assert ks == [("Clip", {"min": 0.0, "max": None}),
                  ("Dropout", {"ratio": 0.25, "training_mode": 0}),
                  ("Cast", {"to": "float16"})]
    assert g.tensors[g.outputs[0]].dtype == "float16"


def test_a_cast_to_the_dtype_it_has_is_an_alias():
    """transformers' float32 casts around RMSNorm and the softmax, in a float32 export: no
    copy (models/corpus/llama_gqa.onnx); a Cast that changes the dtype stays a kernel, and a
    same-dtype Cast straight to a graph output stays a copy, as an Identity does."""
    nodes = [node("Cast", ["x"], ["a"], to=TensorProto.FLOAT), node("Relu", ["a"], ["r"]),
             node("Cast", ["r"], ["h"], to=TensorProto.FLOAT16),
             node("Cast", ["h"], ["y"], to=TensorProto.FLOAT16)]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)
    g, ks = one(nodes, [4], outputs=(out,))
    assert ks == [("Relu", {}), ("Cast", {"to": "float16"})]
    assert g.tensors[g.kernels[0].inputs[0]].name == "x"
    g, ks = one([node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], [4])
    assert ks == [("Identity", {})]


def test_used_optional_output_is_an_error():
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"]),
             node("Cast", ["mask"], ["y"], to=TensorProto.FLOAT)]
    with pytest.raises(ModelImportError, match="optional output 'mask'"):
        import_model(make(nodes, [inp("x", [4])], ["y"], opset=13))


def test_transpose_flatten_expand_trilu():
    nodes = [node("Transpose", ["x"], ["t"]), node("Flatten", ["t"], ["f"], axis=-1),
             const("shape", [3, 1, 1]), node("Expand", ["f", "shape"], ["e"]),
             node("Trilu", ["e"], ["y"], upper=0)]
    _, ks = one(nodes, [2, 3, 4])
    assert ks == [("Transpose", {"perm": (2, 1, 0)}), ("Flatten", {"axis": 2}),
                  ("Expand", {"shape": (3, 12, 2)}), ("Trilu", {"k": 0, "upper": 0})]


def test_resize_opset18_axes_and_sizes():
    nodes = [const("sizes", [6, 9]),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], axes=[2, 3],
                              mode="linear")]
    _, ks = one(nodes, [1, 2, 3, 3], opset=18)
    attrs = ks[0][1]
    assert attrs["sizes"] == (1, 2, 6, 9) and attrs["scales"] == (1.0, 1.0, 2.0, 3.0)
    assert attrs["roi"] == () and attrs["coordinate_transformation_mode"] == "half_pixel"


# ---- folding and roles ---------------------------------------------------------------------
def test_float_initializer_mask_folds_to_a_bool_constant():
    """A float buffer sliced and compared (nanoGPT's mask) becomes a CONSTANT bool mask."""
    buf = numpy_helper.from_array(np.tril(np.ones((8, 8), np.float32)), "bias")
    nodes = [node("Shape", ["x"], ["s"]), const("i1", [1]), const("end", [BIG]),
             node("Slice", ["s", "i1", "end"], ["t"]),
             const("z", [0]), node("Slice", ["bias", "z", "t", "z"], ["rows"]),
             node("Slice", ["rows", "z", "t", "i1"], ["m"]),
             const("zero", 0.0, np.float32), node("Equal", ["m", "zero"], ["masked"]),
             const("ninf", -np.inf, np.float32), node("Where", ["masked", "ninf", "x"], ["y"])]
    g, ks = one(nodes, [3, 3], inits=[buf])
    assert [op for op, _ in ks] == ["Where"]
    mask = g.tensors[g.kernels[0].inputs[0]]
    assert mask.role is Role.CONSTANT and mask.dtype == "bool"
    np.testing.assert_array_equal(g.constants[mask.id], np.triu(np.ones((3, 3), bool), 1))
    assert "bias" not in g.tensor_ids_by_name  # only used for folding


def test_weight_layout_ops_fold_to_shape_only_weights():
    w = numpy_helper.from_array(np.ones((5, 4), np.float32), "W")
    nodes = [node("Transpose", ["W"], ["Wt"]), node("MatMul", ["x", "Wt"], ["y"])]
    g, ks = one(nodes, [2, 4], inits=[w])
    assert [op for op, _ in ks] == ["MatMul"]
    wt = g.by_name("Wt")
    assert wt.role is Role.WEIGHT and wt.shape == (4, 5) and wt.id not in g.constants


def test_constant_data_operands_keep_values_and_weight_slots_stay_weights():
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["W"],
                              value=numpy_helper.from_array(np.array([0.5], np.float32))),
             const("shape", [4, 3]), node("MatMul", ["x", "W"], ["m"]),
             const("half", 0.5, np.float32), node("Mul", ["m", "half"], ["y"])]
    nodes = [nodes[1], nodes[0], *nodes[2:]]
    g, _ = one(nodes, [2, 4])
    assert g.by_name("W").role is Role.WEIGHT
    half = g.by_name("half")
    assert half.role is Role.CONSTANT and float(g.constants[half.id]) == 0.5


def test_reference_evaluator_folds_rare_ops():
    nodes = [const("c", [1.0, 2.0, 3.0], np.float32), node("CumSum", ["c", "axis"], ["cs"]),
             const("axis", 0), node("Add", ["x", "cs"], ["y"])]
    nodes = [nodes[0], nodes[2], nodes[1], nodes[3]]
    g, ks = one(nodes, [2, 3])
    assert [op for op, _ in ks] == ["Add"]
    assert g.constants[g.by_name("cs").id].tolist() == [1.0, 3.0, 6.0]


def test_int_input_and_label_roles():
    nodes = [node("SoftmaxCrossEntropyLoss", ["x", "labels"], ["y"])]
    model = make(nodes, [inp("x", [4, 5]), inp("labels", [4], I64)],
                 [helper.make_tensor_value_info("y", F32, [])])
    g = import_model(model)
    assert_canonical(g)
    assert g.by_name("labels").role is Role.LABEL and g.by_name("x").role is Role.INPUT
    assert g.kernels[0].attrs_dict == {"ignore_index": None, "reduction": "mean"}
