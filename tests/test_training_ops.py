"""Every forward op trains: its backward kernels match torch.autograd on its forward kernel.

Each case builds a one-op graph (float operands are trainable weights, so every slot that can
get a gradient gets one), derives training (SGD), and compares two steps of the derived graph
(`train_steps`) with torch.autograd + torch.optim on the same forward kernels
(`autograd_steps`): loss, forward output, every weight gradient and every updated weight.
The loss reads all float outputs flattened into one row, so every element gets a gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from autotm_py.ir import GraphBuilder, Role, TensorGraph
from autotm_py.ir.graph import Kernel, freeze_attrs
from autotm_py.ir.ops import FORWARD_OPS
from autotm_py.ir.rules import RULES, TRAINING_OPS
from autotm_py.ir.rules.fused import FUSED_OPS
from autotm_py.ir.training import derive_training
from autotm_py.kernels import SUPPORTED_KERNELS, TORCH_DTYPES, run_kernel
from autotm_py.runtime.reference import autograd_steps, init_values, train_steps

DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
RNG = np.random.default_rng(7)


@dataclass
class In:
    """One operand: a trainable weight unless `role` says otherwise; `value` fixes it."""

    shape: tuple[int, ...]
    role: Role = Role.WEIGHT
    dtype: str = "float32"
    value: np.ndarray | None = None


def W(*shape: int, value: Any = None) -> In:
    return In(shape, value=None if value is None else np.asarray(value, dtype=np.float32))


def positive(*shape: int) -> In:
    return W(*shape, value=RNG.uniform(0.5, 2.0, shape))


def const(value: Any, dtype: str | None = None) -> In:
    arr = np.asarray(value) if dtype is None else np.asarray(value, dtype=dtype)
    return In(arr.shape, Role.CONSTANT, str(arr.dtype), arr)


@dataclass
class Case:
    op: str
    ins: list[In]
    attrs: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    n_out: int = 1
    use: tuple[int, ...] | None = None  # outputs the loss reads (None: every float output)
    head: bool = True  # False: the op itself is the loss
    loss: str = "auto"  # the derivation's --loss (with head=False: on the op's own output)


def _probe(case: Case, args: list[torch.Tensor]) -> list[torch.Tensor]:
    kernel = Kernel(0, "probe", case.op, "", freeze_attrs(case.attrs),
                    tuple(range(len(args))), tuple(range(case.n_out)), "")
    return run_kernel(kernel, args)


def _leaf(spec: In) -> torch.Tensor:
    if spec.value is not None:
        return torch.as_tensor(spec.value)
    dtype = TORCH_DTYPES[spec.dtype]
    return torch.randn(spec.shape).to(dtype) if dtype.is_floating_point else torch.zeros(
        spec.shape, dtype=dtype)


def _head(b: GraphBuilder, outs: list[int], shapes: list[tuple[int, ...]],
          dtypes: list[str]) -> int:
    """Flatten the chosen outputs into one (1, n) row of logits for the loss."""
    rows = []
    for j, (o, shape) in enumerate(zip(outs, shapes, strict=True)):
        row = b.add_tensor(f"row{j}", (1, int(np.prod(shape))), dtypes[j], Role.ACTIVATION)
        b.add_kernel("Reshape", [o], [row], attrs={"shape": (1, -1)})
        rows.append(row)
    width = sum(b.shape_of(r)[1] for r in rows)
    logits = rows[0]
    if len(rows) > 1:
        logits = b.add_tensor("rows", (1, width), dtypes[0], Role.ACTIVATION)
        b.add_kernel("Concat", rows, [logits], attrs={"axis": 1})
    if width == 1:  # one logit has no softmax gradient: spread it over three classes
        spread = b.add_constant("spread", np.array([[1.0, -2.0, 0.5]], dtype=dtypes[0]))
        wide = b.add_tensor("wide", (1, 3), dtypes[0], Role.ACTIVATION)
        b.add_kernel("Mul", [logits, spread], [wide])
        logits = wide
    return logits


def op_graph(case: Case) -> tuple[TensorGraph, dict[str, np.ndarray]]:
    """The one-op graph of a case, and the fixed weight values by name."""
    b = GraphBuilder(f"op_{case.op}")
    ids, args, fixed = [], [], {}
    for i, spec in enumerate(case.ins):
        if spec.role == Role.CONSTANT:
            ids.append(b.add_constant(f"in{i}", spec.value))
        else:
            ids.append(b.add_tensor(f"in{i}", spec.shape, spec.dtype, spec.role))
            if spec.role in (Role.INPUT, Role.LABEL):
                b.inputs.append(ids[-1])
            if spec.value is not None:
                fixed[f"in{i}"] = spec.value
        args.append(_leaf(spec))
    results = _probe(case, args)
    outs = [b.add_tensor(f"out{j}", tuple(r.shape), DTYPE_NAMES[r.dtype], Role.ACTIVATION)
            for j, r in enumerate(results)]
    b.add_kernel(case.op, ids, outs, name=case.op, attrs=case.attrs,
                 domain="autotm" if case.op in FUSED_OPS else "")
    if not case.head:
        b.outputs.append(outs[0])
        return b.build(), fixed
    chosen = [j for j, r in enumerate(results) if r.dtype.is_floating_point
              and (case.use is None or j in case.use)]
    logits = _head(b, [outs[j] for j in chosen], [tuple(results[j].shape) for j in chosen],
                   [DTYPE_NAMES[results[j].dtype] for j in chosen])
    b.outputs.append(logits)
    return b.build(), fixed


def assert_close(ours: torch.Tensor, ref: torch.Tensor, what: str, rtol: float = 1e-4,
                 atol: float = 1e-7) -> None:
    """|ours - ref| <= atol + rtol * max|ref|, elementwise.

    Both sides run the same forward kernels in float32; they differ only in how backward
    formulas are arranged and summed, i.e. float32 rounding (~1e-7 relative per op). A wrong
    rule gives errors of the order of the values themselves, far above 1e-4 relative."""
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, (what, ours.shape, ref.shape)
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    err = float((ours - ref).abs().max()) if ref.numel() else 0.0
    assert err <= atol + rtol * scale, f"{what}: max error {err:.3g} vs max value {scale:.3g}"


def compare_training(graph: TensorGraph, *, steps: int = 2, optimizer: str = "sgd",
                     fixed: dict[str, np.ndarray] | None = None, seed: int = 0,
                     rtol: float = 1e-4, device: str = "cpu", loss: str = "auto"
                     ) -> TensorGraph:
    """Derive training and check `steps` iterations against torch.autograd + torch.optim."""
    train = derive_training(graph, optimizer=optimizer, loss=loss)
    values = init_values(train, seed, device)
    for name, value in (fixed or {}).items():
        values[train.by_name(name).id] = torch.as_tensor(value).to(device)
    grads = [g for _, g in train.meta["training"]["weight_grads"]]
    # by name: a dropped final Softmax (ir/training.py) takes its output away and moves the
    # ids after it
    names = {t.name: t.id for t in train.tensors}
    outputs = [names[graph.name_of(t)] for t in graph.outputs if graph.name_of(t) in names]
    ours = train_steps(train, steps, values=values, keep=grads + outputs)
    ref = autograd_steps(train, steps, values=values, keep=outputs)
    for step, (got, want) in enumerate(zip(ours, ref, strict=True)):
        assert set(want) <= set(got)
        for tid, value in want.items():
            assert_close(got[tid], value, f"step {step}: {train.name_of(tid)}", rtol=rtol)
    return train


CASES: list[Case] = [
    Case("Conv", [W(2, 3, 7, 7), W(4, 3, 3, 3), W(4)], {"pads": (1, 1, 1, 1),
         "strides": (2, 2)}, "stride-pad"),
    Case("Conv", [W(1, 4, 6, 6), W(4, 2, 3, 3)], {"group": 2, "dilations": (2, 1),
         "pads": (0, 1, 1, 0)}, "group-dilation-asymmetric"),
    Case("Conv", [W(2, 3, 9), W(2, 3, 4)], {"auto_pad": "SAME_UPPER", "strides": (2,)},
         "1d-same-upper"),
    Case("ConvTranspose", [W(1, 4, 5, 5), W(4, 3, 3, 3), W(3)], {"strides": (2, 2),
         "pads": (1, 1, 1, 1), "output_padding": (1, 1)}, "stride-outpad"),
    Case("ConvTranspose", [W(1, 4, 4, 4), W(4, 2, 3, 3)], {"group": 2, "strides": (2, 2),
         "pads": (1, 0, 0, 2)}, "group-asymmetric"),
    # one gradient only: ConvGradData (a fixed filter), ConvGradFilter + ConvGradBias (an
    # input image, as the first layer of a network), and the same for ConvTranspose
    Case("Conv", [W(2, 3, 7, 7), In((4, 3, 3, 3), Role.INPUT)], {"pads": (0, 1, 1, 0),
         "strides": (2, 1)}, "data-only-asymmetric"),
    Case("Conv", [In((2, 3, 7, 7), Role.INPUT), W(4, 3, 3, 3), W(4)], {"pads": (1, 1, 2, 0)},
         "filter-bias-only"),
    Case("ConvTranspose", [W(1, 4, 5, 5), In((4, 3, 3, 3), Role.INPUT)], {"strides": (2, 2),
         "pads": (1, 1, 1, 1), "output_padding": (1, 1)}, "data-only"),
    Case("ConvTranspose", [In((1, 4, 4, 4), Role.INPUT), W(4, 2, 3, 3), W(4)], {"group": 2,
         "strides": (2, 2), "pads": (1, 0, 0, 2)}, "filter-bias-only"),
    Case("Gemm", [W(3, 4), W(5, 4), W(5)], {"transB": 1, "alpha": 0.5, "beta": 2.0}, "transB"),
    Case("Gemm", [W(4, 3), W(4, 5), W(3, 1)], {"transA": 1}, "transA-column-bias"),
    Case("Gemm", [W(4, 3), W(5, 4)], {"transA": 1, "transB": 1}, "both-no-bias"),
    Case("MatMul", [W(2, 3, 4), W(4, 5)], id="batched-shared"),
    Case("MatMul", [W(4), W(2, 4, 3)], id="vector-left"),
    Case("MatMul", [W(2, 1, 3, 4), W(3, 4, 2)], id="broadcast-batch"),
    Case("MatMul", [W(3, 4), W(4)], id="vector-right"),
    Case("Add", [W(2, 3, 4), W(3, 1)], id="broadcast"),
    Case("Sub", [W(3, 1), W(2, 3, 4)], id="broadcast"),
    Case("Mul", [W(2, 3, 4), W(4)], id="broadcast"),
    Case("Div", [W(2, 3), positive(3)], id="broadcast"),
    Case("Pow", [positive(2, 3), W(3, value=[2.0, 0.5, -1.0])], id="broadcast"),
    Case("Max", [W(2, 3, value=[[1, 2, 3], [0, 5, -1]]), W(3, value=[1, 0, 4])], id="ties"),
    Case("Min", [W(2, 3, value=[[1, 2, 3], [0, 5, -1]]), W(3, value=[1, 0, 4])], id="ties"),
    Case("Where", [const(RNG.random((2, 3, 4)) > 0.5), W(2, 3, 4), W(4)], id="broadcast"),
    Case("Sum", [W(2, 3), W(3), W(2, 3)], id="three"),
    Case("Relu", [W(3, 5)]), Case("LeakyRelu", [W(3, 5)], {"alpha": 0.2}),
    Case("Sigmoid", [W(3, 5)]), Case("Tanh", [W(3, 5)]), Case("Erf", [W(3, 5)]),
    Case("Gelu", [W(3, 5)], id="exact"),
    Case("Gelu", [W(3, 5)], {"approximate": "tanh"}, "tanh"),
    Case("Sqrt", [positive(3, 5)]), Case("Reciprocal", [positive(3, 5)]),
    Case("Neg", [W(3, 5)]), Case("Exp", [W(3, 5)]), Case("Log", [positive(3, 5)]),
    Case("Abs", [W(3, 5)]), Case("Identity", [W(3, 5)]),
    Case("Cast", [W(3, 5)], {"to": "float64"}, "to-float64"),
    Case("Cast", [W(3, 5)], {"to": 1}, "onnx-code"),
    Case("Clip", [W(3, 5)], {"min": -0.5, "max": 0.5}, "both"),
    Case("Clip", [W(3, 5)], {"min": 0.0}, "min-only"),
    Case("Dropout", [W(4, 8)], {"ratio": 0.3}, "train"),
    Case("Dropout", [W(4, 8)], {"ratio": 0.0}, "ratio-zero"),
    Case("BatchNormalization", [W(3, 4, 5, 5), positive(4), W(4), W(4), positive(4)],
         {"epsilon": 1e-5, "momentum": 0.9}, "4d"),
    Case("BatchNormalization", [W(6, 3), positive(3), W(3), W(3), positive(3)], id="2d"),
    Case("LayerNormalization", [W(2, 3, 8), positive(8), W(8)], {"axis": -1}, "last"),
    Case("LayerNormalization", [W(2, 3, 4), positive(3, 4)], {"axis": 1}, "axis1-no-bias"),
    Case("LRN", [W(2, 5, 3, 3)], {"size": 3, "alpha": 0.1, "beta": 0.75, "bias": 2.0}, "odd"),
    Case("LRN", [W(2, 6, 2)], {"size": 4, "alpha": 0.2}, "even"),
    # mse: cross-entropy on a Softmax's probabilities is refused (tests/test_loss_outputs.py)
    Case("Softmax", [W(2, 3, 4)], {"axis": 1}, "axis1", loss="mse"),
    Case("LogSoftmax", [W(2, 3, 4)], {"axis": -1}, "last"),
    Case("MaxPool", [W(1, 2, 6, 6)], {"kernel_shape": (3, 3), "strides": (2, 2),
         "pads": (1, 1, 1, 1)}, "pad"),
    Case("MaxPool", [W(1, 2, 7, 7)], {"kernel_shape": (2, 2), "strides": (2, 2),
         "ceil_mode": 1}, "ceil"),
    Case("MaxPool", [W(1, 2, 7, 7)], {"kernel_shape": (2, 2), "dilations": (2, 2),
         "pads": (0, 1, 1, 0)}, "dilated-asymmetric"),
    Case("MaxPool", [W(2, 3, 9)], {"kernel_shape": (3,), "strides": (2,)}, "1d"),
    Case("MaxPool", [W(1, 2, 4, 4, 4)], {"kernel_shape": (2, 2, 2), "strides": (2, 2, 2)},
         "3d"),
    Case("MaxPool", [W(1, 2, 4, 4)], {"kernel_shape": (2, 2), "strides": (2, 2)},
         "indices", n_out=2),
    Case("AveragePool", [W(1, 2, 6, 6)], {"kernel_shape": (3, 3), "strides": (2, 2),
         "pads": (1, 1, 1, 1)}, "exclude-pad"),
    Case("AveragePool", [W(1, 2, 6, 6)], {"kernel_shape": (3, 3), "strides": (2, 2),
         "pads": (1, 1, 1, 1), "count_include_pad": 1, "ceil_mode": 1}, "include-pad-ceil"),
    Case("AveragePool", [W(1, 2, 7, 7)], {"kernel_shape": (3, 2), "pads": (0, 1, 2, 0)},
         "asymmetric"),
    Case("AveragePool", [W(1, 2, 7, 7)], {"kernel_shape": (2, 2), "dilations": (2, 2),
         "strides": (2, 2), "ceil_mode": 1, "count_include_pad": 1, "pads": (1, 1, 1, 1)},
         "dilated-ceil"),
    Case("AveragePool", [W(2, 3, 9)], {"kernel_shape": (3,), "strides": (2,)}, "1d"),
    Case("AveragePool", [W(1, 2, 4, 4, 4)], {"kernel_shape": (2, 2, 2),
         "strides": (2, 2, 2)}, "3d"),
    Case("GlobalAveragePool", [W(2, 3, 4, 4)]), Case("GlobalMaxPool", [W(2, 3, 4, 4)]),
    Case("ReduceMean", [W(2, 3, 4)], {"axes": (1,), "keepdims": 0}, "drop"),
    Case("ReduceSum", [W(2, 3, 4)], {"axes": (0, -1), "keepdims": 1}, "keep"),
    Case("ReduceSum", [W(2, 3)], {"keepdims": 0}, "all-to-scalar"),
    Case("Reshape", [W(2, 3, 4)], {"shape": (0, -1)}, "zero-and-infer"),
    Case("Flatten", [W(2, 3, 4)], {"axis": 2}),
    Case("Squeeze", [W(2, 1, 4)], {"axes": (1,)}),
    Case("Unsqueeze", [W(2, 4)], {"axes": (0, 3)}),
    Case("Transpose", [W(2, 3, 4)], {"perm": (2, 0, 1)}, "perm"),
    Case("Transpose", [W(2, 3, 4)], id="reverse"),
    Case("Concat", [W(2, 1, 3), In((2, 2, 3), Role.INPUT), W(2, 3, 3)], {"axis": 1},
         "with-input"),
    Case("Split", [W(2, 3, 4)], {"axis": 1, "split": (1, 2)}, "both-used", n_out=2),
    Case("Split", [W(2, 6)], {"axis": -1}, "first-used", n_out=3, use=(0,)),
    Case("Slice", [W(4, 3, 5)], {"starts": (1, 0), "ends": (3, 100), "axes": (0, 2),
         "steps": (1, 2)}, "steps"),
    Case("Slice", [W(4, 6)], {"starts": (-1,), "ends": (-1000,), "axes": (1,),
         "steps": (-2,)}, "negative-step"),
    Case("Gather", [W(5, 3), const([[0, 4], [4, 1]], "int64")], {"axis": 0}, "embedding"),
    Case("Gather", [W(2, 4, 3), const([3, -1, 0], "int64")], {"axis": 1}, "axis1-negative"),
    Case("Gather", [W(4, 3), const(2, "int64")], {"axis": 0}, "scalar-index"),
    Case("Expand", [W(3, 1)], {"shape": (2, 3, 4)}),
    Case("Tile", [W(2, 3)], {"repeats": (2, 1)}),
    Case("Pad", [W(2, 3)], {"pads": (0, 1, 2, 0), "constant_value": 0.5}, "constant"),
    Case("Pad", [W(2, 3, 5)], {"pads": (2, 1), "axes": (-1,), "mode": "reflect"}, "reflect"),
    Case("Pad", [W(2, 3, 5)], {"pads": (0, 1, 2, 1, 0, 3), "mode": "edge"}, "edge"),
    Case("Pad", [W(3, 5)], {"pads": (0, -1, 1, -2)}, "negative"),
    Case("Resize", [W(1, 2, 3, 3)], {"scales": (1, 1, 2, 2), "mode": "nearest",
         "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
         "nearest-up"),
    Case("Resize", [W(1, 2, 4, 5)], {"sizes": (1, 2, 5, 7), "mode": "linear"}, "linear"),
    Case("Resize", [W(1, 2, 4, 5)], {"sizes": (3, 8), "axes": (2, 3), "mode": "linear",
         "coordinate_transformation_mode": "align_corners"}, "linear-align"),
    Case("Resize", [W(1, 1, 5, 5)], {"scales": (1, 1, 1.5, 0.6), "mode": "cubic",
         "exclude_outside": 1}, "cubic"),
    Case("Trilu", [W(2, 4, 4)], {"upper": 1, "k": 1}, "upper"),
    Case("Trilu", [W(4, 3)], {"upper": 0, "k": -1}, "lower"),
    Case("SoftmaxCrossEntropyLoss", [W(3, 5), const([1, 4, 0], "int64")], id="mean",
         head=False),
    Case("SoftmaxCrossEntropyLoss", [W(2, 4, 3), const([[1, 3, 0], [2, 2, 1]], "int64"),
         const([1.0, 2.0, 0.5, 1.5], "float32")], {"ignore_index": 2, "reduction": "sum"},
         "weighted-ignore-3d", head=False),
    # fused ops of frontend/fuse.py
    Case("ScaledDotProductAttention", [W(2, 2, 4, 3), W(2, 2, 5, 3), W(2, 2, 5, 3)],
         {"scale": 0.5, "is_causal": 0}, "no-mask"),
    Case("ScaledDotProductAttention", [W(1, 2, 5, 4), W(1, 2, 5, 4), W(1, 2, 5, 4),
         const(RNG.standard_normal((2, 1, 5)).astype(np.float32))],
         {"scale": 0.3, "is_causal": 1}, "causal-additive"),
    Case("ScaledDotProductAttention", [W(3, 4, 2), W(3, 6, 2), W(3, 6, 5),
         const(np.tri(4, 6, 2, dtype=bool))], {"scale": 1.5, "is_causal": 0},
         "rank3-bool-head-sizes"),
    Case("ScaledDotProductAttention", [W(2, 5, 2, 3), W(2, 4, 2, 3), W(2, 4, 2, 3),
         const(RNG.standard_normal((2, 1, 1, 4)).astype(np.float32))],
         {"scale": 0.5, "is_causal": 1, "layout": "blhe"}, "blhe-causal-padding-mask"),
    Case("Linear", [W(2, 3, 4), W(4, 5), W(5)], id="bias"),
    Case("Linear", [W(3, 4), W(5, 4)], {"transB": 1}, "transB-no-bias"),
    Case("Linear", [In((2, 3, 4), Role.INPUT), W(5, 4), W(1, 1, 5)], {"transB": 1},
         "input-rows-bias-leading-ones"),
    Case("ConvRelu", [W(2, 3, 7, 7), W(4, 3, 3, 3), W(4)], {"pads": (1, 1, 1, 1),
         "strides": (2, 2)}, "stride-pad-bias"),
    Case("ConvRelu", [In((2, 3, 7, 7), Role.INPUT), W(4, 3, 3, 3)], {"pads": (1, 1, 2, 0)},
         "filter-only-asymmetric"),
    Case("ConvRelu", [W(1, 4, 6, 6), W(4, 2, 3, 3)], {"group": 2, "dilations": (2, 1)},
         "grouped-dilated"),
    Case("RMSNormalization", [W(2, 3, 6), W(6)], {"axis": 2, "epsilon": 1e-6}, "weighted"),
    Case("RMSNormalization", [W(4, 5)], {"axis": 1, "epsilon": 0.1}, "no-weight"),
    Case("Silu", [W(2, 3, 4)]),
    # the rotary embedding: cos and sin tables are constants (no gradient), broadcast or not
    Case("RotaryEmbedding", [W(2, 3, 5, 8), const(np.cos(RNG.uniform(0, 6, (1, 1, 5, 8))),
         "float32"), const(np.sin(RNG.uniform(0, 6, (1, 1, 5, 8))), "float32")],
         id="broadcast-tables"),
    Case("RotaryEmbedding", [W(4, 6), const(RNG.standard_normal((4, 6)), "float32"),
         const(RNG.standard_normal((4, 6)), "float32")], id="full-tables"),
    # recurrent layers (ir/rules/recurrent.py): X, W, R, B and the initial states all trained
    Case("LSTM", [W(5, 2, 3), W(1, 16, 3), W(1, 16, 4), W(1, 32), W(1, 2, 4), W(1, 2, 4)],
         {"direction": "forward", "hidden_size": 4, "layout": 0}, "forward", n_out=3),
    Case("LSTM", [W(2, 4, 3), W(2, 16, 3), W(2, 16, 4), W(2, 32), W(2, 2, 4), W(2, 2, 4)],
         {"direction": "bidirectional", "hidden_size": 4, "layout": 1}, "bidirectional-layout1",
         n_out=3, use=(1, 2)),
    Case("GRU", [W(4, 2, 3), W(1, 12, 3), W(1, 12, 4), W(1, 24), W(1, 2, 4)],
         {"direction": "reverse", "hidden_size": 4, "layout": 0, "linear_before_reset": 0},
         "reverse-lbr0", n_out=2),
    Case("GRU", [In((4, 2, 3), Role.INPUT), W(2, 12, 3), W(2, 12, 4), W(2, 24),
         const(np.zeros((2, 2, 4), np.float32))], {"direction": "bidirectional",
         "hidden_size": 4, "layout": 0, "linear_before_reset": 1}, "bidirectional-y-only",
         n_out=2, use=(0,)),
    # the derived loss on an output without a head (ir/loss.py): per-pixel classes on axis 1,
    # a pooled N x C x 1 x 1 classifier (labels (N,)), mean squared error on one channel
    Case("Conv", [W(2, 3, 5, 5), W(4, 3, 3, 3)], id="loss-per-pixel-axis1", head=False),
    Case("GlobalAveragePool", [W(2, 4, 3, 3)], id="loss-pooled-classifier", head=False),
    Case("Conv", [W(2, 3, 5, 5), W(1, 3, 3, 3)], id="loss-mse", head=False, loss="mse"),
    Case("MatMul", [W(2, 3, 4), W(4, 5)], id="loss-ce-axis1", head=False, loss="ce-axis1"),
]


def _case_id(case: Case) -> str:
    return f"{case.op}-{case.id}" if case.id else case.op


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_op_backward_matches_autograd(case: Case) -> None:
    graph, fixed = op_graph(case)
    train = compare_training(graph, fixed=fixed, loss=case.loss)
    assert train.meta["training"]["weight_grads"], "the case trains no weight"


def test_every_forward_op_has_rule_kernel_and_case() -> None:
    ops = set(FORWARD_OPS)
    assert ops <= set(RULES), ops - set(RULES)
    assert ops <= SUPPORTED_KERNELS, ops - SUPPORTED_KERNELS
    assert set(TRAINING_OPS) <= SUPPORTED_KERNELS, set(TRAINING_OPS) - SUPPORTED_KERNELS
    assert ops <= {c.op for c in CASES}, ops - {c.op for c in CASES}


def test_every_training_op_is_emitted_by_some_case() -> None:
    emitted = set()
    for case in CASES:
        graph, _ = op_graph(case)
        for optimizer in ("sgd", "adam"):
            emitted |= {k.op_type for k in derive_training(graph, optimizer=optimizer,
                                                           loss=case.loss).kernels
                        if k.domain == "autotm"}
    # the chunked loss replaces a fused Linear head (--loss-chunks): a decoder, not an op case
    from autotm_py.frontend.fuse import fuse_graph
    from tests.test_training_models import tiny_decoder

    chunked = derive_training(fuse_graph(tiny_decoder()), loss_chunks=2)
    emitted |= {k.op_type for k in chunked.kernels if k.domain == "autotm"}
    assert set(TRAINING_OPS) - {"SoftmaxCrossEntropy"} <= emitted | {"GradAccumulate"}
    assert emitted <= set(TRAINING_OPS), emitted - set(TRAINING_OPS)
