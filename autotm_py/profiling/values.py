"""Value profiling: which tensors hold redundant values, as GVProf and ValueExpert report them,
at the granularity a memory planner acts on (one tensor, one iteration). docs/values.md.

`profile_values` runs iterations of an all-fast plan through the executor (`ValueProbe`: the
executor itself, which looks at every tensor once its record has made it) and classifies each
tensor over the iterations it saw:

- ``zero``: every element is 0 in every iteration;
- ``constant``: every element is one value, the same in every iteration (not 0);
- ``low-entropy``: at most `LOW_ENTROPY` distinct values in every iteration (a small
  histogram: masks, indices, labels, ReLU patterns of tiny tensors);
- ``varied``: anything else.

Beside the class: ``unchanged`` (its bytes were the same as in the previous iteration, in
every iteration after the first: weights of an inference graph, constants, a fixed batch) and
``copy_s``, what one copy out to the slow tier and back costs at the memory system's link
(sync), the time a planner spends if it moves the tensor. The planner uses only ``zero`` and
``constant`` (`value_fills`): such a tensor can be filled in place instead of copied.

The values are those of the run: seeded random weights and inputs unless the model file has
its own, so a profile of random weights says nothing about trained ones (`RANDOM_NOTE`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from autotm_py.errors import ConfigError
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.plan import Compute
from autotm_py.profiling.value_file import CLASSES, FILLABLE, FORMAT, FORMAT_VERSION
from autotm_py.runtime.executor import Executor
from autotm_py.runtime.memory import CachingMemory

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.memory.tiers import MemorySystem
    from autotm_py.plan import Plan, Record

LOW_ENTROPY = 16  # at most this many distinct values: low-entropy
HISTOGRAM = 8  # (value, count) pairs kept for a low-entropy tensor
UNIQUE_SAMPLE = 1 << 22  # distinct values counted on at most this many elements (strided)
RANDOM_NOTE = ("values of seeded random weights and inputs: trained weights and real data "
               "have other values (a zero or constant tensor here is one by construction: a "
               "mask, a zero buffer, a constant; a weight found low-entropy is not)")


@dataclass
class Seen:
    """What one tensor held over the iterations observed so far."""

    classes: list[str] = field(default_factory=list)  # per iteration
    values: set[float] = field(default_factory=set)  # the one value, where constant
    distinct: int = 0  # most distinct values in one iteration (capped at LOW_ENTROPY + 1)
    histogram: list[tuple[float, int]] = field(default_factory=list)
    digest: bytes | None = None
    repeats: int = 0  # iterations whose bytes equal the previous one's
    sampled: bool = False


def _digest(value: torch.Tensor) -> bytes:
    raw = value.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy()
    return hashlib.blake2b(raw.tobytes(), digest_size=16).digest()


def observe(seen: Seen, value: torch.Tensor) -> None:
    """Classify one iteration's value of a tensor into `seen`."""
    digest = _digest(value)
    if seen.digest is not None and digest == seen.digest:
        seen.repeats += 1
    seen.digest = digest
    flat = value.detach().reshape(-1)
    if flat.numel() == 0:
        seen.classes.append("zero")
        return
    if flat.dtype in (torch.bool, torch.bfloat16, torch.float16):
        flat = flat.to(torch.uint8 if flat.dtype == torch.bool else torch.float32)
    if bool((flat == flat[0]).all()):
        first = float(flat[0])
        seen.values.add(first)
        seen.distinct = max(seen.distinct, 1)
        seen.classes.append("zero" if first == 0 else "constant")
        return
    if flat.numel() > UNIQUE_SAMPLE:
        flat = flat[:: -(-flat.numel() // UNIQUE_SAMPLE)]
        seen.sampled = True
    uniques, counts = torch.unique(flat, return_counts=True)
    n = int(uniques.numel())
    seen.distinct = max(seen.distinct, min(n, LOW_ENTROPY + 1))
    if n <= LOW_ENTROPY:
        order = torch.argsort(counts, descending=True)[:HISTOGRAM]
        seen.histogram = [(float(uniques[i]), int(counts[i])) for i in order]
        seen.classes.append("low-entropy")
    else:
        seen.classes.append("varied")


def verdict(seen: Seen) -> str:
    """The class over every iteration: the weakest one seen (zero < constant < ... < varied);
    constant only where the one value was the same in every iteration."""
    worst = max(seen.classes, key=CLASSES.index, default="varied")
    if worst in FILLABLE and len(seen.values) > 1:
        return "low-entropy"
    return worst


class ValueProbe(Executor):
    """The executor, looking at every tensor once it exists: the given ones at the start of
    an iteration, each output after the Compute record that makes it."""

    def __init__(self, graph: TensorGraph, plan: Plan, *, device: str,
                 masters: Mapping[int, torch.Tensor]) -> None:
        super().__init__(graph, plan, device=device, masters=masters,
                         memory=CachingMemory(graph, plan, torch.device(device),
                                              sgd_foreach=False))
        self.seen: dict[int, Seen] = {}

    def _look(self, tid: int) -> None:
        store = self.state.fast if tid in self.state.fast else self.state.slow
        if tid in store:
            observe(self.seen.setdefault(tid, Seen()), store[tid])

    def start(self) -> None:
        super().start()
        for t in self.graph.tensors:
            if t.producer is None:
                self._look(t.id)

    def after(self, record: Record) -> None:
        if isinstance(record, Compute):
            for tid in self.graph.kernels[record.kernel].outputs:
                self._look(tid)


def profile_values(graph: TensorGraph, plan: Plan, *, masters: Mapping[int, torch.Tensor],
                   memory: MemorySystem, device: str = "cpu", iterations: int = 3,
                   weights: str = "") -> dict[str, Any]:
    """Run `iterations` of `plan` (all-fast) on `device` and return the value profile (the
    JSON document `autotm profile --values` writes; module docstring)."""
    if iterations < 1:
        raise ConfigError(f"--iterations {iterations}: at least 1")
    probe = ValueProbe(graph, plan, device=device, masters=masters)
    with torch.no_grad():
        for _ in range(iterations):
            probe.prepare()
            probe.run()
            if probe.cuda:
                torch.cuda.synchronize(probe.device)
    probe.release()
    rows = [_row(graph, tid, seen, memory) for tid, seen in sorted(probe.seen.items())]
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "model": graph.name,
            "model_hash": graph.model_hash, "device": device, "iterations": iterations,
            "memory": memory.name, "weights": weights, "note": RANDOM_NOTE,
            "tensors": rows, "totals": totals(rows)}


def _row(graph: TensorGraph, tid: int, seen: Seen, memory: MemorySystem) -> dict[str, Any]:
    t = graph.tensors[tid]
    nbytes = int(graph.tensor_bytes[tid])
    cls = verdict(seen)
    row: dict[str, Any] = {
        "tensor": tid, "name": t.name, "role": str(t.role), "dtype": t.dtype,
        "shape": list(t.shape), "bytes": nbytes, "class": cls,
        "value": next(iter(seen.values)) if cls in FILLABLE else None,
        "distinct": seen.distinct, "unchanged": seen.repeats == len(seen.classes) - 1 > 0,
        "copy_s": memory.copy_time(nbytes, SLOW, "sync") + memory.copy_time(nbytes, FAST,
                                                                             "sync")}
    if cls == "low-entropy" and seen.histogram:
        row["histogram"] = [list(pair) for pair in seen.histogram]
    if seen.sampled:
        row["sampled"] = True
    return row


def totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per class (and ``unchanged``): tensors, bytes and copy seconds."""
    out = {c: {"tensors": 0, "bytes": 0, "copy_s": 0.0} for c in (*CLASSES, "unchanged")}
    for row in rows:
        for key in (row["class"], "unchanged") if row["unchanged"] else (row["class"],):
            out[key]["tensors"] += 1
            out[key]["bytes"] += row["bytes"]
            out[key]["copy_s"] += row["copy_s"]
    return out
