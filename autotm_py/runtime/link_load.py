"""The link's load over a simulated timeline, which sets the pace of the host's optimizer
updates (`runtime.simulate`'s `_host_updates`): the host's memory serves both
(`memory.tiers.MemorySystem.host_update_speed`)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence

from autotm_py.runtime.simulate_result import MoveSpan


class LinkLoad:
    """The bytes a second the link's copies of a timeline move, as steps in time, for the
    host's updates, which share host memory with them (`MemorySystem.host_update_speed`)."""

    def __init__(self, moves: Sequence[MoveSpan]) -> None:
        change: dict[float, float] = {}
        for m in moves:
            if m.end_s > m.start_s:
                rate = m.bytes / (m.end_s - m.start_s)
                change[m.start_s] = change.get(m.start_s, 0.0) + rate
                change[m.end_s] = change.get(m.end_s, 0.0) - rate
        self.times = sorted(change)
        self.loads = list(itertools.accumulate(change[t] for t in self.times))

    def work_end(self, start: float, amount: float, speed: Callable[[float], float]) -> float:
        """When `amount` of work begun at `start` ends, done at `speed(load)` a second."""
        i = bisect.bisect_right(self.times, start) - 1
        t = start
        while True:
            load = self.loads[i] if i >= 0 else 0.0
            pace = speed(max(load, 0.0))
            until = self.times[i + 1] if i + 1 < len(self.times) else math.inf
            if (until - t) * pace >= amount:
                return t + amount / pace
            amount -= (until - t) * pace
            t, i = until, i + 1
