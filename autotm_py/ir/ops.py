"""The forward op vocabulary: which ONNX ops the IR carries, and their canonical form.

Every op here is imported by the frontend, has a training rule (`ir/training.py`) and a torch
kernel (`kernels/__init__.py`); tests check the three lists agree.

Canonical form (what a `Kernel` of domain "" looks like, whatever the ONNX opset of the file):
- `inputs` are the op's *data* slots below, in order; trailing absent optionals are dropped.
- The op's *parameter* operands (constants that parametrize it, inputs in newer opsets and
  attributes in older ones) are stored in `attrs` under the names in `params`.
- The ONNX attributes in `attrs` keep their ONNX names with ONNX defaults filled in. Every
  kernel's attrs hold exactly `params + attrs` of its op, nothing else.
- Shapes are static, so values are explicit: axes are non-negative, `auto_pad` is resolved into
  `pads` (and dropped), `kernel_shape` is filled from the weight. Details per op below and in
  docs/import.md.

Per-op notes (the training rules and torch kernels rely on these):
- Conv/ConvTranspose/MaxPool/AveragePool: `pads` is [x1_begin, x2_begin, ..., x1_end, ...]
  and may be asymmetric; ConvTranspose's `output_shape` is folded into `pads`/`output_padding`.
- Gemm keeps `alpha beta transA transB`; C (optional) broadcasts to (M, N).
- Softmax/LogSoftmax have opset-13 semantics (one `axis`) at every opset: older files whose
  axis is not the last dimension are imported as Reshape -> Softmax(axis=1) -> Reshape.
- Max/Min are binary: an n-ary ONNX node becomes a chain of binary kernels. Sum takes 2..8
  inputs (longer sums become a chain of Sums).
- Cast: `to` is the target dtype as a string of `DTYPE_SIZES` ("float16", "int64"...).
- Clip: `min`/`max` are floats, or None when absent.
- Dropout: `ratio` (float), `training_mode` (0/1). In an imported (forward) graph, Dropout,
  BatchNormalization, MaxPool and LayerNormalization have exactly one output (Y): optional
  extra outputs are dropped (the training derivation may add its own).
- ReduceMean/ReduceSum: `axes` is explicit (all axes when the file gave none), `keepdims` 0/1.
- Reshape and Expand: `shape` is the explicit output shape (no 0 or -1 left).
- Squeeze/Unsqueeze: `axes` sorted, non-negative (Unsqueeze's relative to the output rank).
- Split: `split` lists every output's size along `axis`.
- Slice: `starts ends axes steps` all explicit, clamped as ONNX defines; clamping them again
  changes nothing (a negative-step slice through index 0 has `end` = -dim-1).
- Gather: `axis` non-negative; constant indices are a CONSTANT tensor with non-negative values.
- Pad: `pads` covers every axis (2 * rank values), `axes` lists all axes, `constant_value` is
  a number, `mode` is constant|reflect|edge|wrap.
- Resize (and opset-9 Upsample): `sizes` is the output shape, `scales` one float per axis
  (given, or sizes / input), `roi` a tuple (empty unless tf_crop_and_resize).
- Trilu: `k` (int) and `upper` (0/1).
- LSTM/GRU: data slots X W R B initial_h [initial_c] always present (an absent bias or
  initial state becomes a CONSTANT of zeros; ONNX's `sequence_lens` is not a slot: it is
  accepted only when every length is the full sequence, and LSTM's peepholes `P` are refused),
  outputs Y Y_h [Y_c] always present (fresh tensors where the file has none); `direction`
  forward|reverse|bidirectional, `hidden_size`, `layout` 0/1, GRU's `linear_before_reset`;
  default activations only, no `clip`, no `input_forget` (`frontend/canonical_rnn.py`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpInfo:
    """`data`: names of the tensor slots; `params`: operands folded into attrs; `attrs`: the
    ONNX attributes a kernel carries (defaults filled)."""

    data: tuple[str, ...]
    params: tuple[str, ...] = ()
    optional_data: int = 0  # how many trailing data slots may be absent
    attrs: tuple[str, ...] = ()

    @property
    def attr_names(self) -> frozenset[str]:
        """Every key of a canonical kernel's attrs."""
        return frozenset(self.params + self.attrs)


def _op(data: str, params: str = "", optional: int = 0, attrs: str = "") -> OpInfo:
    return OpInfo(tuple(data.split()), tuple(params.split()), optional, tuple(attrs.split()))


_CONV = "dilations group kernel_shape pads strides"
_NONE = _op("X")

FORWARD_OPS: dict[str, OpInfo] = {
    # convolution, matrix products
    "Conv": _op("X W B", optional=1, attrs=_CONV),
    "ConvTranspose": _op("X W B", optional=1, attrs=f"{_CONV} output_padding"),
    "Gemm": _op("A B C", optional=1, attrs="alpha beta transA transB"),
    "MatMul": _op("A B"),
    # elementwise, binary with broadcasting
    "Add": _op("A B"), "Sub": _op("A B"), "Mul": _op("A B"), "Div": _op("A B"),
    "Pow": _op("X Y"), "Max": _op("A B"), "Min": _op("A B"),
    "Where": _op("condition X Y"),
    "Sum": _op("data_0 data_1 data_2 data_3 data_4 data_5 data_6 data_7", optional=6),
    # elementwise, unary
    "Relu": _NONE, "LeakyRelu": _op("X", attrs="alpha"), "Sigmoid": _NONE, "Tanh": _NONE,
    "Erf": _NONE, "Gelu": _op("X", attrs="approximate"), "Sqrt": _NONE, "Reciprocal": _NONE,
    "Neg": _NONE, "Exp": _NONE, "Log": _NONE, "Abs": _NONE,
    "Identity": _op("input"), "Cast": _op("input", attrs="to"),
    "Clip": _op("input", "min max"),
    "Dropout": _op("data", "ratio training_mode"),
    # normalization, softmax
    "BatchNormalization": _op("X scale B input_mean input_var",
                              attrs="epsilon momentum training_mode"),
    "LayerNormalization": _op("X Scale B", optional=1, attrs="axis epsilon stash_type"),
    "LRN": _op("X", attrs="alpha beta bias size"),
    "Softmax": _op("input", attrs="axis"), "LogSoftmax": _op("input", attrs="axis"),
    # pooling
    "MaxPool": _op("X", attrs=f"ceil_mode {_CONV.replace('group ', '')} storage_order"),
    "AveragePool": _op("X", attrs="ceil_mode count_include_pad dilations kernel_shape pads "
                                  "strides"),
    "GlobalAveragePool": _NONE, "GlobalMaxPool": _NONE,
    # reductions
    "ReduceMean": _op("data", "axes", attrs="keepdims"),
    "ReduceSum": _op("data", "axes", attrs="keepdims"),
    # shape and data movement
    "Reshape": _op("data", "shape"), "Flatten": _op("input", attrs="axis"),
    "Transpose": _op("data", attrs="perm"),
    "Squeeze": _op("data", "axes"), "Unsqueeze": _op("data", "axes"),
    "Concat": _op("inputs", attrs="axis"),  # variadic: every input is a data slot
    "Split": _op("input", "split", attrs="axis"),
    "Slice": _op("data", "starts ends axes steps"),
    "Gather": _op("data indices", attrs="axis"),
    "Expand": _op("input", "shape"), "Tile": _op("input", "repeats"),
    "Pad": _op("data", "pads constant_value axes", attrs="mode"),
    "Resize": _op("X", "roi scales sizes",
                  attrs="antialias coordinate_transformation_mode cubic_coeff_a "
                        "exclude_outside extrapolation_value mode nearest_mode"),
    "Trilu": _op("input", "k", attrs="upper"),
    # recurrent layers (frontend/canonical_rnn.py)
    "LSTM": _op("X W R B initial_h initial_c", attrs="direction hidden_size layout"),
    "GRU": _op("X W R B initial_h", attrs="direction hidden_size layout linear_before_reset"),
    # a loss that a graph may already contain
    "SoftmaxCrossEntropyLoss": _op("scores labels weights", optional=1,
                                   attrs="ignore_index reduction"),
}

VARIADIC_OPS = frozenset({"Concat", "Sum"})

SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(FORWARD_OPS))
