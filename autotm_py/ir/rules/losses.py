"""Training rules of the losses of ours that `--loss` can choose besides softmax cross-entropy
(which lives with the network ops in `nn.py`, as the ONNX op does).

`MeanSquaredError(prediction, target) -> loss`: the mean of (prediction - target)^2 over every
element. Its backward reads both operands (they stay live until the backward starts, exactly
as softmax cross-entropy keeps its log-probabilities), and the seed d(loss) = 1 is implicit.
"""

from __future__ import annotations

from autotm_py.ir.rules.base import KernelDraft, Rule, Tape, grad_name

Grads = list[int | None]


def mse_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    """d/dprediction = 2 (prediction - target) / numel; the target (a label) gets none."""
    g = tape.new_grad(k.inputs[0])
    tape.emit("MeanSquaredErrorGrad", list(k.inputs[:2]), [g], grad_name(k, "grad"))
    return [g] + [None] * (len(k.inputs) - 1)


RULES: dict[str, Rule] = {
    "MeanSquaredError": Rule(mse_backward, inputs=(0,)),
}
