"""Which inputs a kernel may overwrite with its output when torch's caching allocator serves a
plan (no arena): the executor's counterpart of autograd's in-place accumulation.

An elementwise kernel (`memory.scratch.OVERWRITES`) whose input dies at it, i.e. no later
record of the plan reads, moves or regenerates it and it need not outlive the iteration, can
write its output over that input (`torch.add(a, b, out=a)`), as torchvision's in-place ReLU
and residual add and autograd's gradient accumulation do. It computes the same values bit for
bit, allocates nothing, and frees nothing the plan keeps. Without it, every gradient
accumulation of DenseNet-264's backward allocated a new tensor as large as the concatenation
while the old one was freed a kernel later, and that churn fragmented the caching allocator's
segment: 9532 MiB reserved for 8538 MiB allocated (experiments/journal/gpu-2026-11.md).

This module decides from the plan alone (no torch); the executor checks at run time that the
tensor owns its storage, shared with no view (`Executor._may_overwrite`). `update_runs` finds
the runs of SGD updates written over their weights that the executor issues as one foreach
update, as torch's optimizer does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from autotm_py.ir.graph import Role
from autotm_py.ir.optim import plain_sgd
from autotm_py.memory.scratch import OVERWRITES
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.plan import Compute, Free, Move, Plan, Recompute

if TYPE_CHECKING:
    from autotm_py.ir.graph import Kernel, TensorGraph

# Roles given afresh at the start of every iteration (the data batch, constants; weights and
# optimizer state carry over): a CUDA graph replays with the same ones, so no kernel may write
# over them.
_GIVEN_ROLES = (Role.INPUT, Role.LABEL, Role.CONSTANT)


def overwritable_inputs(graph: TensorGraph, plan: Plan) -> dict[int, int]:
    """Record index of a Compute -> the position of the input its output may overwrite."""
    later: set[int] = set()  # tensors some record after the current one uses
    chosen: dict[int, int] = {}
    for index in range(len(plan.records) - 1, -1, -1):
        record = plan.records[index]
        if isinstance(record, Compute):
            kernel = graph.kernels[record.kernel]
            position = _dying_input(graph, kernel, record, later)
            if position is not None:
                chosen[index] = position
            later.update(kernel.inputs)
        elif isinstance(record, Recompute):
            later.update(graph.kernels[record.kernel].inputs)
        elif isinstance(record, Move):
            later.add(record.tensor)
    return chosen


def _dying_input(graph: TensorGraph, kernel: Kernel, record: Compute,
                 later: set[int]) -> int | None:
    """The first overwritable input of `kernel` that dies at it, in fast memory, of the
    output's shape and dtype and read once by it; None if there is none."""
    if len(kernel.outputs) != 1 or record.placement[-1] != FAST:
        return None
    out = graph.tensors[kernel.outputs[0]]
    for position in OVERWRITES.get(kernel.op_type, ()):
        if position >= len(kernel.inputs):  # an optional input this form has not
            continue
        tid = kernel.inputs[position]
        t = graph.tensors[tid]
        if (record.placement[position] == FAST and tid not in later
                and kernel.inputs.count(tid) == 1 and t.shape == out.shape
                and t.dtype == out.dtype and t.role not in _GIVEN_ROLES
                and not graph.survives_iteration(tid)):
            return position
    return None


def update_runs(graph: TensorGraph, plan: Plan, overwritable: dict[int, int]
                ) -> dict[int, tuple[int, ...]]:
    """Record index of the first SGD update of a run -> the record indices of the run's
    updates: two or more plain SGD updates (W, dW -> W - lr dW with the learning rate an
    attribute, `ir.optim.plain_sgd`: the foreach add the executor runs them as computes
    nothing else) that write over their weights (`overwritable`), reading both operands from
    fast memory, with one learning rate and nothing but frees between them (the optimizer
    step at the end of an iteration). Running them together at the first one
    changes no value (each reads only its own weight and gradient, which are ready there) and
    no peak (they allocate nothing; the frees between them only come later)."""
    def lr_of(index: int, kernel: Kernel) -> object:
        return kernel.attr("lr") if plain_sgd(kernel) and overwritable.get(index) == 0 else None

    return _runs(graph, plan, lr_of)


def _runs(graph: TensorGraph, plan: Plan,
          form_of: Callable[[int, Kernel], object]) -> dict[int, tuple[int, ...]]:
    """Record index of the first update of a run -> the run's record indices: two or more
    compute records in fast memory whose kernels have one form (`form_of`, None: not an
    update of a run) with nothing but frees between them."""
    runs: dict[int, tuple[int, ...]] = {}
    current: list[int] = []
    form: object = None

    def close() -> None:
        if len(current) > 1:
            runs[current[0]] = tuple(current)
        current.clear()

    for index, record in enumerate(plan.records):
        if isinstance(record, Free):
            continue
        kernel = graph.kernels[record.kernel] if isinstance(record, Compute) else None
        this = None if kernel is None else form_of(index, kernel)
        if this is None or SLOW in record.placement:  # type: ignore[union-attr]
            close()
            continue
        if current and this != form:
            close()
        form = this
        current.append(index)
    close()
    return runs


def sgd_form(graph: TensorGraph, kernel: Kernel) -> tuple[object, ...] | None:
    """What an SGD update of any form computes besides its own tensors (the learning rate's
    attribute or input tensor, momentum, weight decay, Nesterov, the weight's dtype), so that
    updates of one form may run as one multi-tensor update; None if `kernel` is no SGDUpdate."""
    if kernel.op_type != "SGDUpdate":
        return None
    momentum = float(kernel.attr("momentum", 0.0))
    lr_input = kernel.inputs[-1] if len(kernel.inputs) == (4 if momentum else 3) else None
    return (kernel.attr("lr"), lr_input, momentum, float(kernel.attr("weight_decay", 0.0)),
            bool(kernel.attr("nesterov", 0)), graph.tensors[kernel.inputs[0]].dtype)


def sgd_runs(graph: TensorGraph, plan: Plan) -> dict[int, tuple[int, ...]]:
    """Record index of the first SGD update of a run -> the record indices of the run's
    updates, for an arena (where W' takes W's slot in place: `arena.lifetimes`, checked again
    by the executor when it runs them): two or more SGD updates of one form (`sgd_form`: any
    form, the learning rate an attribute or the one input tensor) with every operand in fast
    memory and nothing but frees between them. As `update_runs`, running them together at the
    first changes no value (each reads only its own weight, gradient and buffer, ready there)
    and no peak (written in place, they allocate nothing)."""
    return _runs(graph, plan, lambda _index, kernel: sgd_form(graph, kernel))
