"""Lower bounds on the iteration time of any plan (DESIGN section 11): the oracle and the
transfer bound, so a plan's time can be judged against what the hardware allows.

- oracle: every kernel at its all-fast time, no copies (= all-fast, a bound at any budget);
- transfer bound (GPU mode): at kernel k, the transient tensors live there (produced in this
  iteration, dead before its end) that do not fit beside k's workspace must be in the slow tier
  (weights, inputs and survivors may live there without ever being copied out). They were
  produced in fast memory, so they were copied out after being produced, and they are read
  again after k, so they are copied back in. Hence, for every k,

      T >= max(C(<=k), E_k / write_bw) + max(C(>k), E_k / read_bw)

  with C the sum of kernel times up to / after k and E_k = transient_k + workspace_k - budget.
  The bound takes the faster of each direction's sync and overlapped bandwidths and ignores
  the shared-link limit, so no plan can beat it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from autotm_py.machine import MachineModel


def transfer_bound(machine: MachineModel) -> float:
    """Seconds no plan of `model` at its budget can beat (all-fast time when it all fits)."""
    times = np.asarray(machine.costs.times_s, dtype=np.float64)
    budget = machine.tensor_budget
    if budget is None or not machine.gpu or len(times) == 0:
        return float(times.sum())
    # Weights, inputs and survivors may sit in the slow tier without ever being copied out,
    # so only transient bytes beyond what fits beside k's workspace are certain to move.
    transient = _transient_bytes(machine)
    excess = np.maximum(transient + machine.workspace - budget, 0).astype(np.float64)
    link = machine.copying.link
    write_bw = max(link.write_bw, link.async_write_bw)
    read_bw = max(link.read_bw, link.async_read_bw)
    before = np.cumsum(times)
    after = times.sum() - before
    bound = np.maximum(before, excess / write_bw) + np.maximum(after, excess / read_bw)
    return float(bound.max())


def _transient_bytes(machine: MachineModel) -> np.ndarray:
    """Accounted bytes of transient tensors (produced here, dead before the end) per kernel."""
    return machine.live_bytes(t.id for t in machine.graph.tensors
                            if t.producer is not None and t.id not in machine.survivors)
