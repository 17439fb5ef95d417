"""Canonical forms of ONNX's recurrent layers, `LSTM` and `GRU`, as torch exports them.

Both torch exporters write one ONNX node per layer (`nn.LSTM(num_layers=2)` is two nodes, the
second reading the first's Y through a Transpose/Reshape or a Squeeze), with ONNX's gate order
(LSTM iofc, GRU zrh) in W (D, G*H, I), R (D, G*H, H) and B (D, 2*G*H); batch-first modules
get Transposes around a `layout = 0` node. The dynamo exporter slices and concatenates the
module's own weights into that order (kernels on the weights: the trained tensors stay the
module's); the TorchScript exporter stores the reordered weights as initializers.

The canonical kernel has fixed slots, so that its rule and kernels need no optional logic:
inputs X W R B initial_h [initial_c] (an absent bias or initial state becomes a CONSTANT of
zeros), outputs Y Y_h [Y_c] (a fresh tensor where the file leaves one out); attrs
`direction hidden_size layout` and GRU's `linear_before_reset`. Refused, naming the attribute
or input: non-default activations (and their alpha/beta), `clip`, LSTM's `input_forget` and
peepholes `P`, and a `sequence_lens` that is not the full length for every batch entry.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autotm_py.errors import ModelImportError, UnsupportedOpError
from autotm_py.frontend.canonical_base import Ctx, Lowered, as_ints, canonical, spec
from autotm_py.frontend.onnx_graph import OnnxNode

GATES = {"LSTM": 4, "GRU": 3}
DEFAULT_ACTIVATIONS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh")}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
OUTPUTS = {"LSTM": ("Y", "Y_h", "Y_c"), "GRU": ("Y", "Y_h")}
SEQUENCE_LENS = 4  # ONNX's input slot of sequence_lens (both ops)


def _refuse(node: OnnxNode, ctx: Ctx, why: str) -> UnsupportedOpError:
    return UnsupportedOpError(node.op_type, opset=ctx.opset, node=node.label,
                              what=f"the ONNX importer {why}")


def _attrs(node: OnnxNode, ctx: Ctx) -> dict[str, Any]:
    """The canonical attrs, after refusing what the kernels do not compute."""
    a = node.attrs
    op = node.op_type
    direction = str(a.get("direction", "forward"))
    if direction not in DIRECTIONS:
        raise ModelImportError(f"{op} node '{node.label}' has direction {direction!r}; ONNX "
                               "allows forward, reverse or bidirectional")
    count = DIRECTIONS[direction]
    acts = a.get("activations")
    if acts and [s.lower() for s in acts] != list(DEFAULT_ACTIVATIONS[op]) * count:
        raise _refuse(node, ctx, f"with activations {list(acts)} (only the default "
                      f"{', '.join(DEFAULT_ACTIVATIONS[op])} per direction; re-export the "
                      "layer as separate ops)")
    for key in ("activation_alpha", "activation_beta", "clip"):
        if a.get(key) is not None and (key == "clip" or len(a[key])):
            raise _refuse(node, ctx, f"with attribute {key}={a[key]} (recurrent layers import "
                          "without cell clipping and with the default activations)")
    if op == "LSTM" and int(a.get("input_forget", 0)):
        raise _refuse(node, ctx, "with input_forget=1 (coupled input and forget gates)")
    if op == "LSTM" and node.input(7):
        raise _refuse(node, ctx, "with peephole weights P (input 7)")
    r_shape = ctx.shape(node.inputs[2])
    hidden = int(a.get("hidden_size", r_shape[-1]))
    layout = int(a.get("layout", 0))
    if layout not in (0, 1):
        raise ModelImportError(f"{op} node '{node.label}' has layout {layout}; ONNX allows 0 "
                               "or 1")
    attrs: dict[str, Any] = {"direction": direction, "hidden_size": hidden,
                                "layout": layout}
    if op == "GRU":
        attrs["linear_before_reset"] = int(a.get("linear_before_reset", 0))
    return attrs


def _check_sequence_lens(node: OnnxNode, ctx: Ctx, seq: int, batch: int) -> None:
    """Accepted only when absent or constant and the full length for every batch entry."""
    if not node.input(SEQUENCE_LENS):
        return
    lens = as_ints(ctx.value(node, SEQUENCE_LENS))
    if lens is None or len(lens) != batch or any(n != seq for n in lens):
        raise _refuse(node, ctx, f"with sequence_lens {lens} shorter than the sequence "
                      f"({seq} steps; variable lengths, as a PackedSequence exports, are not "
                      "supported: pad the batch to one length)")


def recurrent_shapes(op: str, x_shape: tuple[int, ...], attrs: dict[str, Any]
                     ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(Y's shape, the shape of Y_h, Y_c and the initial states) of a canonical kernel."""
    layout, hidden = int(attrs["layout"]), int(attrs["hidden_size"])
    dirs = DIRECTIONS[str(attrs["direction"])]
    if layout == 0:
        seq, batch = x_shape[0], x_shape[1]
        return (seq, dirs, batch, hidden), (dirs, batch, hidden)
    batch, seq = x_shape[0], x_shape[1]
    return (batch, seq, dirs, hidden), (batch, dirs, hidden)


def _check_weights(node: OnnxNode, ctx: Ctx, attrs: dict[str, Any], inputs: int) -> None:
    """W (D, G*H, I), R (D, G*H, H) and B (D, 2*G*H) agree with the attributes and X."""
    dirs, gates = DIRECTIONS[str(attrs["direction"])], GATES[node.op_type]
    rows = gates * int(attrs["hidden_size"])
    want = {1: (dirs, rows, inputs), 2: (dirs, rows, rows // gates), 3: (dirs, 2 * rows)}
    for slot, shape in want.items():
        name = node.input(slot)
        if name and ctx.shape(name) != shape:
            raise ModelImportError(
                f"{node.op_type} node '{node.label}': input {'WRB'[slot - 1]} has shape "
                f"{ctx.shape(name)}, expected {shape} (direction {attrs['direction']}, "
                f"hidden_size {attrs['hidden_size']}); the model is malformed")


@canonical("LSTM", "GRU")
def _recurrent(node: OnnxNode, ctx: Ctx) -> Lowered:
    op = node.op_type
    attrs = _attrs(node, ctx)
    x = node.inputs[0]
    x_shape, dtype = ctx.shape(x), ctx.dtype(x)
    if len(x_shape) != 3:
        raise ModelImportError(f"{op} node '{node.label}' reads X of shape {x_shape}; ONNX "
                               "wants (seq, batch, input) or, with layout 1, (batch, seq, input)")
    _check_weights(node, ctx, attrs, x_shape[-1])
    y_shape, state = recurrent_shapes(op, x_shape, attrs)
    seq, batch = (x_shape[0], x_shape[1]) if attrs["layout"] == 0 else (x_shape[1], x_shape[0])
    _check_sequence_lens(node, ctx, seq, batch)
    out = Lowered()
    base = node.outputs[0] or node.label

    def operand(slot: int, what: str, shape: tuple[int, ...]) -> str:
        name = node.input(slot)
        if name:
            return name
        name = ctx.fresh(f"{base}.{what}")
        out.constants[name] = np.zeros(shape, dtype=dtype)
        return name

    rows = GATES[op] * int(attrs["hidden_size"])
    inputs = [x, node.inputs[1], node.inputs[2],
              operand(3, "zero_bias", (DIRECTIONS[str(attrs["direction"])], 2 * rows)),
              operand(5, "zero_h", state)]
    if op == "LSTM":
        inputs.append(operand(6, "zero_c", state))
    outputs = []
    for slot, what in enumerate(OUTPUTS[op]):
        shape = y_shape if slot == 0 else state
        name = node.outputs[slot] if slot < len(node.outputs) else ""
        if not name:
            name = ctx.fresh(f"{base}.{what}")
            out.tensors[name] = (shape, dtype)
        elif ctx.shape(name) != shape:
            raise ModelImportError(f"{op} node '{node.label}': output {what} has shape "
                                   f"{ctx.shape(name)}, expected {shape}; the model is "
                                   "malformed")
        outputs.append(name)
    out.kernels.append(spec(node, inputs, attrs, outputs))
    return out
