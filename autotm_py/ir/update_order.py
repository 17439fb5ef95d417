"""The optimizer's updates as early as their gradients allow (`updates_early`).

`derive_training` emits every update after the whole backward pass, as torch.optim's
`step()` runs them. Under a budget that costs memory and time: every weight gradient stays
until the end of the iteration, and each weight's optimizer state (momentum, Adam's moments)
and fp32 master must be in fast memory at once, at the end, where short update kernels hide
no copy. `updates_early` moves each update to just after its gradient is final (the last
kernel that writes or reads one of its operands), as PyTorch users do with
`register_post_accumulate_grad_hook` ("optimizer step in backward"). The updates go in
groups of about 1/`UPDATE_GROUPS` of the gradients' bytes, so that each group still runs as
one multi-tensor update (`runtime.reuse.sgd_runs`): one group per update would launch
hundreds of small kernels a step. Adam's `AdamStep` goes with the first group.

Only the order changes: the same kernels and tensors (tensor ids kept, kernel ids renumbered),
the same values; the graph's meta records it (`UPDATES_EARLY_KEY`) so that a plan made for it
is rebuilt (`ModelOptions.updates_early`). The planner takes this order under a budget below
the graph's peak (`PlanConfig.update_order`, docs/planning.md section 2c).
"""

from __future__ import annotations

from dataclasses import replace

from autotm_py.ir.graph import TensorGraph
from autotm_py.options import UPDATES_EARLY_KEY

UPDATE_OPS = frozenset({"SGDUpdate", "AdamUpdate", "AdamStep"})
UPDATE_GROUPS = 16  # ResNet-200 b64: 611 updates in 16 runs, about 16 MiB of gradients each


def update_tail(graph: TensorGraph) -> int:
    """The index of the first kernel of the graph's trailing run of update kernels
    (len(kernels) where there is none)."""
    start = len(graph.kernels)
    while start > 0 and graph.kernels[start - 1].op_type in UPDATE_OPS:
        start -= 1
    return start


def updates_early(graph: TensorGraph, groups: int = UPDATE_GROUPS) -> TensorGraph:
    """`graph` with its trailing updates moved early (module docstring); `graph` itself where
    nothing moves (`early_order`)."""
    order = early_order(graph, groups)
    return graph if order is None else in_early_order(graph, order)


def in_early_order(graph: TensorGraph, order: list[int]) -> TensorGraph:
    """`graph` in `order`, an `early_order` of it, marked as such in its meta."""
    moved = reorder_kernels(graph, order)
    return replace(moved, meta={**moved.meta, UPDATES_EARLY_KEY: True})


def early_order(graph: TensorGraph, groups: int = UPDATE_GROUPS) -> list[int] | None:
    """The kernel order of `updates_early` (old ids), or None where `graph` has fewer than two
    trailing updates, was reordered already, or a kernel before them reads what an update
    writes."""
    start = update_tail(graph)
    tail = range(start, len(graph.kernels))
    if len(tail) < 2 or graph.meta.get(UPDATES_EARLY_KEY) or _read_before(graph, start):
        return None
    ready = {k: _ready_after(graph, k, start) for k in tail}
    threshold = sum(_grad_bytes(graph, k) for k in tail) / max(groups, 1)
    order: list[int] = []
    pending = [k for k in tail if ready[k] < 0]
    pending_bytes = sum(_grad_bytes(graph, k) for k in pending)
    waiting = sorted((k for k in tail if ready[k] >= 0), key=lambda k: (ready[k], k))
    nxt = 0
    for kid in range(start):
        order.append(kid)
        while nxt < len(waiting) and ready[waiting[nxt]] == kid:
            pending.append(waiting[nxt])
            pending_bytes += _grad_bytes(graph, waiting[nxt])
            nxt += 1
        if pending and pending_bytes >= threshold:
            order += sorted(pending)
            pending, pending_bytes = [], 0
    return order + sorted(pending)


def _ready_after(graph: TensorGraph, kid: int, start: int) -> int:
    """The last kernel before the tail that an update must follow: the producers of its
    operands and their other readers (so W is dead when W' is written), -1 if none."""
    last = -1
    for tid in graph.kernels[kid].inputs:
        t = graph.tensors[tid]
        if t.producer is not None and t.producer < start:
            last = max(last, t.producer)
        last = max([last, *(u for u in t.users if u < start)])
    return last


def _grad_bytes(graph: TensorGraph, kid: int) -> int:
    """The bytes of the gradient an update reads (its second operand; AdamStep none)."""
    k = graph.kernels[kid]
    return graph.tensors[k.inputs[1]].nbytes if k.op_type != "AdamStep" else 0


def _read_before(graph: TensorGraph, start: int) -> bool:
    """Whether a kernel before the tail reads an update's output (then nothing moves)."""
    return any(u < start for k in graph.kernels[start:] for tid in k.outputs
               for u in graph.tensors[tid].users)


def reorder_kernels(graph: TensorGraph, order: list[int]) -> TensorGraph:
    """`graph` with its kernels in `order` (old ids, a topological order): kernels renumbered,
    tensors' producers and users with them; tensor ids unchanged."""
    new = {old: i for i, old in enumerate(order)}
    if sorted(new) != list(range(len(graph.kernels))):
        raise ValueError("reorder_kernels: the order must name every kernel once")
    kernels = tuple(replace(graph.kernels[old], id=i) for i, old in enumerate(order))
    tensors = tuple(replace(t, producer=None if t.producer is None else new[t.producer],
                            users=tuple(sorted(new[u] for u in t.users)))
                    for t in graph.tensors)
    return replace(graph, kernels=kernels, tensors=tensors).validate()
