"""Forward kernels follow ONNX semantics exactly: compared with onnxruntime on the option
combinations where implementations often differ (pads, auto_pad, ceil_mode, count_include_pad,
negative steps, Resize coordinate modes, Pad modes, axes, loss weights)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import helper, numpy_helper

from autotm_py.ir.graph import Kernel, freeze_attrs
from autotm_py.ir.ops import FORWARD_OPS
from autotm_py.kernels import run_kernel

RNG = np.random.default_rng(3)
OPSET = 20
PARAM_DTYPES = {"scales": np.float32, "roi": np.float32, "constant_value": np.float32,
                "min": np.float32, "max": np.float32}


def _model(op: str, inputs: list[np.ndarray], attrs: dict[str, Any],
           out_dtypes: list[np.dtype]) -> onnx.ModelProto:
    """The canonical kernel as an ONNX node: parameters become constant inputs."""
    names = [f"x{i}" for i in range(len(inputs))]
    inits, slots = [], list(names)
    for param in FORWARD_OPS[op].params:
        if attrs.get(param) is None:
            slots.append("")
            continue
        value = np.asarray(attrs[param], dtype=PARAM_DTYPES.get(param, np.int64))
        inits.append(numpy_helper.from_array(value, f"p_{param}"))
        slots.append(f"p_{param}")
    while slots and slots[-1] == "":
        slots.pop()
    node_attrs = {k: v for k, v in attrs.items() if k not in FORWARD_OPS[op].params}
    outs = [f"y{j}" for j in range(len(out_dtypes))]
    node = helper.make_node(op, slots, outs, **node_attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in zip(names, inputs, strict=True)],
        [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(d), None)
         for o, d in zip(outs, out_dtypes, strict=True)],
        initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=9)


def check(op: str, inputs: list[np.ndarray], attrs: dict[str, Any], n_out: int = 1,
          atol: float = 1e-5) -> None:
    kernel = Kernel(0, op, op, "", freeze_attrs(attrs), tuple(range(len(inputs))),
                    tuple(range(n_out)), "")
    got = run_kernel(kernel, [torch.as_tensor(v) for v in inputs])
    model = _model(op, inputs, attrs, [g.numpy().dtype for g in got])
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, {f"x{i}": v for i, v in enumerate(inputs)})
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        assert tuple(g.shape) == w.shape, (op, j, tuple(g.shape), w.shape)
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=atol, err_msg=f"{op} #{j}")


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


CASES: list[tuple[str, list[np.ndarray], dict[str, Any], int]] = [
    ("Conv", [f32(1, 3, 8, 7), f32(4, 3, 3, 2)], {"pads": [0, 1, 2, 0], "strides": [2, 1]}, 1),
    ("Conv", [f32(1, 4, 7, 7), f32(6, 2, 3, 3)],
     {"auto_pad": "SAME_LOWER", "strides": [2, 2], "group": 2}, 1),
    ("Conv", [f32(1, 3, 9), f32(2, 3, 3)], {"dilations": [2], "pads": [1, 1]}, 1),
    ("ConvTranspose", [f32(1, 4, 5, 5), f32(4, 3, 3, 3), f32(3)],
     {"strides": [2, 2], "pads": [1, 0, 0, 2], "output_padding": [1, 1]}, 1),
    ("ConvTranspose", [f32(1, 2, 4, 4), f32(2, 3, 3, 3)],
     {"strides": [2, 2], "output_shape": [9, 8]}, 1),
    ("Gemm", [f32(4, 3), f32(5, 4), f32(3, 1)],
     {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 1.5}, 1),
    ("MaxPool", [f32(1, 2, 7, 7)], {"kernel_shape": [3, 3], "strides": [2, 2],
                                    "ceil_mode": 1}, 1),
    ("MaxPool", [f32(1, 2, 6, 6)], {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER",
                                    "strides": [2, 2]}, 1),
    ("MaxPool", [f32(2, 2, 4, 5)], {"kernel_shape": [2, 2], "storage_order": 1}, 2),
    ("MaxPool", [f32(1, 2, 7, 7)], {"kernel_shape": [2, 3], "pads": [0, 1, 1, 0],
                                    "dilations": [2, 1]}, 1),
    ("AveragePool", [f32(1, 2, 7, 7)], {"kernel_shape": [3, 3], "strides": [2, 2],
                                        "pads": [1, 1, 1, 1], "ceil_mode": 1}, 1),
    ("AveragePool", [f32(1, 2, 6, 6)], {"kernel_shape": [3, 3], "strides": [2, 2],
                                        "pads": [1, 1, 1, 1], "count_include_pad": 1}, 1),
    ("AveragePool", [f32(1, 2, 7, 6)], {"kernel_shape": [3, 2], "pads": [0, 1, 2, 0]}, 1),
    ("AveragePool", [f32(1, 2, 8, 8)], {"kernel_shape": [2, 2], "dilations": [2, 2],
                                        "strides": [2, 2]}, 1),
    ("LRN", [f32(2, 6, 3, 3)], {"size": 5, "alpha": 0.3, "beta": 0.6, "bias": 1.5}, 1),
    ("Softmax", [f32(2, 3, 4)], {"axis": 1}, 1),
    ("LayerNormalization", [f32(2, 3, 4), f32(3, 4), f32(3, 4)], {"axis": 1}, 3),
    ("BatchNormalization", [f32(2, 3, 4), f32(3), f32(3), f32(3),
                            np.abs(f32(3)) + 0.5], {"epsilon": 1e-3}, 1),
    ("Gather", [f32(3, 5, 2), np.array([[4, -1], [0, 2]], np.int64)], {"axis": 1}, 1),
    ("Slice", [f32(5, 6, 4)], {"starts": [-1, 4], "ends": [-100, 0], "axes": [0, 1],
                               "steps": [-2, -3]}, 1),
    ("Split", [f32(2, 7)], {"axis": 1, "num_outputs": 3}, 3),
    ("Pad", [f32(2, 3, 4)], {"pads": [1, 0, 3, 1, 0, 1], "mode": "reflect"}, 1),
    ("Pad", [f32(2, 3, 4)], {"pads": [2, 1], "axes": [1], "mode": "edge"}, 1),
    ("Pad", [f32(2, 3, 4)], {"pads": [0, 2, 0, 1], "axes": [0, 2], "mode": "wrap"}, 1),
    ("Pad", [f32(3, 4)], {"pads": [1, -1, 0, 2], "constant_value": 1.5}, 1),
    ("Resize", [f32(1, 2, 3, 4)], {"scales": [1, 1, 2.5, 1.5], "mode": "nearest",
                                   "coordinate_transformation_mode": "half_pixel",
                                   "nearest_mode": "round_prefer_ceil"}, 1),
    ("Resize", [f32(1, 2, 6, 5)], {"sizes": [1, 2, 4, 3], "mode": "linear",
                                   "coordinate_transformation_mode": "pytorch_half_pixel"}, 1),
    ("Resize", [f32(1, 1, 4, 4)], {"scales": [1, 1, 1.7, 0.8], "mode": "linear",
                                   "coordinate_transformation_mode": "align_corners"}, 1),
    ("Resize", [f32(1, 1, 5, 6)], {"sizes": [7, 4], "axes": [2, 3], "mode": "cubic",
                                   "cubic_coeff_a": -0.5, "exclude_outside": 1}, 1),
    ("Resize", [f32(1, 1, 4, 6)], {"scales": [1, 1, 2, 0.5], "mode": "cubic",
                                   "coordinate_transformation_mode": "asymmetric"}, 1),
    ("Resize", [f32(1, 1, 5, 4)], {"sizes": [1, 1, 3, 7], "mode": "linear",
                                   "coordinate_transformation_mode": "half_pixel_symmetric"},
     1),
    ("ReduceMean", [f32(2, 3, 4)], {"axes": [-1, 0], "keepdims": 0}, 1),
    ("ReduceSum", [f32(2, 3, 4)], {"keepdims": 1}, 1),
    ("Trilu", [f32(2, 3, 5)], {"upper": 0, "k": 1}, 1),
    ("Expand", [f32(3, 1)], {"shape": [2, 1, 4]}, 1),
    ("Tile", [f32(2, 3)], {"repeats": [3, 2]}, 1),
    ("Unsqueeze", [f32(2, 3)], {"axes": [-1, 0]}, 1),
    ("Reshape", [f32(2, 3, 4)], {"shape": [4, 0, -1]}, 1),
    ("Flatten", [f32(2, 3, 4)], {"axis": 0}, 1),
    ("Div", [np.array([7, -7, 5], np.int64), np.array([2, 2, -3], np.int64)], {}, 1),
    ("Pow", [np.abs(f32(3, 4)) + 0.1, f32(4)], {}, 1),
    ("Clip", [f32(3, 4)], {"min": -0.3}, 1),
    ("Gelu", [f32(3, 4)], {"approximate": "tanh"}, 1),
    ("Where", [RNG.random((3, 1)) > 0.5, f32(3, 4), f32(4)], {}, 1),
    ("SoftmaxCrossEntropyLoss", [f32(2, 4, 3), np.array([[1, 3, 0], [2, 2, 1]], np.int64),
                                 np.array([1, 2, 0.5, 1.5], np.float32)],
     {"ignore_index": 2, "reduction": "mean"}, 2),
]


@pytest.mark.parametrize(("op", "inputs", "attrs", "n_out"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_forward_kernel_matches_onnxruntime(op: str, inputs: list[np.ndarray],
                                            attrs: dict[str, Any], n_out: int) -> None:
    check(op, inputs, attrs, n_out)


def test_resize_makes_its_tap_tables_once_per_device_and_dtype():
    """The index and weight tables of a resized axis are made on the device once and reused:
    a copy from the host at every call broke CUDA-graph capture on a GPU."""
    from autotm_py.kernels import resize

    class Linear:  # the kernel attributes `_taps` reads
        def attr(self, name, default=None):
            return {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}.get(
                name, default)

    x = torch.zeros(2, dtype=torch.float64)
    first, again = resize._taps(Linear(), 4, 8, 2.0, x), resize._taps(Linear(), 4, 8, 2.0, x)
    assert first[0] is again[0] and first[1] is again[1]
    assert first[1].dtype == torch.float64 and tuple(first[0].shape) == (2, 8)
    other = resize._taps(Linear(), 4, 8, 2.0, x.float())
    assert other[1] is not first[1] and other[1].dtype == torch.float32


@pytest.mark.parametrize("attrs, x_shape", [
    ({"mode": "linear", "scales": [1, 1, 2, 2]}, (2, 3, 5, 4)),  # F.interpolate's export
    ({"mode": "linear", "sizes": [2, 3, 3, 7],
      "coordinate_transformation_mode": "pytorch_half_pixel"}, (2, 3, 6, 5)),
    ({"mode": "linear", "scales": [1, 1, 1.7, 0.8]}, (1, 2, 4, 6)),
    ({"mode": "linear", "sizes": [1, 2, 7, 3],
      "coordinate_transformation_mode": "align_corners"}, (1, 2, 4, 5)),
    ({"mode": "nearest", "scales": [1, 1, 2.5, 1.5], "nearest_mode": "floor",
      "coordinate_transformation_mode": "asymmetric"}, (2, 2, 3, 4))])
def test_resize_runs_torchs_upsampling_kernel_with_the_taps_values(monkeypatch, attrs, x_shape):
    """Where torch's upsample_bilinear2d / upsample_nearest2d computes ONNX's map, Resize and
    ResizeGrad run it (one kernel; the taps' index_selects and index_adds were 3.5 ms of the
    U-Net's step on the H200), with the taps' values (float64: to rounding)."""
    from autotm_py.ir.rules.geometry import resize_plan
    from autotm_py.kernels import resize

    class Attrs:  # what the kernels read of a Resize / ResizeGrad kernel
        def __init__(self, values):
            self.values, self.attrs = values, tuple(values.items())

        def attr(self, name, default=None):
            return self.values.get(name, default)

    x = torch.randn(*x_shape, dtype=torch.float64)
    out_shape, scales = resize_plan(x_shape, attrs)
    forward, backward = Attrs(attrs), Attrs({**attrs, "shape": x_shape, "scales": scales})
    dy = torch.randn(*out_shape, dtype=torch.float64)
    assert resize._upsampling(forward, x_shape, out_shape, scales) is not None
    fast = resize.resize(forward, [x]), resize.resize_grad(backward, [dy])
    monkeypatch.setattr(resize, "_upsampling", lambda *_: None)
    taps = resize.resize(forward, [x]), resize.resize_grad(backward, [dy])
    for a, b in zip(fast, taps, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
