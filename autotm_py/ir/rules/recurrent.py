"""Training rules of ONNX's recurrent layers, `LSTM` and `GRU` (canonical slots X W R B
initial_h [initial_c] -> Y Y_h [Y_c], `frontend/canonical_rnn.py`).

The backward is one kernel per layer that recomputes the layer's forward over the whole
sequence from its saved inputs and differentiates it with torch.autograd inside the kernel
(`kernels/recurrent.py`):

    LSTMGrad: X, W, R, B, initial_h, initial_c, [dY, dY_h, dY_c present] -> dX, dW, dR, dB,
              dinitial_h, dinitial_c (masked)
    GRUGrad:  X, W, R, B, initial_h, [dY, dY_h present] -> dX, dW, dR, dB, dinitial_h (masked)

Saved for the backward: the forward's inputs only (X, W, R, B and the initial states), none
of its outputs and none of the per-step gates: O(T * B * I) for X instead of the
O(T * B * G * H) gate activations torch's autograd keeps from the forward to the backward.
Those live only inside the gradient kernel, as its workspace (`recompute_workspace`), while
it runs. The price is a second forward of the layer. `grad_mask` says which output gradients
are inputs (an output nothing differentiable reads has none), `output_mask` which input
gradients are outputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autotm_py.ir.graph import DTYPE_SIZES
from autotm_py.ir.rules.base import KernelDraft, Rule, Tape, grad_name

GATES = {"LSTM": 4, "GRU": 3}
RECURRENT_TRAINING_OPS: dict[str, str] = {
    "LSTMGrad": "X, W, R, B, initial_h, initial_c, present of (dY, dY_h, dY_c) -> dX, dW, dR, "
                "dB, dinitial_h, dinitial_c (masked; the sequence's forward recomputed with "
                "autograd inside the kernel)",
    "GRUGrad": "X, W, R, B, initial_h, present of (dY, dY_h) -> dX, dW, dR, dB, dinitial_h "
               "(masked; the forward recomputed with autograd inside the kernel)",
}

Grads = list[int | None]


def recurrent_workspace(op: str, y_shape: Sequence[int], dtype: str, *,
                        backward: bool) -> int:
    """Bytes a recurrent kernel allocates beyond its slots (an IR estimate, per element of Y:
    T * D * B * H). The forward: every step's input gates, computed in one product (G per
    element). The gradient kernel: the recomputed forward's tape (the input gates, every
    step's gates after their activations and its cell state, tanh and output: 2G + 3), then
    the gradient of the input gates of the whole sequence (G) from which dX and dW are two
    products. Profiles measured on a GPU record the real workspace (cuDNN's reserve)."""
    elements = math.prod(y_shape) * DTYPE_SIZES[dtype]
    gates = GATES[op]
    return elements * (3 * gates + 3 if backward else gates)


def recurrent_prepare(tape: Tape, k: KernelDraft) -> None:
    """Training: no extra outputs (the backward recomputes); the forward's temporaries."""
    y = k.outputs[0]
    k.workspace_bytes = max(k.workspace_bytes, recurrent_workspace(
        k.op_type, tape.shape(y), tape.dtype(y), backward=False))


def recurrent_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    """One `<op>Grad` kernel for every needed input gradient, reading the forward's inputs and
    the output gradients that exist."""
    outs = [tape.new_grad(t) if needs[i] else None for i, t in enumerate(k.inputs)]
    present = [d for d in dys if d is not None]
    y = k.outputs[0]
    attrs = {name: k.attrs[name] for name in ("direction", "hidden_size", "layout",
                                              "linear_before_reset") if name in k.attrs}
    tape.emit(f"{k.op_type}Grad", [*k.inputs, *present], [g for g in outs if g is not None],
              grad_name(k, "grad"), **attrs,
              grad_mask=tuple(int(d is not None) for d in dys),
              output_mask=tuple(int(g is not None) for g in outs))
    tape.kernels[-1].workspace_bytes = recurrent_workspace(k.op_type, tape.shape(y),
                                                           tape.dtype(y), backward=True)
    return outs


RULES: dict[str, Rule] = {
    "LSTM": Rule(recurrent_backward, outputs=None, prepare=recurrent_prepare),
    "GRU": Rule(recurrent_backward, outputs=None, prepare=recurrent_prepare),
}
