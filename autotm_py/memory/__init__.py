"""Memory systems (tiers, links, presets) and byte accounting: how budgets are counted. The
time and memory rules built on them are `autotm_py.machine.MachineModel`."""

from autotm_py.memory.accounting import ALIGN_BYTES, aligned, resolve_budget
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
from autotm_py.units import Ratio, format_bytes, parse_bytes, parse_ratio

__all__ = [
    "ALIGN_BYTES", "FAST", "PRESETS", "SLOW", "Link", "MemorySystem", "Ratio",
    "TierSpec", "aligned", "format_bytes", "load_memory_system", "parse_bytes", "parse_ratio",
    "preset", "resolve_budget",
]
