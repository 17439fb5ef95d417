"""Memory systems (tiers, links, presets) and budgets."""

from autotm_py.memory.budget import Ratio, format_bytes, parse_bytes, parse_ratio
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
    "FAST", "PRESETS", "SLOW", "Link", "MemorySystem", "Ratio", "TierSpec", "format_bytes",
    "load_memory_system", "parse_bytes", "parse_ratio", "preset",
]
