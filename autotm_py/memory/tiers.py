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
from autotm_py.fileio import atomic_write_text

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
    # Fast memory the runtime keeps for itself whatever the plan (GPU: the cuBLAS/cuBLASLt
    # workspaces torch allocates once per stream). It comes out of every budget, so tensors
    # get budget - reserve and the process as a whole stays within the budget.
    runtime_reserve_bytes: int = 0
    # GPU mode: fp32 parameters a second the host's vectorised optimizer update runs at
    # (`ir.host_updates`); None: `DEFAULT_HOST_UPDATE_RATE`
    host_update_rate: float | None = None

    def host_update_s(self, numel: int) -> float:
        """Seconds the host's update of a weight of `numel` parameters takes, with the
        per-update overhead."""
        return HOST_UPDATE_OVERHEAD_S + numel / (self.host_update_rate or
                                                 DEFAULT_HOST_UPDATE_RATE)

    def with_copies_slower(self, to_fast: float, to_slow: float) -> MemorySystem:
        """The same system with its link's bandwidths into the fast tier divided by `to_fast`
        and into the slow tier by `to_slow` (both directions at once: by their mean)."""
        link = self.link
        both = None if link.both_directions_bw is None else \
            link.both_directions_bw / ((to_fast + to_slow) / 2)
        return replace(self, link=replace(
            link, read_bw=link.read_bw / to_fast, async_read_bw=link.async_read_bw / to_fast,
            write_bw=link.write_bw / to_slow, async_write_bw=link.async_write_bw / to_slow,
            both_directions_bw=both))

    def with_budget(self, budget_bytes: int | None) -> MemorySystem:
        return replace(self, budget_bytes=None if budget_bytes is None else int(budget_bytes))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the system as a memory-system JSON file (atomically)."""

        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    # ---- copy timing rules shared by the planner and the simulator ------------------------
    def copy_time(self, nbytes: int, to_tier: str, mode: str) -> float:
        """Seconds to copy `nbytes` into `to_tier` (latency + bytes / bandwidth)."""
        return self.link.copy_time(nbytes, to_tier, mode == "async")

    def stream_of(self, to_tier: str) -> str:
        """The copy stream an overlapped copy runs on. GPU: one engine per direction; host:
        one copy thread for both directions (AutoTM's runtime), so their copies add up."""
        if self.mode == "gpu":
            return "h2d" if to_tier == FAST else "d2h"
        return "copy"

    def async_terms(self, nbytes: int, to_tier: str) -> tuple[tuple[str, float], ...]:
        """What one overlapped copy adds to each lower bound of its kernel's step time.

        A step lasts max(kernel, and per term the sum over the step's copies): the copy's own
        stream time, and in GPU mode with a both-directions bandwidth its share of that shared
        link (``bytes / both_directions_bw``). The ILP's epigraph rows and the simulator both
        call this one function, so they agree by construction."""
        terms = [(self.stream_of(to_tier), self.copy_time(nbytes, to_tier, "async"))]
        both = self.link.both_directions_bw
        if self.mode == "gpu" and both:
            terms.append(("link", nbytes / both))
        return tuple(terms)

    def validate(self, origin: str = "memory system") -> MemorySystem:
        """Raise `ConfigError` unless bandwidths are positive and latencies non-negative."""
        link = self.link
        bws = {"fast.read_bw": self.fast.read_bw, "fast.write_bw": self.fast.write_bw,
               "slow.read_bw": self.slow.read_bw, "slow.write_bw": self.slow.write_bw,
               "link.read_bw": link.read_bw, "link.write_bw": link.write_bw,
               "link.async_read_bw": link.async_read_bw,
               "link.async_write_bw": link.async_write_bw}
        if link.both_directions_bw is not None:
            bws["link.both_directions_bw"] = link.both_directions_bw
        for key, value in bws.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{origin}: {key} must be a positive number of bytes/s, "
                                  f"not {value!r}")
        lats = {"fast.latency_s": self.fast.latency_s, "slow.latency_s": self.slow.latency_s,
                "link.latency_s": link.latency_s}
        for key, value in lats.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"{origin}: {key} must be >= 0 seconds, not {value!r}")
        return self

    def describe(self) -> str:
        """One line: name, mode, the slow tier and the copy bandwidths in GB/s."""
        link = self.link
        return (f"{self.name} ({self.mode} mode): {self.fast.name} + {self.slow.name} "
                f"(direct {self.slow.read_bw / GB:g}/{self.slow.write_bw / GB:g} GB/s r/w); "
                f"copies {link.read_bw / GB:g}/{link.write_bw / GB:g} GB/s in/out, overlapped "
                f"{link.async_read_bw / GB:g}/{link.async_write_bw / GB:g} GB/s")

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, origin: str = "memory-system data") -> MemorySystem:
        if not isinstance(data, dict):
            raise ConfigError(f"{origin}: a memory-system file holds one JSON object; see "
                              "docs/memory-systems.md for the format")
        try:
            system = cls(
                name=str(data["name"]),
                mode=_check_mode(data["mode"], origin),
                fast=TierSpec(**data["fast"]),
                slow=TierSpec(**data["slow"]),
                link=Link(**data["link"]),
                source=str(data.get("source", origin)),
                budget_bytes=data.get("budget_bytes"),
                measured=dict(data.get("measured", {})),
                runtime_reserve_bytes=int(data.get("runtime_reserve_bytes", 0)),
                host_update_rate=data.get("host_update_rate"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{origin}: not a valid memory-system file ({exc}); see "
                              "docs/memory-systems.md for the format") from None
        return system.validate(origin)


def _check_mode(mode: Any, origin: str) -> Mode:
    if mode not in ("gpu", "host"):
        raise ConfigError(f"{origin}: mode must be 'gpu' or 'host', not {mode!r}")
    return mode  # type: ignore[no-any-return]


GB = 1e9

# DRAM of a two-socket Cascade Lake class server, six DDR4-2666 channels per socket (the
# machine of the AutoTM paper); latency about 81 ns (Izraelevitz et al. 2019).
_DRAM = TierSpec("dram", read_bw=105 * GB, write_bw=70 * GB, latency_s=81e-9)

# The H200 host's (16 cores, 2026-12-04): torch.optim.AdamW(fused=True) on fp32 CPU tensors
# updates 5.07e9 parameters a second (`experiments/gpu/cpu_adam_probe.py`,
# experiments/results/beyond_card/2026-12-04/). Systems that measured none use it. An update
# of a tiny tensor (the per-update overhead) took 0.14 ms on a 2-core machine (the probe's
# `host_side`, 2026-12-05, experiments/results/scale/2026-12-05/cpu_probe_2core.json), taken
# as it is until measured on the H200's host.
DEFAULT_HOST_UPDATE_RATE = 5.07e9
HOST_UPDATE_OVERHEAD_S = 1.4e-4

PRESETS: dict[str, MemorySystem] = {
    # Izraelevitz et al. 2019 (arXiv 1903.05714): six interleaved Optane DC PMM DIMMs,
    # about 39.4 GB/s read and 13.9 GB/s write, about 3x DRAM latency (305 ns random read).
    # Copy rates are AutoTM's own constants (abstractoptimizer.jl BANDWIDTHS: 29/12 GB/s for
    # blocking copies with several threads, 2/2.5 GB/s for its single-threaded overlapped copy).
    "optane": MemorySystem(
        name="optane",
        mode="host",
        fast=_DRAM,
        slow=TierSpec("optane", read_bw=39.4 * GB, write_bw=13.9 * GB, latency_s=305e-9),
        link=Link(read_bw=29 * GB, write_bw=12 * GB, async_read_bw=2.0 * GB,
                  async_write_bw=2.5 * GB, latency_s=2e-6),
        source="Izraelevitz et al. 2019 (Optane DC PMM, 6 interleaved DIMMs); copy rates are "
               "AutoTM's constants (29/12 GB/s blocking, 2/2.5 GB/s overlapped)",
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
    # H100 80GB HBM3 (SXM) over PCIe Gen5 x16, pinned host memory, measured by
    # `autotm calibrate --device cuda` on 2026-11-26 (profiles/memory/h100-80gb-hbm3.json):
    # 55.3 GB/s host->device and 55.2 GB/s device->host alone, about 50 GB/s each while matmuls
    # run (the overlapped rates), 94.2 GB/s both ways at once, about 9 us per copy. Runtime
    # reserve: plans that copy only on the compute stream peaked 65-67 MiB above their modelled
    # tensors in every run (experiments/journal/gpu-2026-11.md): torch's cuBLAS and cuBLASLt
    # workspaces.
    "h100-pcie5": MemorySystem(
        name="h100-pcie5",
        mode="gpu",
        fast=TierSpec("hbm3", read_bw=3049 * GB, write_bw=3049 * GB, latency_s=0.0),
        slow=TierSpec("pinned-host", read_bw=55.3 * GB, write_bw=55.2 * GB, latency_s=0.0),
        link=Link(read_bw=55.3 * GB, write_bw=55.2 * GB, async_read_bw=50.2 * GB,
                  async_write_bw=49.9 * GB, latency_s=9e-6, both_directions_bw=94.2 * GB),
        runtime_reserve_bytes=68 << 20,
        # the Trainer's host updates (one fused AdamW per weight) on that machine's 16 cores
        host_update_rate=4.37e9,
        source="autotm calibrate, NVIDIA H100 80GB HBM3, PCIe Gen5 x16, pinned, 2026-11-26 "
               "(profiles/memory/h100-80gb-hbm3.json); host AdamW: cpu_adam_probe host_side, "
               "2026-12-05 (experiments/results/beyond_card/2026-12-05)",
    ),
    # H200 (141 GB HBM3e) over PCIe Gen5 x16, pinned host memory, measured the same way on
    # 2026-11-29 (profiles/memory/h200.json): 55.6 GB/s host->device and 55.4 GB/s back alone
    # as on the H100, but 53.5 / 53.6 GB/s while matmuls run (the H100: 50.2 / 49.9), 102.1 GB/s
    # both ways at once, about 11 us per copy; HBM copies at 4.3 TB/s. One host's measurement.
    # Runtime reserve: the H100's (the same torch workspaces). `--gpu h200` plans with it
    # (`config.GPU_MEMORY`).
    "h200-pcie5": MemorySystem(
        name="h200-pcie5",
        mode="gpu",
        fast=TierSpec("hbm3e", read_bw=4296 * GB, write_bw=4296 * GB, latency_s=0.0),
        slow=TierSpec("pinned-host", read_bw=55.6 * GB, write_bw=55.4 * GB, latency_s=0.0),
        link=Link(read_bw=55.6 * GB, write_bw=55.4 * GB, async_read_bw=53.5 * GB,
                  async_write_bw=53.6 * GB, latency_s=10.8e-6, both_directions_bw=102.1 * GB),
        runtime_reserve_bytes=68 << 20,
        host_update_rate=DEFAULT_HOST_UPDATE_RATE,
        source="autotm calibrate, NVIDIA H200, PCIe Gen5 x16, pinned, 2026-11-29 "
               "(profiles/memory/h200.json); host AdamW: cpu_adam_probe, 2026-12-04",
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


def simulated_tier_note(memory: MemorySystem) -> str | None:
    """Host mode: the slow tier is a model (a preset's or a calibration's bandwidths), not
    memory this machine has; `autotm run --device cpu` keeps both tiers in its DRAM."""
    if memory.mode != "host":
        return None
    origin = "a calibration file's" if memory.measured else f"the {memory.name} preset's"
    return (f"host mode: the slow tier ({memory.slow.name}) is simulated from {origin} "
            "bandwidths; `autotm run --device cpu` keeps both tiers in this machine's DRAM (a "
            "check of the plan, not of its speed)")


def cpu_run_note(memory: MemorySystem) -> str:
    """What a run on the CPU of a plan for `memory` does not measure: no slow tier of it
    exists there (host mode: it is simulated; GPU mode: no GPU, no link)."""
    if memory.mode == "host":
        return (f"the plan's slow tier ({memory.slow.name}) is simulated: both tiers ran in "
                "this machine's DRAM, so the measured time is not what the prediction models")
    return ("a GPU-mode plan run on the CPU: both tiers in host memory, no GPU and no link; "
            "the measured time checks the plan, not its speed")
