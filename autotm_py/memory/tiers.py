"""Memory systems: a fast tier, a slow tier, and the link between them.

Two modes (DESIGN section 5):
- ``gpu``: fast = HBM, slow = pinned host memory. A kernel runs only when all of its inputs and
  outputs are in fast memory. Copies run on two copy engines, one per direction, which overlap
  with compute and with each other.
- ``host``: fast = DRAM, slow = Optane/CXL/remote NUMA. A kernel may read and write the slow tier
  directly; its time then depends on where each input/output lives (see `slow_access_time`).

All bandwidths are bytes per second, latencies seconds. Every preset names its source.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from autotm_py.errors import ConfigError

Mode = Literal["gpu", "host"]
FAST, SLOW = "fast", "slow"
TIERS = (FAST, SLOW)


@dataclass(frozen=True)
class Link:
    """Copy bandwidths between the tiers, per direction, for blocking and overlapped copies."""

    read_bw: float  # slow -> fast, synchronous copy
    write_bw: float  # fast -> slow, synchronous copy
    async_read_bw: float  # slow -> fast, overlapped with compute
    async_write_bw: float  # fast -> slow, overlapped with compute
    latency_s: float = 0.0
    both_directions_bw: float | None = None  # total when both directions copy at once

    def copy_time(self, nbytes: int, to_tier: str, asynchronous: bool) -> float:
        if to_tier == FAST:
            bw = self.async_read_bw if asynchronous else self.read_bw
        else:
            bw = self.async_write_bw if asynchronous else self.write_bw
        return self.latency_s + nbytes / bw


@dataclass(frozen=True)
class TierSpec:
    """Direct-access speed of one tier (used in host mode for kernels that touch it)."""

    name: str
    read_bw: float
    write_bw: float
    latency_s: float
    capacity_bytes: int | None = None  # None: unbounded


@dataclass(frozen=True)
class MemorySystem:
    """A two-tier memory system. `budget_bytes` (the fast capacity) is set by `with_budget`."""

    name: str
    mode: Mode
    fast: TierSpec
    slow: TierSpec
    link: Link
    source: str
    budget_bytes: int | None = None
    measured: dict[str, Any] = field(default_factory=dict)

    def with_budget(self, budget_bytes: int | None) -> MemorySystem:
        return replace(self, budget_bytes=None if budget_bytes is None else int(budget_bytes))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, origin: str = "memory-system data") -> MemorySystem:
        try:
            return cls(
                name=str(data["name"]),
                mode=_check_mode(data["mode"], origin),
                fast=TierSpec(**data["fast"]),
                slow=TierSpec(**data["slow"]),
                link=Link(**data["link"]),
                source=str(data.get("source", origin)),
                budget_bytes=data.get("budget_bytes"),
                measured=dict(data.get("measured", {})),
            )
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"{origin}: not a valid memory-system file ({exc}); see "
                              "docs/memory-systems.md for the format") from None


def _check_mode(mode: Any, origin: str) -> Mode:
    if mode not in ("gpu", "host"):
        raise ConfigError(f"{origin}: mode must be 'gpu' or 'host', not {mode!r}")
    return mode  # type: ignore[no-any-return]


GB = 1e9

# DRAM of a two-socket Cascade Lake class server, six DDR4-2666 channels per socket (the
# machine of the AutoTM paper); latency about 81 ns (Izraelevitz et al. 2019).
_DRAM = TierSpec("dram", read_bw=105 * GB, write_bw=70 * GB, latency_s=81e-9)

PRESETS: dict[str, MemorySystem] = {
    # Izraelevitz et al. 2019 (arXiv 1903.05714): six interleaved Optane DC PMM DIMMs,
    # about 39.4 GB/s read and 13.9 GB/s write, about 3x DRAM latency (305 ns random read).
    # Overlapped copies use one thread in AutoTM's runtime: its constants were 2 / 2.5 GB/s.
    "optane": MemorySystem(
        name="optane",
        mode="host",
        fast=_DRAM,
        slow=TierSpec("optane", read_bw=39.4 * GB, write_bw=13.9 * GB, latency_s=305e-9),
        link=Link(read_bw=29 * GB, write_bw=12 * GB, async_read_bw=2.0 * GB,
                  async_write_bw=2.5 * GB, latency_s=2e-6),
        source="Izraelevitz et al. 2019 (Optane DC PMM, 6 DIMMs); copy rates from AutoTM's "
               "measured move kernels",
    ),
    # A CXL 2.0 Type-3 memory expander on a PCIe Gen5 x16 link: about 2x DRAM latency
    # (~250 ns loaded) and up to ~52 GB/s per direction in published expander measurements
    # (Sun et al., MICRO 2023, "Demystifying CXL Memory"). Symmetric read/write.
    "cxl": MemorySystem(
        name="cxl",
        mode="host",
        fast=_DRAM,
        slow=TierSpec("cxl", read_bw=52 * GB, write_bw=52 * GB, latency_s=250e-9),
        link=Link(read_bw=45 * GB, write_bw=45 * GB, async_read_bw=20 * GB,
                  async_write_bw=20 * GB, latency_s=1e-6),
        source="Sun et al. MICRO 2023 (CXL memory expander, PCIe Gen5 x16)",
    ),
    # H100 SXM over PCIe Gen5 x16, pinned host memory: about 55 GB/s each way, about 91 GB/s
    # both ways at once (DESIGN section 5). Replaced by `autotm calibrate` output when present.
    "h100-pcie5": MemorySystem(
        name="h100-pcie5",
        mode="gpu",
        fast=TierSpec("hbm3", read_bw=3000 * GB, write_bw=3000 * GB, latency_s=0.0),
        slow=TierSpec("pinned-host", read_bw=55 * GB, write_bw=55 * GB, latency_s=0.0),
        link=Link(read_bw=55 * GB, write_bw=55 * GB, async_read_bw=55 * GB,
                  async_write_bw=55 * GB, latency_s=10e-6, both_directions_bw=91 * GB),
        source="H100 SXM, PCIe Gen5 x16, pinned; measured (see DESIGN section 5)",
    ),
}


def preset(name: str) -> MemorySystem:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown memory system {name!r}; presets: {', '.join(PRESETS)}, or "
                          "give a memory-system JSON file") from None


def load_memory_system(spec: str | os.PathLike[str]) -> MemorySystem:
    """A preset name or the path of a memory-system JSON file (as written by calibrate)."""
    text = str(spec)
    if text in PRESETS:
        return PRESETS[text]
    path = Path(text)
    if not path.exists():
        raise ConfigError(f"memory system {text!r} is neither a preset ({', '.join(PRESETS)}) "
                          "nor an existing JSON file")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read memory-system JSON ({exc})") from None
    return MemorySystem.from_dict(data, origin=str(path))
