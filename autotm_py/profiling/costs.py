"""`KernelCosts`: what each kernel of a graph costs, and the host-mode slow-tier model.

Times are seconds with every input and output in fast memory (medians of measured runs, or
roofline estimates flagged in `estimated`). In host mode a kernel may touch the slow tier
directly; `placement_time` models that cost from the fast-memory time and the bytes per tier:

    t(k, placement) = t_fast(k)
                      + sum over inputs  i in slow: bytes_i * (1/slow.read_bw  - 1/fast.read_bw)
                      + sum over outputs o in slow: bytes_o * (1/slow.write_bw - 1/fast.write_bw)

i.e. each operand is streamed once, and an operand in the slow tier streams at the slow tier's
bandwidth instead of the fast tier's. Where the slow tier is real (a second NUMA node), measured
per-placement times replace the model (`measured_placements`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotm_py.memory.tiers import SLOW

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.memory.tiers import MemorySystem


@dataclass(frozen=True)
class KernelCosts:
    """Per-kernel costs of one graph on one device (index = kernel id)."""

    device: str
    times_s: tuple[float, ...]
    p10_s: tuple[float, ...]
    p90_s: tuple[float, ...]
    estimated: tuple[bool, ...]
    # kernel id -> {placement string like "FFS": seconds}, where the slow tier was measured
    measured_placements: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    # per kernel: time scaled from a profile measured at another batch (profiling/scaling.py)
    scaled: tuple[bool, ...] = ()
    # which profiles served these costs (fingerprints and files), for reports
    source: str = ""
    # counts: kernels, unique, exact, scaled, estimated (+ measured_now, failed after profile)
    summary: Mapping[str, Any] = field(default_factory=dict)
    # per kernel: device memory it allocates beyond its IO while it runs (measured on CUDA;
    # empty or 0 where unknown). The capacity rows count it (memory/model.py).
    workspace_bytes: tuple[int, ...] = ()
    # per kernel: seconds it keeps the GPU busy, without the launch gaps that `times_s` holds
    # (in-context CUDA profiles; 0 where unknown, empty where none is). The simulator runs
    # kernels on a GPU clock with it and the host's dispatch on a clock of `times_s`.
    device_s: tuple[float, ...] = ()

    @classmethod
    def from_times(cls, device: str, times_s: Sequence[float],
                   estimated: Sequence[bool] | None = None) -> KernelCosts:
        t = tuple(float(x) for x in times_s)
        est = tuple(estimated) if estimated is not None else (False,) * len(t)
        return cls(device, t, t, t, est)

    @property
    def total_s(self) -> float:
        return sum(self.times_s)

    @property
    def n_estimated(self) -> int:
        return sum(self.estimated)

    @property
    def n_scaled(self) -> int:
        return sum(self.scaled)

    def placement_time(self, graph: TensorGraph, memory: MemorySystem, kid: int,
                       placement: Sequence[str]) -> float:
        """Time of kernel `kid` with its IO slots in the given tiers (see module docstring)."""
        code = "".join("S" if p == SLOW else "F" for p in placement)
        measured = self.measured_placements.get(kid)
        if measured is not None and code in measured:
            return measured[code]
        kernel = graph.kernels[kid]
        extra = 0.0
        n_in = len(kernel.inputs)
        fast, slow = memory.fast, memory.slow
        for slot, tid in enumerate(kernel.io):
            if placement[slot] != SLOW:
                continue
            nbytes = graph.tensors[tid].nbytes
            if slot < n_in:
                extra += nbytes * (1.0 / slow.read_bw - 1.0 / fast.read_bw)
            else:
                extra += nbytes * (1.0 / slow.write_bw - 1.0 / fast.write_bw)
        return self.times_s[kid] + max(extra, 0.0)
