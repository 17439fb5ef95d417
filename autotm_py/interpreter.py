"""`PlanInterpreter`: walks a plan's records in order and dispatches each to a handler.

The one interpreter of plan records: the simulator (predicted timeline), the verifier (strict
simulator), the executor (torch) and the report's residency walk subclass it and override
`compute`, `move`, `free`, `recompute` and `fill` (and `after` to observe each record's
effect). Any error raised by a handler is re-raised as a `PlanError`/`ExecutionError`
subclass that names the record. A walk without a graph (reports of a saved plan) names
tensors and kernels from the plan's own names tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autotm_py.errors import AutoTMError, PlanError
from autotm_py.plan import Compute, Fill, Free, Move, Plan, Recompute, Record

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph


class PlanInterpreter:
    """Base class: `run()` calls `start()`, one handler per record, then `finish()`."""

    def __init__(self, graph: TensorGraph | None, plan: Plan) -> None:
        self.graph = graph
        self.plan = plan
        self.index = -1  # the record being executed

    def run(self) -> None:
        self.start()
        # The loop is the executor's host time per record in eager GPU runs (thousands of
        # records per iteration), so a handler is found by the record's type in one lookup,
        # and `after` is called only where a subclass observes records.
        handlers = self._handlers()
        after = self.after if type(self).after is not PlanInterpreter.after else None
        i, record = -1, None
        try:
            for i, record in enumerate(self.plan.records):
                self.index = i
                handlers[type(record)](record)
                if after is not None:
                    after(record)
        except AutoTMError as exc:
            raise type(exc)(f"record #{i} {self.describe(record)}: {exc}") from exc  # type: ignore[arg-type]
        self.index = len(self.plan.records)
        self.finish()

    def _handlers(self) -> dict[type, Callable[[Any], None]]:
        return {Compute: self.compute, Move: self.move, Free: self.free,
                Recompute: self.recompute, Fill: self.fill}

    def dispatch(self, record: Record) -> None:
        handler = self._handlers().get(type(record))
        if handler is None:  # pragma: no cover - records are a closed union
            raise PlanError(f"unknown record {record!r}")
        handler(record)

    def describe(self, record: Record) -> str:
        """Human-readable record text with names, for error messages and traces."""
        if isinstance(record, Compute):
            name, op = self._kernel_name(record.kernel)
            return f"compute {name!r} ({op}, #{record.kernel})"
        if isinstance(record, Move):
            how = record.mode + (f" over #{record.overlaps}" if record.overlaps is not None else "")
            return f"move {self._tensor_name(record.tensor)!r} to {record.to} ({how})"
        if isinstance(record, Recompute):
            name, op = self._kernel_name(record.kernel)
            outs = ", ".join(repr(self._tensor_name(t)) for t in record.outputs)
            return f"recompute {name!r} ({op}, #{record.kernel}) for {outs}"
        if isinstance(record, Fill):
            return f"fill {self._tensor_name(record.tensor)!r} with {record.value:g}"
        return f"free {self._tensor_name(record.tensor)!r} from {record.tier}"

    def _tensor_name(self, tid: int) -> str:
        if self.graph is not None:
            return self.graph.name_of(tid)
        rows = {int(row[0]): str(row[1]) for row in self.plan.names.get("tensors", ())}
        return rows.get(tid, f"#{tid}")

    def _kernel_name(self, kid: int) -> tuple[str, str]:
        if self.graph is not None:
            kernel = self.graph.kernels[kid]
            return kernel.name, kernel.op_type
        rows = {int(row[0]): (str(row[1]), str(row[2])) for row in self.plan.names.get("kernels",
                                                                                       ())}
        return rows.get(kid, (f"#{kid}", "?"))

    # ---- handlers for subclasses ---------------------------------------------------------
    def start(self) -> None:
        """Called once before the first record."""

    def finish(self) -> None:
        """Called once after the last record."""

    def after(self, record: Record) -> None:
        """Called after each record's handler (a walk that observes every record's effect)."""

    def compute(self, record: Compute) -> None:
        raise NotImplementedError

    def move(self, record: Move) -> None:
        raise NotImplementedError

    def free(self, record: Free) -> None:
        raise NotImplementedError

    def recompute(self, record: Recompute) -> None:
        """Re-run a forward kernel to regenerate some of its outputs in fast memory."""
        raise NotImplementedError

    def fill(self, record: Fill) -> None:
        """Make a fast copy of a tensor with one value in every element."""
        raise NotImplementedError
