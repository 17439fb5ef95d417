"""Which inputs a kernel may overwrite with its output when torch's caching allocator serves a
plan (no arena): the executor's counterpart of autograd's in-place accumulation.

An elementwise kernel (`memory.scratch.OVERWRITES`) whose input dies at it, i.e. no later
record of the plan reads, moves or regenerates it and it need not outlive the iteration, can
write its output over that input (`torch.add(a, b, out=a)`), as torchvision's in-place ReLU
and residual add and autograd's gradient accumulation do. It computes the same values bit for
bit, allocates nothing, and frees nothing the plan keeps. Without it, every gradient
accumulation of DenseNet-264's backward allocated a new tensor as large as the concatenation
while the old one was freed a kernel later, and that churn fragmented the caching allocator's
segment: 9532 MiB reserved for 8538 MiB allocated (docs/gpu.md).

This module decides from the plan alone (no torch); the executor checks at run time that the
tensor owns its storage, shared with no view (`Executor._run_over_input`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotm_py.ir.graph import Role
from autotm_py.memory.scratch import OVERWRITES
from autotm_py.memory.tiers import FAST
from autotm_py.plan import Compute, Move, Plan, Recompute

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
        tid = kernel.inputs[position]
        t = graph.tensors[tid]
        if (record.placement[position] == FAST and tid not in later
                and kernel.inputs.count(tid) == 1 and t.shape == out.shape
                and t.dtype == out.dtype and t.role not in _GIVEN_ROLES
                and not graph.survives_iteration(tid)):
            return position
    return None
