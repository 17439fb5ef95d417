"""The placed allocator as torch's CUDA allocator (marked `gpu`: run on the device machine with
`bash experiments/gpu/test_gpu.sh`). Each case runs in processes of its own: the allocator is
chosen before a process first uses CUDA, for the rest of it.

Outputs allocated at their slots compute bitwise what outputs copied there compute, eagerly
and replayed as a CUDA graph; kernels do allocate outputs at their slots; a capped run stays in
its region (no overflow, reserved extent within the cap); plans with scratch windows have their
kernels' scratch served from the windows and compute what the caching allocator computes."""

from __future__ import annotations

import hashlib

import pytest

from tests.test_executor_gpu import in_own_process

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["cnn", "decoder-fused", "cnn-cl"])
def test_outputs_at_their_slots_compute_what_copies_compute(name):
    placed = in_own_process("tests.test_placed_gpu", "digests", name, True)
    copied = in_own_process("tests.test_placed_gpu", "digests", name, False)
    assert placed["installed"] and not copied["installed"]
    assert placed["digests"] == copied["digests"]


@pytest.mark.parametrize("replay", [False, True])
def test_capped_runs_allocate_outputs_at_their_slots_within_the_cap(replay):
    # the plans of tests/test_arena_gpu.py's fit test (the preset's real runtime reserve)
    for run in in_own_process("tests.test_arena_gpu", "fit_runs", replay, True):
        assert run["plan_arena"], run
        assert run["placed_outputs"] > 0, run
        assert run["alloc_retries"] == 0, run  # nothing overflowed the region (the cap)
        assert run["reserved_peak_bytes"] <= run["cap_bytes"], run
        assert run["replayed"] is replay, run
        assert not any(n.startswith("outputs copied") for n in run["notes"]), run
        if replay:  # one more replay profiled: the GPU's busy time in it (issue 14 item 4)
            assert run["device_kernel_s"] > 0 and run["device_busy_s"] > 0, run
            assert run["device_busy_s"] <= run["device_span_s"] * (1 + 1e-9), run
        else:
            assert run["device_busy_s"] is None, run


def test_scratch_windows_serve_kernels_and_compute_what_the_caching_allocator_computes():
    # the decoder's kernels allocate MiB beside their slots (Split, Erf, their gradients); the
    # CNN's allocate none of 1 MiB or more (their outputs are at their slots), and the fused
    # decoder's attention gradient is not deterministic on the GPU (it differs run to run)
    name = "decoder"
    windowed = in_own_process("tests.test_placed_gpu", "windowed_digests", name, True)
    plain = in_own_process("tests.test_placed_gpu", "windowed_digests", name, False)
    assert windowed["installed"] and not plain["installed"]
    assert windowed["windowed"] > 0  # kernels' scratch was allocated in their windows
    assert windowed["overflow"] == 0
    assert windowed["digests"] == plain["digests"]


def test_a_capture_that_overflows_the_region_replays_what_the_caching_allocator_computes():
    """Autograd's device thread allocates a chunked LSTMGrad's tape (the layer's backward);
    in a region too small for it those requests overflow to cudaMalloc during the capture,
    which a capture in CUDA's global mode forbids on every thread: the LSTM classifier's 50%
    plan failed its capture so, and its eager run after it with the stale error (H200,
    2026-12-06). Overflow while a graph is held is allocated in relaxed mode and kept."""
    held = in_own_process("tests.test_placed_gpu", "overflow_digests", True)
    plain = in_own_process("tests.test_placed_gpu", "overflow_digests", False)
    assert held["installed"] and not plain["installed"]
    assert held["overflow"] > 0, held
    assert held["digests"] == plain["digests"]


def overflow_digests(use_placed: bool) -> dict:
    """sha256 of the outputs of 3 steps (eager, captured, replayed) of the sequence-chunked
    LSTM graph's all-fast plan in its arena, under the placed allocator with a 4 MiB region
    (everything else overflows), or on the caching allocator."""
    import torch

    from autotm_py.options import RunMode
    from autotm_py.pipeline import all_fast_plan, with_arena
    from autotm_py.runtime import placed
    from autotm_py.runtime.execute import run_steps
    from tests.graphs import costs_for
    from tests.test_recurrent import _chunk_case

    if use_placed:
        assert placed.install(4 << 20) is None
    _, split = _chunk_case("LSTM", True, 2)
    plan = with_arena(split, all_fast_plan(split), costs_for(split))
    steps = run_steps(split, plan, steps=3, seed=4, device="cuda",
                      mode=RunMode(arena=True, placed=use_placed, replay=True))
    lib = placed.active()
    return {"installed": lib is not None,
            "overflow": 0 if lib is None else lib.stats().overflow_allocations,
            "digests": [hashlib.sha256(b"".join(
                s[t].reshape(-1).view(torch.uint8).numpy().tobytes() for t in split.outputs)
            ).hexdigest() for s in steps]}


def test_kernels_are_measured_under_the_placed_allocator():
    """A Trainer installs the placed allocator before it measures the kernels no profile has;
    measuring workspaces there reads the allocator's own statistics (torch's raise under a
    pluggable allocator: every kernel fell back to a roofline estimate)."""
    run = in_own_process("tests.test_placed_gpu", "profile_under_placed")
    assert run["installed"] and run["measured"] > 0 and not run["failed"], run


def profile_under_placed() -> dict:
    import tempfile

    from autotm_py.profiling.profile import profile
    from autotm_py.runtime import placed
    from autotm_py.runtime.execute import install_placed

    install_placed(None, "cuda", capped=False)
    costs = profile(larger_graph("cnn"), device="cuda", profiles_dir=tempfile.mkdtemp(),
                    progress=False, repeats=3)
    return {"installed": placed.active() is not None,
            "measured": costs.summary["measured_now"], "failed": costs.summary["failed"]}


def larger_graph(name: str):
    """The test graph `name` with tensors of a few MiB: the placed allocator serves only
    requests of 1 MiB and more from windows, and the small graphs' kernels ask for KiB."""
    from autotm_py.frontend.fuse import fuse_graph
    from autotm_py.ir.training import derive_training
    from tests.test_training_models import small_cnn, tiny_decoder

    if name.startswith("cnn"):
        forward = small_cnn(n=8, size=128)
    else:
        forward = tiny_decoder(batch=8, seq=128, vocab=64, d=256)
    if name.endswith("-fused"):
        forward = fuse_graph(forward)
    return derive_training(forward, optimizer="sgd")


def windowed_digests(name: str, use_placed: bool) -> dict:
    """As `digests`, for the test graph's plan with scratch windows (`--scratch windows`),
    eagerly and replayed; with the placed allocator, how many allocations its windows
    served."""
    from dataclasses import replace

    import torch

    from autotm_py.memory import tiers
    from autotm_py.options import RunMode
    from autotm_py.runtime import placed
    from autotm_py.runtime.execute import run_steps
    from tests.test_placed import _windowed_plan

    tiers.PRESETS = {n: replace(m, runtime_reserve_bytes=0) for n, m in tiers.PRESETS.items()}
    graph = larger_graph(name)
    plan, _ = _windowed_plan(graph)
    out: dict[str, list[str]] = {}
    for replay in (False, True):
        steps = run_steps(graph, plan, steps=3, device="cuda", seed=4,
                          mode=RunMode(arena=True, placed=use_placed, replay=replay))
        out[f"replay={replay}"] = [
            hashlib.sha256(b"".join(s[t].reshape(-1).view(torch.uint8).numpy().tobytes()
                                    for t in graph.outputs)).hexdigest() for s in steps]
    lib = placed.active()
    stats = lib.stats() if lib is not None else None
    return {"installed": lib is not None, "digests": out,
            "windowed": 0 if stats is None else stats.windowed,
            "overflow": 0 if stats is None else stats.overflow_allocations}


def digests(name: str, use_placed: bool, device: str = "cuda") -> dict:
    """sha256 of every graph output at every step of every arena plan of the test graph
    `name`, eagerly and (CUDA) replayed, in this fresh process."""
    from dataclasses import replace

    import torch

    from autotm_py.memory import tiers
    from autotm_py.options import RunMode
    from autotm_py.runtime import placed
    from autotm_py.runtime.execute import run_steps
    from tests.test_executor import _arena_plans, _graph

    # as tests/conftest.py does in the test process: tiny graphs, no runtime reserve
    tiers.PRESETS = {n: replace(m, runtime_reserve_bytes=0) for n, m in tiers.PRESETS.items()}
    graph = _graph(name)
    plans = _arena_plans(graph)
    out: dict[str, list[str]] = {}
    for plan_name, plan in plans.items():
        for replay in (False, True) if device == "cuda" else (False,):
            steps = run_steps(graph, plan, steps=3, device=device, seed=4,
                              mode=RunMode(arena=True, placed=use_placed, replay=replay))
            out[f"{plan_name} replay={replay}"] = [
                hashlib.sha256(b"".join(s[t].reshape(-1).view(torch.uint8).numpy().tobytes()
                                        for t in graph.outputs)).hexdigest() for s in steps]
    return {"installed": placed.active() is not None, "digests": out}
