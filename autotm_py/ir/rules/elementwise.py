"""Training rules of elementwise ops: broadcasting binaries, unaries, Where, Sum, Dropout.

Broadcast operands get their gradient summed back to their own shape inside the backward
kernel (attribute `shape`), so no separate reduction kernel is needed. A gradient equal to the
incoming one (Add, Identity, Sum without broadcasting) is the same tensor: no kernel at all.
"""

from __future__ import annotations

from autotm_py.ir.graph import Role
from autotm_py.ir.rules.base import KernelDraft, Rule, Tape, grad_name

Grads = list[int | None]


def sum_to(tape: Tape, k: KernelDraft, dy: int, x: int, scale: float = 1.0,
           what: str = "grad") -> int:
    """dY summed down to x's shape and scaled: `SumToShape`, or dY itself when that is a no-op."""
    if scale == 1.0 and tape.shape(dy) == tape.shape(x) and tape.dtype(dy) == tape.dtype(x):
        return dy
    g = tape.new_grad(x)
    tape.emit("SumToShape", [dy], [g], grad_name(k, what), shape=tape.shape(x), scale=scale)
    return g


def _binary(tape: Tape, k: KernelDraft, needs: list[bool], make: dict[int, tuple[str, list[int],
            dict]]) -> Grads:
    """Emit `op(inputs) -> grad of slot i` for each needed slot i of `make`."""
    grads: Grads = [None] * len(k.inputs)
    for slot, (op, ins, attrs) in make.items():
        if needs[slot]:
            x = k.inputs[slot]
            g = tape.new_grad(x)
            tape.emit(op, ins, [g], grad_name(k, f"grad{slot}"), shape=tape.shape(x), **attrs)
            grads[slot] = g
    return grads


def add_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    return [sum_to(tape, k, dy, x, 1.0, f"grad{i}") if needs[i] else None
            for i, x in enumerate(k.inputs)]


def sub_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    a, b = k.inputs
    return [sum_to(tape, k, dy, a, 1.0, "grad0") if needs[0] else None,
            sum_to(tape, k, dy, b, -1.0, "grad1") if needs[1] else None]


def mul_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    a, b = k.inputs
    return _binary(tape, k, needs, {0: ("MulGrad", [dy, b], {}), 1: ("MulGrad", [dy, a], {})})


def div_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    a, b = k.inputs
    return _binary(tape, k, needs, {0: ("DivGradA", [dy, b], {}),
                                    1: ("DivGradB", [dy, a, b], {})})


def pow_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    x, e = k.inputs
    y = k.outputs[0]
    return _binary(tape, k, needs, {0: ("PowGradBase", [dy, x, e], {}),
                                    1: ("PowGradExponent", [dy, x, y], {})})


def maxmin_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    a, b = k.inputs
    op = k.op_type
    return _binary(tape, k, needs, {0: ("MaxMinGrad", [dy, a, b], {"op": op, "slot": 0}),
                                    1: ("MaxMinGrad", [dy, a, b], {"op": op, "slot": 1})})


def where_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    cond = k.inputs[0]
    return _binary(tape, k, needs, {1: ("WhereGrad", [dy, cond], {"slot": 1}),
                                    2: ("WhereGrad", [dy, cond], {"slot": 2})})


# op -> (backward op, which saved tensor it reads: the op's input X or output Y, attrs to copy)
UNARY: dict[str, tuple[str, str, dict[str, object]]] = {
    "Relu": ("ReluGrad", "Y", {}),
    "LeakyRelu": ("LeakyReluGrad", "X", {"alpha": 0.01}),
    "Sigmoid": ("SigmoidGrad", "Y", {}),
    "Tanh": ("TanhGrad", "Y", {}),
    "Erf": ("ErfGrad", "X", {}),
    "Gelu": ("GeluGrad", "X", {"approximate": "none"}),
    "Sqrt": ("SqrtGrad", "Y", {}),
    "Reciprocal": ("ReciprocalGrad", "Y", {}),
    "Exp": ("ExpGrad", "Y", {}),
    "Log": ("LogGrad", "X", {}),
    "Abs": ("AbsGrad", "X", {}),
    "Clip": ("ClipGrad", "X", {"min": None, "max": None}),
}


def unary_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    op, reads, defaults = UNARY[k.op_type]
    saved = k.inputs[0] if reads == "X" else k.outputs[0]
    attrs = {name: k.attr(name, default) for name, default in defaults.items()}
    g = tape.new_grad(k.inputs[0])
    tape.emit(op, [dy, saved], [g], grad_name(k, "grad"), **attrs)
    return [g]


def neg_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    return [sum_to(tape, k, dy, k.inputs[0], -1.0)]


def identity_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    return [dy]


def cast_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    x = k.inputs[0]
    if tape.dtype(x) == tape.dtype(dy):
        return [dy]
    g = tape.new_grad(x)
    tape.emit("CastGrad", [dy], [g], grad_name(k, "grad"), to=tape.dtype(x))
    return [g]


def _dropout_active(k: KernelDraft) -> bool:
    return float(k.attr("ratio", 0.5)) > 0.0


def dropout_prepare(tape: Tape, k: KernelDraft) -> None:
    """Training mode: the forward kernel also outputs its (bool) mask, saved for backward.

    The mask is drawn from a generator seeded by the kernel (see runtime `dropout`), so every
    run and every plan sees the same mask; no seed attribute is added, so repeated blocks
    keep sharing one kernel signature (and one profile)."""
    if not _dropout_active(k):
        return
    k.attrs["training_mode"] = 1
    if len(k.outputs) < 2:
        y = k.outputs[0]
        k.outputs.append(tape.new_tensor(f"{tape.name(y)}::mask", tape.shape(y), "bool",
                                         Role.ACTIVATION))


def dropout_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    if not _dropout_active(k):
        return [dy]
    g = tape.new_grad(k.inputs[0])
    tape.emit("DropoutGrad", [dy, k.outputs[1]], [g], grad_name(k, "grad"),
              ratio=float(k.attr("ratio", 0.5)))
    return [g]


RULES: dict[str, Rule] = {
    "Add": Rule(add_backward),
    "Sum": Rule(add_backward),
    "Sub": Rule(sub_backward),
    "Mul": Rule(mul_backward),
    "Div": Rule(div_backward),
    "Pow": Rule(pow_backward),
    "Max": Rule(maxmin_backward),
    "Min": Rule(maxmin_backward),
    "Where": Rule(where_backward, inputs=(1, 2)),
    **{op: Rule(unary_backward) for op in UNARY},
    "Neg": Rule(neg_backward),
    "Identity": Rule(identity_backward),
    "Cast": Rule(cast_backward),
    "Dropout": Rule(dropout_backward, outputs=(0,), prepare=dropout_prepare),
}
