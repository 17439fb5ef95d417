"""Neighbourhoods of a placement ILP, for a local search around a plan
(`local_search.improve_in_neighbourhoods`).

The async model with recomputation of a deep network (ResNet-200: 286k variables) is too large
for HiGHS to improve on in minutes: started from a checkpoint-style plan, its whole-model search
ran 208 s on this project's 2-core machine without one better plan. Fixed everywhere but in a
neighbourhood, the same model is small enough to solve in seconds, and its solution is a plan
of the whole model, no worse than the one it started from.

A neighbourhood frees the decisions of the tensors whose first use lies in a window of
consecutive kernels, with their partners: the tensors made by the kernels outside the window
that use them (a forward window's activations and the gradients their backward kernels make,
which compete with their reads for memory), and the regeneration variables of every re-run
that may regenerate one of them. Windows hold about `target` free variables each; the
neighbourhoods are the windows, then the windows shifted by half of one, so that a choice that
spans two windows is searched too.
"""

from __future__ import annotations

import bisect
import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotm_py.planning.formulation import Formulation

# free integer variables per neighbourhood: ResNet-200 b64 bf16 at 25% (286k variables) solves
# one of this size in about a second here, and in 75 s of its neighbourhoods gained 5.8 ms with
# them against 5.1 ms with 20k (the fewer, larger ones)
NEIGHBOURHOOD_VARIABLES = 5_000


def neighbourhoods(f: Formulation, target: int | None = None) -> list[list[Any]]:
    """The neighbourhoods of `f` (see the module docstring), each as the list of its free
    integer variables; none when the whole model has fewer than two windows' worth (`target`
    variables each, by default `NEIGHBOURHOOD_VARIABLES`)."""
    target = target or NEIGHBOURHOOD_VARIABLES
    users = _users(f)
    tensors = sorted((uses[0], tid) for tid, uses in users.items())
    total = sum(len(f.x[tid]) for _, tid in tensors)
    if total < 2 * target:
        return []
    windows = _windows(f, tensors, target)
    half = [(a + b) // 2 for a, b in itertools.pairwise(windows)]
    regens = _regenerations(f)
    out = []
    for lo, hi in [*itertools.pairwise(windows), *itertools.pairwise(half)]:
        own = {tid for _, tid in tensors[lo:hi]}
        partners = _partners(own, users, tensors)
        free = own | partners
        out.append([v for tid in sorted(free) for v in f.x[tid]] +
                   [z for tid in sorted(free) for z in regens.get(tid, ())])
    return out


def _windows(f: Formulation, tensors: list[tuple[int, int]], target: int) -> list[int]:
    """Cut points into `tensors` (sorted by first use) so that each run between two holds
    about half of `target` variables of its own (its partners bring about as many)."""
    cuts, count = [0], 0
    for i, (_, tid) in enumerate(tensors):
        count += len(f.x[tid])
        if count >= target // 2 and i + 1 < len(tensors):
            cuts.append(i + 1)
            count = 0
    cuts.append(len(tensors))
    return cuts


def _users(f: Formulation) -> dict[int, list[int]]:
    """Per tensor with decision points, the kernels that read or write it (its producer, or a
    given tensor's first user, first); a tensor with no such gadget, its first gadget."""
    out: dict[int, list[int]] = {}
    for tid, p in enumerate(f.paths):
        if p is not None:
            g = p.gadgets
            out[tid] = [k for k, io in zip(g.kernels, g.io, strict=True) if io] or \
                [g.kernels[0]]
    return out


def _partners(own: set[int], users: dict[int, list[int]], tensors: list[tuple[int, int]]
              ) -> set[int]:
    """The tensors first used by a kernel outside the window's range that uses one of `own`."""
    lo = min(users[t][0] for t in own) if own else 0
    hi = max(users[t][0] for t in own) if own else -1
    kernels = {k for t in own for k in users[t] if not lo <= k <= hi}
    firsts = [k for k, _ in tensors]
    out = set()
    for k in kernels:
        i = bisect.bisect_left(firsts, k)
        while i < len(tensors) and tensors[i][0] == k:
            out.add(tensors[i][1])
            i += 1
    return out - own


def _regenerations(f: Formulation) -> dict[int, list[Any]]:
    """Per tensor, the regeneration variables z of the re-runs that may regenerate it (a re-run
    of one regenerable output has its REGEN edge as its variable, already among `f.x`)."""
    out: dict[int, list[Any]] = {}
    for z, kept in f.regen.values():
        if z is not None:
            for tid in kept:
                out.setdefault(tid, []).append(z)
    return out
