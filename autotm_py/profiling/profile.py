"""`profile` (measure what is missing, cache it) and `load_costs` (no measuring).

Profiles live in two directories: the shipped `profiles/` of the project and the user cache
(`--profiles DIR`, else `AUTOTM_PROFILES`, else `~/.cache/autotm/profiles`). `profile` measures
each unique kernel signature of the graph that has no entry for this exact device fingerprint,
writes the new entries to the user cache every few kernels (so an interrupted run resumes where
it stopped), and returns the graph's costs. `load_costs` resolves costs from what is cached
(`profiling/sources.py`): exact, then batch-scaled, then roofline estimates.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotm_py.costs import KernelCosts
from autotm_py.errors import ConfigError
from autotm_py.ir.layout import (
    CHANNELS_LAST,
    has_convolutions,
    is_channels_last,
    signature_layout,
    to_channels_last,
)
from autotm_py.profiling import torch_profiler
from autotm_py.profiling.cache import (
    MEASURED,
    ProfileEntry,
    load_sets,
    now_iso,
    profile_path,
    shipped_profiles_dir,
    user_profiles_dir,
    write_entries,
)
from autotm_py.profiling.fingerprint import (
    Fingerprint,
    check_device,
    current_fingerprint,
    profiled_gpu,
    target_fingerprint,
)
from autotm_py.profiling.progress import ProgressCallback, progress_reporter
from autotm_py.profiling.sources import CostSources, all_fast, graph_batch

if TYPE_CHECKING:
    from autotm_py.ir.graph import Kernel, TensorGraph
    from autotm_py.profiling.torch_profiler import Runner

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]
FLUSH_EVERY_S = 5.0  # write measured entries at least this often
FLUSH_EVERY_N = 8  # ... and every this many kernels


def load_costs(graph: TensorGraph, *, device: str = "cuda",
               profiles_dir: PathLike | None = None,
               shipped_dir: PathLike | None = None, gpu: str | None = None) -> KernelCosts:
    """Costs from the user cache and shipped profiles; no kernel is run.

    `device="cuda"` prefers the profiles of `gpu` (a GPU name, or a part of one that names one
    GPU with profiles: "h200"), else this machine's GPU, else (no GPU here) the shipped H100
    profiles; a machine that differs from every profile uses the closest one of its device kind
    (logged), as does a kernel that the preferred GPU's profiles lack.
    """
    kind = check_device(device)
    sources = cost_sources(kind, target_fingerprint(kind), profiles_dir, shipped_dir, gpu=gpu)
    return sources.costs(graph)


def default_layout(graph: TensorGraph, costs: KernelCosts, *,
                   profiles_dir: PathLike | None = None, shipped_dir: PathLike | None = None,
                   gpu: str | None = None) -> tuple[TensorGraph, KernelCosts]:
    """The layout a GPU plan stores `graph` in when none is asked for (docs/layout.md):
    channels-last (`ir.layout`) where the model has convolutions and the profiles that price
    it (`costs`: the GPU's own, as `load_costs` with `gpu` found them) have its channels-last
    kernels: at least one of them profiled, and no fewer kernels priced from that GPU's own
    profiles than in N, C, H, W; else the graph as it is. Returns the graph and its costs."""
    if costs.device != "cuda" or is_channels_last(graph) or not has_convolutions(graph):
        return graph, costs
    candidate = to_channels_last(graph)
    with held_logs() as held:  # what pricing the candidate logs is said only if it is taken
        theirs = load_costs(candidate, device="cuda", profiles_dir=profiles_dir,
                            shipped_dir=shipped_dir, gpu=gpu)
    profiled = any(not estimated for k, estimated in zip(candidate.kernels, theirs.estimated,
                                                         strict=True)
                   if signature_layout(k.signature) == CHANNELS_LAST)
    if not (profiled and _own(theirs) >= _own(costs)):
        return graph, costs
    for record in held:
        logging.getLogger(record.name).handle(record)
    return candidate, theirs


@contextlib.contextmanager
def held_logs() -> Iterator[list[logging.LogRecord]]:
    """The records this package's profiling logs meanwhile, kept back in a list (to be
    handled later, or never: a probe's costs whose warnings are not the user's)."""
    held: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = held.append  # type: ignore[method-assign]
    logger = logging.getLogger("autotm_py.profiling")
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield held
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _own(costs: KernelCosts) -> int:
    """Kernels priced from the target GPU's own profiles: neither estimated nor borrowed."""
    return len(costs.times_s) - costs.n_estimated - costs.n_borrowed


def cost_sources(kind: str, target: Fingerprint, profiles_dir: PathLike | None,
                 shipped_dir: PathLike | None, *, gpu: str | None = None) -> CostSources:
    """The profile sets of the user cache and the shipped profiles, looked up for `target`, or
    for the GPU `gpu` names (`profiled_gpu`)."""
    shipped = Path(shipped_dir) if shipped_dir is not None else shipped_profiles_dir()
    sets = load_sets(kind, user_profiles_dir(profiles_dir), shipped)
    if gpu:
        if kind != "cuda":
            raise ConfigError(f"--gpu {gpu!r} picks a GPU's profiles: it needs --device cuda")
        target = Fingerprint("cuda", profiled_gpu(gpu, (s.fingerprint.name for s in sets)),
                             torch="")
    return CostSources(kind, target, sets)


def unique_kernels(graph: TensorGraph) -> list[Kernel]:
    """The first kernel of every distinct signature, in execution order."""
    first: dict[str, Kernel] = {}
    for k in graph.kernels:
        first.setdefault(k.signature, k)
    return list(first.values())


@dataclass
class _Session:
    """One profiling run: what to measure, where to write, and what happened."""

    graph: TensorGraph
    fingerprint: Fingerprint
    path: Path
    device: str
    roofline: dict[str, Any] | None
    pending: dict[str, dict[str, ProfileEntry]] = field(default_factory=dict)
    measured: int = 0
    failed: list[str] = field(default_factory=list)
    last_flush: float = field(default_factory=time.monotonic)

    def add(self, kernel: Kernel, entry: ProfileEntry) -> None:
        self.pending.setdefault(kernel.signature, {})[all_fast(kernel)] = entry
        self.measured += 1
        if (len(self.pending) >= FLUSH_EVERY_N
                or time.monotonic() - self.last_flush > FLUSH_EVERY_S):
            self.flush()

    def flush(self) -> None:
        if self.pending or self.roofline is not None:
            write_entries(self.path, self.fingerprint, self.pending, roofline=self.roofline)
        self.pending, self.roofline = {}, None
        self.last_flush = time.monotonic()


def profile(graph: TensorGraph, *, device: str = "cpu", profiles_dir: PathLike | None = None,
            repeats: int = 10, warmup: int = 2, progress: bool | ProgressCallback = True,
            resume: bool = True, max_seconds: float | None = None,
            kernel_budget_s: float = 2.0, threads: int | None = None,
            shipped_dir: PathLike | None = None, runner: Runner | None = None) -> KernelCosts:
    """Measure every unique kernel of `graph` on `device` that the cache lacks; return costs.

    `resume=False` re-measures kernels already cached for this device. `max_seconds` stops
    measuring after that long (the rest come from scaled profiles or estimates).
    `kernel_budget_s` caps the timed runs of one kernel (at least 3 runs are kept).
    `threads` sets torch's intra-op thread count while measuring (part of the fingerprint).
    `summary` of the result adds `measured_now`, `failed` and `seconds`.
    """
    timing = {"repeats": repeats, "warmup": warmup, "budget_s": kernel_budget_s,
              "runner": runner}
    dirs = (profiles_dir, shipped_dir)
    with _torch_threads(threads):
        return _profile(graph, check_device(device), dirs, timing, progress, resume,
                        max_seconds)


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    if threads is None:
        yield
        return
    if threads < 1:
        raise ConfigError(f"--threads {threads}: must be a positive integer")
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _profile(graph: TensorGraph, kind: str, dirs: tuple[PathLike | None, PathLike | None],
             timing: dict[str, Any], progress: bool | ProgressCallback, resume: bool,
             max_seconds: float | None) -> KernelCosts:
    profiles_dir, shipped_dir = dirs
    fingerprint = current_fingerprint(kind)
    user_dir = user_profiles_dir(profiles_dir)
    sources = cost_sources(kind, fingerprint, profiles_dir, shipped_dir)
    unique = unique_kernels(graph)
    todo = [k for k in unique
            if not resume or sources.exact(k.signature, all_fast(k)) is None]
    log.info("%s: %d kernels, %d unique, %d to measure on %s", graph.name, len(graph.kernels),
             len(unique), len(todo), fingerprint.id)
    if todo and kind == "cpu":
        _warn_if_busy()
    session = _Session(graph, fingerprint, profile_path(user_dir, fingerprint), kind,
                       _roofline_if_missing(sources, fingerprint, todo, timing["runner"],
                                            refresh=not resume))
    start = time.monotonic()
    try:
        _measure_all(session, todo, progress, start, max_seconds, timing)
    finally:
        session.flush()
    final = cost_sources(kind, fingerprint, profiles_dir, shipped_dir)
    return final.costs(graph, measured_now=session.measured, failed=tuple(session.failed),
                       seconds=round(time.monotonic() - start, 3),
                       cache_file=str(session.path))


def _warn_if_busy() -> None:
    """CPU times measured while other work runs are inflated (threads wait on each other)."""
    load, cpus = (os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0), os.cpu_count() or 1
    if load > cpus:
        log.warning("load average %.1f exceeds the %d CPUs: other work will inflate the CPU "
                    "times measured now; profile again with --fresh on a quiet machine", load,
                    cpus)


def _roofline_if_missing(sources: CostSources, fingerprint: Fingerprint, todo: list[Kernel],
                         runner: Runner | None, *, refresh: bool) -> dict[str, Any] | None:
    """Measure this device's roofline (about a second) for estimates and batch scaling of its
    own profiles: once per fingerprint, and again when re-measuring (`refresh`)."""
    if not todo or (sources.roofline_for(fingerprint) is not None and not refresh):
        return None

    return torch_profiler.measure_roofline(fingerprint.kind, fingerprint.name, runner).to_dict()


def _measure_all(session: _Session, todo: list[Kernel], progress: bool | ProgressCallback,
                 start: float, max_seconds: float | None, options: dict[str, Any]) -> None:
    if not todo:
        return
    with progress_reporter(progress, f"profiling {session.graph.name}") as report:
        for done, kernel in enumerate(todo):
            if max_seconds is not None and time.monotonic() - start > max_seconds:
                log.warning("stopped after %.0f s (--max-seconds): %d kernels not measured; "
                            "run again to resume", max_seconds, len(todo) - done)
                break
            report(done, len(todo), f"{kernel.op_type} {kernel.name}")
            entry = _measure_one(session, kernel, options)
            if entry is not None:
                session.add(kernel, entry)
        else:
            report(len(todo), len(todo), "done")


def _measure_one(session: _Session, kernel: Kernel,
                 options: dict[str, Any]) -> ProfileEntry | None:
    try:
        args = torch_profiler.make_inputs(session.graph, kernel, session.device)
        timing = torch_profiler.time_kernel(kernel, args, device=session.device, **options)
        workspace = torch_profiler.measure_workspace(kernel, args, device=session.device)
    except Exception as exc:  # any torch failure: skip this kernel, keep profiling the rest
        _release_memory(session.device)
        log.warning("kernel %s (%s) could not be profiled: %s: %s", kernel.name,
                    kernel.op_type, type(exc).__name__, str(exc).splitlines()[0][:200])
        session.failed.append(kernel.name)
        return None
    return ProfileEntry(timing.median_s, timing.p10_s, timing.p90_s, timing.runs, MEASURED,
                        now_iso(), graph_batch(session.graph), kernel.op_type,
                        torch_profiler.loadavg() if session.device == "cpu" else None, workspace,
                        device_s=timing.device_s)


def _release_memory(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()

