"""Memory systems (tiers, links, presets), budgets, byte accounting, and `MachineModel`: the
time and memory rules that the planner, the baselines and the simulator share."""

from autotm_py.memory.accounting import ALIGN_BYTES, aligned, resolve_budget
from autotm_py.memory.budget import Ratio, format_bytes, parse_bytes, parse_ratio
from autotm_py.memory.model import MachineModel
from autotm_py.memory.tiers import (
    FAST,
    PRESETS,
    SLOW,
    Link,
    MemorySystem,
    TierSpec,
    load_memory_system,
    preset,
)

__all__ = [
    "ALIGN_BYTES", "FAST", "PRESETS", "SLOW", "Link", "MachineModel", "MemorySystem", "Ratio",
    "TierSpec", "aligned", "format_bytes", "load_memory_system", "parse_bytes", "parse_ratio",
    "preset", "resolve_budget",
]
