"""Numbers that explain a plan, computed from its records: bytes moved and regenerated, where
kernel IO lives.

Shared by the report summary, `autotm bench` and the experiments (Fig. 10b, 10c).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autotm_py.plan import Compute, Move, Plan, Recompute
from autotm_py.report.residency import PlanView


@dataclass(frozen=True)
class PlanMetrics:
    """Copies per direction (to fast = slow->fast, to slow = fast->slow) and IO placement."""

    moves_to_fast: int
    moves_to_slow: int
    bytes_to_fast: int
    bytes_to_slow: int
    sync_bytes_to_fast: int
    sync_bytes_to_slow: int
    async_bytes_to_fast: int
    async_bytes_to_slow: int
    input_bytes: int  # kernel input bytes summed over kernels (a tensor read twice counts twice)
    output_bytes: int
    input_fast_fraction: float  # share of those bytes read from / written to the fast tier
    output_fast_fraction: float
    recomputes: int = 0  # re-runs of forward kernels (plans that recompute)
    recomputed_bytes: int = 0  # the bytes they regenerate

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_metrics(plan: Plan, view: PlanView) -> PlanMetrics:
    """Count copies and weigh each kernel's input/output bytes by the tier of its slot."""
    moved = {(to, mode): 0 for to in ("fast", "slow") for mode in ("sync", "async")}
    counts = {"fast": 0, "slow": 0}
    io_bytes = {"in": [0, 0], "out": [0, 0]}  # [fast, total]
    for rec in plan.records:
        if isinstance(rec, Move):
            moved[(rec.to, rec.mode)] += view.tensor_bytes[rec.tensor]
            counts[rec.to] += 1
        elif isinstance(rec, Compute):
            ins, outs = view.kernel_io[rec.kernel]
            for slot, tid in enumerate(ins + outs):
                side = io_bytes["in" if slot < len(ins) else "out"]
                nbytes = view.tensor_bytes[tid]
                side[1] += nbytes
                if slot >= len(rec.placement) or rec.placement[slot] == "fast":
                    side[0] += nbytes
    return PlanMetrics(
        moves_to_fast=counts["fast"],
        moves_to_slow=counts["slow"],
        bytes_to_fast=moved[("fast", "sync")] + moved[("fast", "async")],
        bytes_to_slow=moved[("slow", "sync")] + moved[("slow", "async")],
        sync_bytes_to_fast=moved[("fast", "sync")],
        sync_bytes_to_slow=moved[("slow", "sync")],
        async_bytes_to_fast=moved[("fast", "async")],
        async_bytes_to_slow=moved[("slow", "async")],
        input_bytes=io_bytes["in"][1],
        output_bytes=io_bytes["out"][1],
        input_fast_fraction=_share(*io_bytes["in"]),
        output_fast_fraction=_share(*io_bytes["out"]),
        recomputes=sum(1 for r in plan.records if isinstance(r, Recompute)),
        recomputed_bytes=sum(view.tensor_bytes[t] for r in plan.records
                             if isinstance(r, Recompute) for t in r.outputs),
    )


def _share(part: int, total: int) -> float:
    return part / total if total else 1.0
