"""The forward op vocabulary: which ONNX ops the IR carries, and their canonical form.

Every op here is imported by the frontend, has a training rule (`ir/training.py`) and a torch
kernel (`runtime/kernels.py`); tests check the three lists agree.

Canonical form (what a `Kernel` of domain "" looks like, whatever the ONNX opset of the file):
- `inputs` are the op's *data* slots below, in order; trailing absent optionals are dropped.
- The op's *parameter* operands (constants that parametrize it, inputs in newer opsets and
  attributes in older ones) are stored in `attrs` under the names below.
- Other ONNX attributes keep their ONNX names; defaults are filled in by the importer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpInfo:
    """`data`: names of the tensor slots; `params`: operands folded into attrs."""

    data: tuple[str, ...]
    params: tuple[str, ...] = ()
    optional_data: int = 0  # how many trailing data slots may be absent


def _op(data: str, params: str = "", optional: int = 0) -> OpInfo:
    return OpInfo(tuple(data.split()), tuple(params.split()), optional)


FORWARD_OPS: dict[str, OpInfo] = {
    # convolution, matrix products
    "Conv": _op("X W B", optional=1),
    "ConvTranspose": _op("X W B", optional=1),
    "Gemm": _op("A B C", optional=1),
    "MatMul": _op("A B"),
    # elementwise, binary with broadcasting
    "Add": _op("A B"), "Sub": _op("A B"), "Mul": _op("A B"), "Div": _op("A B"),
    "Pow": _op("X Y"), "Max": _op("A B"), "Min": _op("A B"),
    "Where": _op("condition X Y"),
    "Sum": _op("data_0 data_1 data_2 data_3 data_4 data_5 data_6 data_7", optional=6),
    # elementwise, unary
    "Relu": _op("X"), "LeakyRelu": _op("X"), "Sigmoid": _op("X"), "Tanh": _op("X"),
    "Erf": _op("X"), "Gelu": _op("X"), "Sqrt": _op("X"), "Reciprocal": _op("X"),
    "Neg": _op("X"), "Exp": _op("X"), "Log": _op("X"), "Abs": _op("X"),
    "Identity": _op("input"), "Cast": _op("input"),
    "Clip": _op("input", "min max"),
    "Dropout": _op("data", "ratio training_mode"),
    # normalization, softmax
    "BatchNormalization": _op("X scale B input_mean input_var"),
    "LayerNormalization": _op("X Scale B", optional=1),
    "LRN": _op("X"),
    "Softmax": _op("input"), "LogSoftmax": _op("input"),
    # pooling
    "MaxPool": _op("X"), "AveragePool": _op("X"),
    "GlobalAveragePool": _op("X"), "GlobalMaxPool": _op("X"),
    # reductions
    "ReduceMean": _op("data", "axes"), "ReduceSum": _op("data", "axes"),
    # shape and data movement
    "Reshape": _op("data", "shape"), "Flatten": _op("input"), "Transpose": _op("data"),
    "Squeeze": _op("data", "axes"), "Unsqueeze": _op("data", "axes"),
    "Concat": _op("inputs"),  # variadic: every input is a data slot
    "Split": _op("input", "split"),
    "Slice": _op("data", "starts ends axes steps"),
    "Gather": _op("data indices"),
    "Expand": _op("input", "shape"), "Tile": _op("input", "repeats"),
    "Pad": _op("data", "pads constant_value axes"),
    "Resize": _op("X", "roi scales sizes"),
    "Trilu": _op("input", "k"),
    # a loss that a graph may already contain
    "SoftmaxCrossEntropyLoss": _op("scores labels weights", optional=1),
}

VARIADIC_OPS = frozenset({"Concat", "Sum"})

SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(FORWARD_OPS))
