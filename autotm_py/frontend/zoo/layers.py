"""`NetBuilder`: the shared ONNX-building helper of the zoo.

Every zoo model is written against this small builder so that the model files stay short:
it names nodes and tensors uniquely under nested scopes, keeps constants small and shared, and
declares every weight as an initializer whose data lives in an *external* file (offset and
length reserved now, bytes written only by `export_model(..., with_weights=True)`). A model
without its weights is therefore a few hundred KB whatever its parameter count.

Conventions the builders rely on:
- Initializers are trainable weights (plus BatchNormalization's running statistics, which ONNX
  can only carry as initializers). Every other constant (shapes, scalars, masks, tables) is a
  `Constant` node, so an importer can tell weights from constants without guessing.
- Reshape targets use 0 (copy the input dim) and -1 (infer) wherever a dim is symbolic, so
  one file serves every batch size and sequence length.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# Offsets in the weights file are aligned like this so that a loader can memory-map them.
ALIGN = 4096
DEFAULT_DIMS_KEY = "autotm.default_dims"
INDEX_RANGES_KEY = "autotm.index_ranges"
# A weight whose initial value is a fixed constant chosen by the model says so in its
# doc_string (e.g. the zero-initialized last BatchNorm scale of a residual branch).
INIT_DOC_PREFIX = "autotm.init="
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64

Dim = int | str


@dataclass(frozen=True)
class Act:
    """An NCHW activation while a CNN is being built: its tensor name and channel count."""

    name: str
    ch: int


class NetBuilder:
    """Collects the nodes, weights, constants, inputs and outputs of one ONNX graph."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.location = f"{name}.weights.bin"
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._scope: list[str] = []
        self._used: Counter[str] = Counter()
        self._consts: dict[tuple[str, tuple[int, ...], bytes], str] = {}
        self._offset = 0

    # ---- names -------------------------------------------------------------------------
    @contextmanager
    def scope(self, name: str | int) -> Iterator[None]:
        """Prefix every name made inside with `name.` (e.g. `layer1.0.conv1.weight`)."""
        self._scope.append(str(name))
        try:
            yield
        finally:
            self._scope.pop()

    def fresh(self, base: str) -> str:
        """A name unique in the graph: the scoped base, with `_N` added on repeats."""
        full = ".".join([*self._scope, base])
        self._used[full] += 1
        count = self._used[full]
        return full if count == 1 else f"{full}_{count - 1}"

    # ---- tensors -----------------------------------------------------------------------
    def weight(self, base: str, shape: Sequence[int], init: float | None = None) -> str:
        """A float32 initializer whose data is external: [offset, offset+length) of the file.

        `init` fixes its initial value (for `--with-weights`); otherwise `weights.init_scale`
        derives it from the op that uses it.
        """
        tensor = TensorProto()
        tensor.name = self.fresh(base)
        if init is not None:
            tensor.doc_string = f"{INIT_DOC_PREFIX}{init}"
        tensor.data_type = FLOAT
        tensor.dims.extend(int(d) for d in shape)
        length = int(np.prod(shape, dtype=np.int64)) * 4
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", self._offset),
                           ("length", length)):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
        self._offset += -(-length // ALIGN) * ALIGN
        self.weights.append(tensor)
        return tensor.name

    def const(self, value: np.ndarray | Sequence[int] | float, dtype: type = np.int64) -> str:
        """A `Constant` node (shared between identical values): shapes, axes, scalars, tables."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            name = f"const.{len(self._consts)}"
            tensor = numpy_helper.from_array(array, name=name)
            self.nodes.append(helper.make_node("Constant", [], [name], name=name, value=tensor))
            self._consts[key] = name
        return self._consts[key]

    def scalar(self, value: float) -> str:
        return self.const(np.float32(value), np.float32)

    # ---- nodes -------------------------------------------------------------------------
    def op(self, op_type: str, *inputs: str, **attrs: object) -> str:
        """Append a node with one output; returns the output's name (`op_multi` for several)."""
        return self.op_multi(op_type, *inputs, **attrs)[0]

    def op_multi(self, op_type: str, *inputs: str, outputs: int = 1,
                 **attrs: object) -> list[str]:
        node_name = self.fresh(op_type)
        outs = [node_name if outputs == 1 else f"{node_name}.out{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=node_name, **attrs))
        return outs

    def add_input(self, name: str, elem_type: int, dims: Sequence[Dim]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(dims)))
        return name

    def add_output(self, tensor: str, name: str, dims: Sequence[Dim]) -> str:
        """Expose `tensor` as graph output `name`, renaming it in place (an Identity would copy
        what is often the largest tensor of the model, e.g. GPT-2's logits)."""
        for node in self.nodes:
            for slots in (node.input, node.output):
                for i, value in enumerate(slots):
                    if value == tensor:
                        slots[i] = name
        self.outputs.append(helper.make_tensor_value_info(name, FLOAT, list(dims)))
        return name

    def build(self, default_dims: Mapping[str, int], doc: str,
              index_ranges: Mapping[str, object] | None = None) -> onnx.ModelProto:
        """The ModelProto (opset 17) with the default dim bindings in its metadata."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs,
                                  initializer=self.weights, doc_string=doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="autotm_py.zoo", doc_string=doc)
        model.ir_version = 8  # opset 17 needs IR >= 8; older runtimes read 8 fine
        meta = {DEFAULT_DIMS_KEY: json.dumps(dict(default_dims))}
        if index_ranges:
            meta[INDEX_RANGES_KEY] = json.dumps(dict(index_ranges))
        helper.set_model_props(model, meta)
        return model


# ---- CNN layers (NCHW) ---------------------------------------------------------------------
def _pair(k: int | tuple[int, int]) -> tuple[int, int]:
    return (k, k) if isinstance(k, int) else k


def conv(b: NetBuilder, x: Act, cout: int, kernel: int | tuple[int, int], *, stride: int = 1,
         pad: int | tuple[int, int] | None = None, bias: bool = False, name: str = "conv") -> Act:
    """Conv with square stride; `pad=None` keeps the size ('same' for odd kernels)."""
    kh, kw = _pair(kernel)
    ph, pw = (kh // 2, kw // 2) if pad is None else _pair(pad)
    with b.scope(name):
        w = b.weight("weight", (cout, x.ch, kh, kw))
        args = [x.name, w, b.weight("bias", (cout,))] if bias else [x.name, w]
        out = b.op("Conv", *args, kernel_shape=[kh, kw], strides=[stride, stride],
                   pads=[ph, pw, ph, pw])
    return Act(out, cout)


def batchnorm(b: NetBuilder, x: Act, *, eps: float = 1e-5, name: str = "bn",
              zero_gamma: bool = False) -> Act:
    """`zero_gamma`: start the scale at 0 (the last BN of a residual branch, Goyal et al. 2017,
    so that random weights keep a 200-layer ResNet's activations at a sane scale)."""
    with b.scope(name):
        scale = b.weight("weight", (x.ch,), init=0.0 if zero_gamma else None)
        params = [b.weight(p, (x.ch,)) for p in ("bias", "running_mean", "running_var")]
        out = b.op("BatchNormalization", x.name, scale, *params, epsilon=eps)
    return Act(out, x.ch)


def relu(b: NetBuilder, x: Act) -> Act:
    return Act(b.op("Relu", x.name), x.ch)


def conv_bn(b: NetBuilder, x: Act, cout: int, kernel: int | tuple[int, int], *,
            stride: int = 1, pad: int | tuple[int, int] | None = None, act: bool = True,
            eps: float = 1e-5, zero_gamma: bool = False, name: str = "conv") -> Act:
    """Conv (no bias) -> BatchNorm -> optional ReLU, the unit of ResNet and Inception."""
    with b.scope(name):
        y = conv(b, x, cout, kernel, stride=stride, pad=pad)
        y = batchnorm(b, y, eps=eps, zero_gamma=zero_gamma)
    return relu(b, y) if act else y


def bn_relu_conv(b: NetBuilder, x: Act, cout: int, kernel: int, *, name: str) -> Act:
    """Pre-activation unit (DenseNet): BatchNorm -> ReLU -> Conv (no bias)."""
    with b.scope(name):
        return conv(b, relu(b, batchnorm(b, x)), cout, kernel)


def pool(b: NetBuilder, x: Act, kind: str, kernel: int, stride: int, pad: int = 0) -> Act:
    """MaxPool or AveragePool (padding excluded from averages, as ONNX's default)."""
    op = {"max": "MaxPool", "avg": "AveragePool"}[kind]
    out = b.op(op, x.name, kernel_shape=[kernel, kernel], strides=[stride, stride],
               pads=[pad] * 4)
    return Act(out, x.ch)


def concat(b: NetBuilder, parts: Sequence[Act], axis: int = 1) -> Act:
    return Act(b.op("Concat", *(p.name for p in parts), axis=axis), sum(p.ch for p in parts))


def gemm(b: NetBuilder, x: str, fin: int, fout: int, *, name: str = "fc") -> str:
    """A Linear layer on a (batch, fin) matrix as exporters write it: Gemm with transB."""
    with b.scope(name):
        w, bias = b.weight("weight", (fout, fin)), b.weight("bias", (fout,))
        return b.op("Gemm", x, w, bias, transB=1)


def image_input(b: NetBuilder, size: int) -> Act:
    return Act(b.add_input("images", FLOAT, ["batch", 3, size, size]), 3)


def classifier_head(b: NetBuilder, x: Act, classes: int = 1000) -> str:
    """Global average pool -> flatten -> Linear: the head of ResNet, DenseNet, Inception."""
    flat = b.op("Flatten", b.op("GlobalAveragePool", x.name), axis=1)
    return b.add_output(gemm(b, flat, x.ch, classes), "logits", ["batch", classes])
