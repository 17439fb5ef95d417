"""`KernelCosts`: what each kernel of a graph costs, as measured or estimated; a plain record.

Times are seconds with every input and output in fast memory (medians of measured runs, or
roofline estimates flagged in `estimated`). Where the slow tier is real (a second NUMA node),
`measured_placements` holds times of kernels with IO in the slow tier. Pricing a placement on
a memory system is the machine model's job (`machine.MachineModel.placement_time`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

DIGEST_CHARS = 16
# how a plan's note begins when some of its kernel times are another device's
# (`KernelCosts.borrowed_note`); the Trainer passes such notes on
BORROWED_NOTE = "costs: "


# What a replayed CUDA graph adds per kernel node beyond the kernels' device time, where no output
# is copied into a slot: (all-fast iteration replayed with static inputs - sum of device times) /
# kernels, H100 80GB HBM3, 2026-11-26 (experiments/results/native/,
# experiments/journal/gpu-2026-11.md): ResNet-200 (57.8 - 56.1 ms) / 1965 = 0.9 us, DenseNet-264
# (64.3 - 61.5) / 2792 = 1.0, BERT-base 1.1-2.6 (two device-time sums); GPT-2 small replayed at its
# sum.
REPLAY_GAP_S = 1.0e-6
# In an arena, each output a kernel cannot write in place (`memory.scratch.allocated_outputs`)
# is copied into its slot: read and written once, at this rate. Fitted as (replayed in an
# arena - replayed with static inputs) / (2 x the bytes copied), same runs: ResNet-200 3.0 TB/s
# (12.7 GB in 8.4 ms), DenseNet-264 3.5, GPT-2 small 2.6, BERT-base 1.8.
SLOT_COPY_BYTES_PER_S = 3.0e12
# How much longer a host<->device copy takes in a replayed graph than the same copy run eagerly,
# per direction (`MachineModel.copying` prices a plan priced for replay with them). Measured
# with the torch profiler (experiments/gpu/replay_profile.py), total copy time of one iteration
# of the same plan at planned addresses, replay / eager. With CUDA's default 8 hardware work
# queues every copy of a replay ran slower: to the host 1.12-1.14, to the device 1.02-1.12
# (H100 and H200, 2026-11-27..29; factors 1.04 / 1.13 until 2026-11-29). With one queue, which
# `autotm run --graph` and `autotm bench --arena` now set for their replays
# (`runtime.device.use_replay_work_queues`), they run at their eager speed: 0.992-1.009 on the
# move-only plans of Inception-v4 (50%), DenseNet-264 (33%) and ResNet-50 (50%, 25%) (H200,
# 2026-11-29; docs/gpu.md, "Copies in a replay: the work queues").
# experiments/gpu/copy_factor_grid.py predicts measured rows under other factors.
REPLAY_TO_FAST_SLOWDOWN = 1.0
REPLAY_TO_SLOW_SLOWDOWN = 1.0


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
    # empty or 0 where unknown). The capacity rows count it (machine.py).
    workspace_bytes: tuple[int, ...] = ()
    # per kernel: seconds it keeps the GPU busy, without the launch gaps that `times_s` holds
    # (in-context CUDA profiles; 0 where unknown, empty where none is). The simulator runs
    # kernels on a GPU clock with it and the host's dispatch on a clock of `times_s`.
    device_s: tuple[float, ...] = ()
    # the device whose profiles these costs prefer (its name, e.g. "NVIDIA H200"; "" for costs
    # not from profiles). A GPU plan records it (`PlanHeader.gpu`) to be priced the same later.
    target: str = ""

    @classmethod
    def from_times(cls, device: str, times_s: Sequence[float],
                   estimated: Sequence[bool] | None = None) -> KernelCosts:
        t = tuple(float(x) for x in times_s)
        est = tuple(estimated) if estimated is not None else (False,) * len(t)
        return cls(device, t, t, t, est)

    def replayed(self, copied_bytes: Sequence[int] | None = None,
                 io_bytes: Sequence[int] | None = None,
                 folded: Sequence[bool] | None = None) -> KernelCosts:
        """The costs of an iteration replayed as a CUDA graph: the host enqueues the whole
        iteration at once, so each kernel costs its device time plus the graph's gap between
        two kernel nodes (`REPLAY_GAP_S`), plus copying `copied_bytes[k]` of its outputs into
        their arena slots (`SLOT_COPY_BYTES_PER_S`; None: a replay without an arena copies
        none). A measured kernel without a device time (it launched nothing of its own: a view,
        an SGD update folded into its run's foreach launch) costs its `io_bytes[k]` (read and
        written) at that rate, where `io_bytes` is given; else, and for estimated kernels, its
        time as the profile has it. So does every kernel `folded[k]` (the SGD updates an arena
        run folds into multi-tensor launches) whatever its profile says, on both clocks: a
        profile timed alone gives each update a launch of its own."""
        if not self.device_s:
            return self
        n = len(self.times_s)
        copies = copied_bytes or (0,) * n
        io = io_bytes or (None,) * n
        fold = [bool(f) and io[k] is not None for k, f in enumerate(folded or (False,) * n)]
        times = tuple((io[k] / SLOT_COPY_BYTES_PER_S if fold[k]  # type: ignore[operator]
                       else self._replayed_time(k, io[k])) + 2 * copies[k] / SLOT_COPY_BYTES_PER_S
                      for k in range(n))
        device = tuple(0.0 if fold[k] else d for k, d in enumerate(self.device_s))
        return replace(self, times_s=times, device_s=device)

    def _replayed_time(self, k: int, io_bytes: int | None) -> float:
        # A measured kernel without a device time launched no GPU work of its own in the
        # profiled iteration: a view, or an SGD update after the first of a run, which the
        # executor runs as one foreach launch at the run's first record
        # (`runtime.reuse.update_runs`). Replayed, it costs the bytes it reads and writes at
        # `SLOT_COPY_BYTES_PER_S` and no node gap: the foreach update streams them at about
        # that rate. (Until 2026-11-28 each cost at least 2 us plus the gap, fitted on
        # DenseNet-264's updates launched one by one before the foreach update: its replays
        # were over-predicted by 3-4%, ResNet-50's all-fast replay by 6%.)
        if self.device_s[k] > 0:
            return self.device_s[k] + REPLAY_GAP_S
        if io_bytes is None or self.estimated[k]:
            return self.times_s[k]
        return io_bytes / SLOT_COPY_BYTES_PER_S

    def spliced(self, origins: Sequence[tuple[int, bool]], fresh: KernelCosts,
                chunks: Mapping[int, int] | None = None,
                factors: Mapping[int, float] | None = None) -> KernelCosts:
        """The costs of a graph whose kernels were split into parts (`ir.conv_split`):
        `origins[k]` is (the kernel here that kernel k is or is a part of, whether a part),
        `fresh` the split graph's costs from the profiles. A kernel kept costs what it did
        here. A part costs what `fresh` says, but where `fresh` only estimates it and the
        kernel it came from was measured, the parts share that kernel's times in proportion to
        their estimates (its one launch more is not priced) and, like a part whose workspace
        is not measured, take its workspace (an upper bound: the fused call runs them one
        after the other). `chunks[k]`: part k is its kernel (a recurrent kernel), or a part of
        it (a convolution's filter or data gradient), run over that many slices of the batch
        in turn: unmeasured, it takes that share of its measured workspace and `factors[k]`
        times its share of the kernel's measured time (default: the chunks, each slice at most
        the whole batch's; `ir.conv_split.chunked_time_factor`: about once for a recurrence
        over chunks of its sequence)."""
        n = len(origins)
        measured = {o for o, part in origins if part and not self.estimated[o]}
        shares = {o: sum(fresh.times_s[k] for k, (p, part) in enumerate(origins)
                         if part and p == o) for o in measured}

        slices = dict(chunks or {})
        times = dict(factors if factors is not None else slices)

        def one(k: int, mine: Sequence[Any], theirs: Sequence[Any], field_: str) -> Any:
            o, part = origins[k]
            if not part:
                return mine[o]
            if field_ == "workspace_bytes":
                share = -(-mine[o] // slices.get(k, 1))
                return max(theirs[k], share) if fresh.estimated[k] else theirs[k]
            if not (fresh.estimated[k] and o in measured):
                return theirs[k]
            if field_ == "scaled":
                return mine[o]
            # a part's share of the measured kernel (a chunked recurrent kernel: all of it),
            # times the factor of its chunks (k slices of a batch, about once a sequence)
            share = fresh.times_s[k] / shares[o] if shares[o] > 0 else 0.5
            return mine[o] * share * times.get(k, 1)

        def column(field_: str, default: Any) -> tuple:
            mine, theirs = getattr(self, field_), getattr(fresh, field_)
            if not mine and not theirs:
                return ()
            return tuple(one(k, mine or (default,) * len(self.times_s),
                             theirs or (default,) * n, field_) for k in range(n))

        estimated = tuple(self.estimated[o] if not part else bool(fresh.estimated[k])
                          for k, (o, part) in enumerate(origins))
        placements = {k: self.measured_placements[o] for k, (o, part) in enumerate(origins)
                      if not part and o in self.measured_placements}
        placements.update({k: fresh.measured_placements[k] for k, (_, part) in
                           enumerate(origins) if part and k in fresh.measured_placements})
        return replace(
            self, times_s=column("times_s", 0.0), p10_s=column("p10_s", 0.0),
            p90_s=column("p90_s", 0.0), estimated=estimated, measured_placements=placements,
            scaled=column("scaled", False), workspace_bytes=column("workspace_bytes", 0),
            device_s=column("device_s", 0.0))

    def reordered(self, order: Sequence[int]) -> KernelCosts:
        """These costs for the same kernels in another order: kernel k of the result is kernel
        `order[k]` here (`ir.update_order`)."""
        return self.spliced([(o, False) for o in order], self)

    @property
    def total_s(self) -> float:
        return sum(self.times_s)

    @property
    def n_estimated(self) -> int:
        return sum(self.estimated)

    @property
    def n_scaled(self) -> int:
        return sum(self.scaled)

    @property
    def n_borrowed(self) -> int:
        """Kernels priced with the profiles of another device than `target` (no profile of
        theirs on it)."""
        return int(self.summary.get("borrowed", 0) or 0)

    def borrowed_note(self) -> str | None:
        """What a plan priced with these costs says when some of its kernel times come from
        another device's profiles: the plan's times are then that device's, not `target`'s."""
        if not self.n_borrowed:
            return None
        others = " and ".join(self.summary.get("borrowed_from") or ()) or "another device"
        fix = f"autotm profile MODEL on the {self.target}" if self.target else "autotm profile"
        return (f"{BORROWED_NOTE}{self.n_borrowed} of {len(self.times_s)} kernel times come from "
                f"profiles of the {others}, not of the {self.target or 'target'} (measure them: "
                f"{fix})")

    @property
    def n_precision_scaled(self) -> int:
        """bf16 kernels priced from the profile entry of their fp32 form, scaled by the
        roofline (no bf16 entry of theirs: `profiling.sources`)."""
        return int(self.summary.get("precision_scaled", 0) or 0)

    def precision_note(self) -> str | None:
        """What a plan priced with these costs says when some bf16 kernels were priced from
        fp32 profiles: their times are the fp32 kernels' scaled by the roofline's bf16/fp32
        ratio, not measured."""
        if not self.n_precision_scaled:
            return None
        where = f" on the {self.target}" if self.target else ""
        return (f"{BORROWED_NOTE}{self.n_precision_scaled} of {len(self.times_s)} kernel times "
                "are bf16 kernels priced from fp32 profiles, scaled by the roofline's bf16/fp32 "
                f"ratio (measure them: autotm profile MODEL --precision bf16{where})")

    def notes(self) -> tuple[str, ...]:
        """The notes a plan priced with these costs carries: kernel times from another
        device's profiles (`borrowed_note`), bf16 kernels priced from fp32 ones
        (`precision_note`)."""
        return tuple(n for n in (self.borrowed_note(), self.precision_note()) if n)

    @cached_property
    def digest(self) -> str:
        """The identity of these costs: a hash over each kernel's time, device time, workspace
        and estimated flag, and the measured slow-tier placements. A plan records it
        (`PlanHeader.costs`) so that a reader can tell when today's profiles price it
        differently."""
        n = len(self.times_s)
        device = self.device_s or (0.0,) * n
        workspace = self.workspace_bytes or (0,) * n
        rows = [[repr(float(t)), repr(float(d)), int(w), bool(e)] for t, d, w, e in
                zip(self.times_s, device, workspace, self.estimated or (False,) * n,
                    strict=True)]
        placements = {str(k): {p: repr(float(v)) for p, v in sorted(m.items())}
                      for k, m in sorted(self.measured_placements.items())}
        text = json.dumps([rows, placements], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]
