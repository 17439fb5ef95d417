"""Memory accounting shared by the planner, the baselines and the simulator.

Every consumer of a budget counts bytes the same way, so a plan the ILP accepts is a plan the
verifier accepts:

- A tensor occupies ``aligned(nbytes)`` bytes: its size rounded up to `ALIGN_BYTES` (512 B, the
  granularity of PyTorch's CUDA caching allocator). Budgets are compared against sums of these.
- ``--pin-weights`` (the paper's rule) pins inputs, labels, weights, optimizer state and
  constants, and the new versions that replace them, in the fast tier *outside* the budget:
  they never move and are not counted.
- Live ranges are the graph's, except that the end value of a carried pair (W' of W -> W')
  always lives to the last kernel: the next iteration starts from it.
- Steady state: `steady_pairs` lists (first, last) pairs whose end tier must equal the start
  tier: every carried pair, plus (t, t) for a persistent tensor that nothing replaces (e.g. an
  inference weight). Non-persistent given tensors (inputs, labels) start each iteration anew.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from autotm_py.errors import ConfigError
from autotm_py.ir.graph import Role
from autotm_py.ir.host_updates import fed_tensors

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.memory.tiers import MemorySystem
    from autotm_py.units import Ratio

ALIGN_BYTES = 512
PINNED_ROLES = frozenset({Role.INPUT, Role.LABEL, Role.WEIGHT, Role.OPTIMIZER_STATE,
                          Role.CONSTANT})


def aligned(nbytes: int) -> int:
    """Bytes a tensor of `nbytes` occupies: rounded up to `ALIGN_BYTES`."""
    return -(-int(nbytes) // ALIGN_BYTES) * ALIGN_BYTES


def aligned_sizes(graph: TensorGraph) -> np.ndarray:
    """`aligned` size of every tensor (int64, by tensor id)."""
    raw = graph.tensor_bytes
    return -(-raw // ALIGN_BYTES) * ALIGN_BYTES


def pinned_tensors(graph: TensorGraph, pin_weights: bool) -> frozenset[int]:
    """Tensors pinned in fast memory outside the budget (empty unless `pin_weights`)."""
    if not pin_weights:
        return frozenset()
    fed = fed_tensors(graph)  # the host writes them in the slow tier each iteration
    pinned = {t.id for t in graph.tensors if t.producer is None and t.role in PINNED_ROLES
              and t.id not in fed}
    for first, last in graph.carried:
        if first in pinned or last in pinned:
            pinned.update((first, last))
    return frozenset(pinned)


def steady_pairs(graph: TensorGraph) -> tuple[tuple[int, int], ...]:
    """(first, last) pairs whose end tier must equal the start tier (see module docstring)."""
    pairs = [(a, z) for a, z in graph.carried]
    carried = {a for a, _ in pairs} | {z for _, z in pairs}
    for t in graph.tensors:
        if t.producer is None and t.role.persistent and t.id not in carried:
            pairs.append((t.id, t.id))
    return tuple(pairs)


def live_ranges(graph: TensorGraph) -> tuple[tuple[int, int], ...]:
    """The graph's (first, last) kernel of every tensor, carried end values extended to the end."""
    ranges = list(graph.live_ranges)
    last_kernel = max(len(graph.kernels) - 1, 0)
    for _, last in graph.carried:
        ranges[last] = (ranges[last][0], last_kernel)
    return tuple(ranges)


def live_bytes(n_kernels: int, sizes: np.ndarray, ranges: Sequence[tuple[int, int]],
               tensors: Iterable[int]) -> np.ndarray:
    """Per kernel, the sum of `sizes` over the given tensors live there (int64, length
    `n_kernels`): one sweep over the (first, last) kernel of each tensor."""
    delta = np.zeros(n_kernels + 1, dtype=np.int64)
    for tid in tensors:
        start, end = ranges[tid]
        delta[start] += sizes[tid]
        delta[end + 1] -= sizes[tid]
    return np.cumsum(delta[:-1])


def live_peak(graph: TensorGraph, sizes: np.ndarray, ranges: tuple[tuple[int, int], ...],
              exclude: frozenset[int] = frozenset()) -> tuple[int, int]:
    """(bytes, kernel) of the largest sum of `sizes` over the tensors live at one kernel plus
    that kernel's workspace (the IR's), as `graph.peak_live_bytes` counts it."""
    n = len(graph.kernels)
    if n == 0:
        return 0, -1
    live = live_bytes(n, sizes, ranges, (t for t in range(len(ranges)) if t not in exclude)) \
        + graph.kernel_workspace_bytes
    kid = int(live.argmax())
    return int(live[kid]), kid


def ratio_base(graph: TensorGraph, pinned: frozenset[int]) -> int:
    """What a ratio divides: the unconstrained peak (`graph.peak_live_bytes`, as `autotm
    inspect` prints it, workspace included), or with pinned tensors the peak of the placeable
    ones and the workspace."""
    if not pinned:
        return int(graph.peak_live_bytes)
    return live_peak(graph, graph.tensor_bytes, live_ranges(graph), pinned)[0]


def resolve_budget(graph: TensorGraph, *, ratio: Ratio | None, fast_mem_bytes: int | None,
                   pinned: frozenset[int], memory: MemorySystem) -> int | None:
    """The fast-tier budget in bytes, or None for no limit (ratio F:0)."""
    if fast_mem_bytes is not None:
        return int(fast_mem_bytes)
    if ratio is not None:
        if ratio.slow == 0:
            return None
        return ratio.budget(ratio_base(graph, pinned))
    if memory.fast.capacity_bytes is not None:
        return int(memory.fast.capacity_bytes)
    raise ConfigError("no fast-memory budget: give --ratio FAST:SLOW (e.g. 1:4) or --fast-mem "
                      "BYTES (e.g. 16GiB), or a memory system whose fast tier has a capacity")
