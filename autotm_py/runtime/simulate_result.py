"""What `Simulator` predicts of a plan: the spans of its kernels, copies and re-runs on the
timeline, and `SimulationResult`, the record the pipeline, the faces and the reports read (its
`to_dict` is the saved timeline, ``autotm simulate -o``). Plain records: the rules that make
them are `simulate`'s."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class KernelSpan:
    kernel: int
    name: str
    start_s: float
    end_s: float  # the kernel itself
    step_end_s: float  # the step's end: the kernel's (with join_at_use off, its copies' too)
    placement: str  # "FFS": tier of each input then output


@dataclass(frozen=True)
class MoveSpan:
    record: int
    tensor: int
    name: str
    to: str
    mode: str
    start_s: float
    end_s: float
    bytes: int
    overlaps: int | None
    stream: str


@dataclass(frozen=True)
class RecomputeSpan:
    record: int
    kernel: int  # the kernel re-run
    name: str
    before: int  # the kernel whose step it belongs to
    outputs: tuple[int, ...]  # the regenerated tensors it keeps
    bytes: int  # their bytes
    start_s: float
    end_s: float


@dataclass(frozen=True)
class SimulationResult:
    """What a plan is predicted to do. Times in seconds, memory in bytes (aligned sizes).

    `memory` holds one point per record, as columns: record index, time (when the record takes
    effect), fast bytes in the budget (workspace included during a kernel), slow bytes."""

    model_name: str
    strategy: str
    mode: str
    total_s: float
    all_fast_s: float
    budget_bytes: int | None
    fast_peak_bytes: int
    fast_peak_record: int
    slow_peak_bytes: int
    pinned_bytes: int
    kernels: tuple[KernelSpan, ...]
    moves: tuple[MoveSpan, ...]
    memory: dict[str, tuple[Any, ...]]
    bytes_moved: dict[str, int]
    violations: tuple[str, ...] = ()
    strict: bool = True
    notes: tuple[str, ...] = ()
    recomputes: tuple[RecomputeSpan, ...] = ()
    # budget_bytes = reserve_bytes (the runtime's own) + headroom + plannable_bytes (tensors)
    reserve_bytes: int = 0
    plannable_bytes: int | None = None
    costs_digest: str = ""  # `KernelCosts.digest` of the costs it was priced with
    filled_bytes: int = 0  # bytes written by Fill records (known-value tensors, no copy)
    # optimizer updates on the host (`ir.host_updates`): their work, and when the last ends
    # (the iteration, `total_s`, ends no earlier)
    host_update_s: float = 0.0
    host_end_s: float = 0.0
    gpu_end_s: float = 0.0  # the GPU's iteration's end, before the host's updates

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def recompute_s(self) -> float:
        """Seconds the compute stream spends re-running kernels."""
        return sum(r.end_s - r.start_s for r in self.recomputes)

    @property
    def slowdown(self) -> float:
        return self.total_s / self.all_fast_s if self.all_fast_s > 0 else 1.0

    def host_note(self) -> str:
        """What the optimizer updates on the host cost (`ir.host_updates`)."""
        return (f"optimizer updates on the host: {self.host_update_s * 1e3:.3f} ms of work, the "
                f"last ending at {self.host_end_s * 1e3:.3f} ms of the "
                f"{self.total_s * 1e3:.3f} ms iteration (the GPU's part ends at "
                f"{self.gpu_end_s * 1e3:.3f} ms)")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["memory"] = {k: list(v) for k, v in self.memory.items()}
        d["format"] = "autotm-simulation"
        d["format_version"] = 1
        return d
