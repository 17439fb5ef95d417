"""`PlanInterpreter`: walks a plan's records in order and dispatches each to a handler.

The simulator (predicted timeline), the verifier (strict simulator) and the executor (torch)
subclass it and override `compute`, `move` and `free`. Any error raised by a handler is
re-raised as a `PlanError`/`ExecutionError` subclass that names the record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotm_py.errors import AutoTMError, PlanError
from autotm_py.plan import Compute, Free, Move, Plan, Record

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph


class PlanInterpreter:
    """Base class: `run()` calls `start()`, one handler per record, then `finish()`."""

    def __init__(self, graph: TensorGraph, plan: Plan) -> None:
        self.graph = graph
        self.plan = plan
        self.index = -1  # the record being executed

    def run(self) -> None:
        self.start()
        for i, record in enumerate(self.plan.records):
            self.index = i
            try:
                self.dispatch(record)
            except AutoTMError as exc:
                raise type(exc)(f"record #{i} {self.describe(record)}: {exc}") from exc
        self.index = len(self.plan.records)
        self.finish()

    def dispatch(self, record: Record) -> None:
        if isinstance(record, Compute):
            self.compute(record)
        elif isinstance(record, Move):
            self.move(record)
        elif isinstance(record, Free):
            self.free(record)
        else:  # pragma: no cover - records are a closed union
            raise PlanError(f"unknown record {record!r}")

    def describe(self, record: Record) -> str:
        """Human-readable record text with names, for error messages and traces."""
        g = self.graph
        if isinstance(record, Compute):
            k = g.kernels[record.kernel]
            return f"compute {k.name!r} ({k.op_type}, #{k.id})"
        if isinstance(record, Move):
            how = record.mode + (f" over #{record.overlaps}" if record.overlaps is not None else "")
            return f"move {g.name_of(record.tensor)!r} to {record.to} ({how})"
        return f"free {g.name_of(record.tensor)!r} from {record.tier}"

    # ---- handlers for subclasses ---------------------------------------------------------
    def start(self) -> None:
        """Called once before the first record."""

    def finish(self) -> None:
        """Called once after the last record."""

    def compute(self, record: Compute) -> None:
        raise NotImplementedError

    def move(self, record: Move) -> None:
        raise NotImplementedError

    def free(self, record: Free) -> None:
        raise NotImplementedError
