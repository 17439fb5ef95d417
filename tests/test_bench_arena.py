"""`autotm bench --arena --replay --placed`: plans made for an arena, run each in a process of
its own (`bench/child.py`), keyed apart from eager rows. The child's real run is exercised on
the CPU (a CPU arena); on a GPU, experiments/gpu/bench_arena.sh runs the sweep."""

import gzip
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from autotm_py import api, workload
from autotm_py.bench import BenchSpec, child
from autotm_py.bench import run_bench as _run_bench
from autotm_py.cli import main
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError, ExecutionError
from autotm_py.options import ModelOptions, RunMode
from tests.test_report_support import tiny_onnx


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    return tiny_onnx(tmp_path_factory.mktemp("m") / "tiny.onnx", hidden=128, layers=3)


def arena_spec(model, **kw):
    base = dict(models=(model,), ratios=("1:1",), strategies=("sync",), device="cuda",
                model=ModelOptions(training=True), run=RunMode(arena=True, replay=True))
    return BenchSpec(**{**base, **kw})


def test_arena_rows_have_their_own_key_and_plan_files(tmp_path):
    eager = BenchSpec(models=("m",), ratios=("1:1",), device="cuda", run=RunMode(),
                      plans_dir=str(tmp_path))
    placed = BenchSpec(models=("m",), ratios=("1:1",), device="cuda",
                       run=RunMode(arena=True, replay=True), plans_dir=str(tmp_path))
    copied = BenchSpec(models=("m",), ratios=("1:1",), device="cuda",
                       run=RunMode(arena=True, placed=False), plans_dir=str(tmp_path))
    region = BenchSpec(models=("m",), ratios=("1:1",), device="cuda",
                       run=RunMode(arena=True, replay=True, scratch="region"),
                       plans_dir=str(tmp_path))
    # placed arena plans have scratch windows by default
    assert (eager.options, placed.options, copied.options, region.options) == (
        None, "arena+replay+placed+windows", "arena", "arena+replay+placed")
    cell = ("m", "1:1", "sync", "highs")
    paths = {s.plan_path(*cell) for s in (eager, placed, copied, region)}
    assert len(paths) == 4
    assert eager.row_key(*cell)[-1] == ""  # rows written before the column read back the same
    assert placed.plan_path(*cell).name.endswith("_arena+replay+placed+windows.json.gz")
    spread = BenchSpec(models=("m",), ratios=("1:1",), device="cuda",
                       run=RunMode(arena=True, replay=True), read_pricing="spread")
    assert spread.options == "arena+replay+placed+windows+spread"
    assert spread.plan_path(*cell) is None  # no --plans


def test_arena_needs_the_gpu_mode():
    with pytest.raises(ConfigError, match="add --device cuda"):
        BenchSpec(models=("m",), ratios=("1:1",), device="cpu", run=RunMode(arena=True))
    with pytest.raises(ConfigError, match=r"--replay .* add --device cuda"):
        BenchSpec(models=("m",), ratios=("1:1",), device="cpu", run=RunMode(replay=True))
    # not given: the device's default, which host mode can run
    assert BenchSpec(models=("m",), ratios=("1:1",), device="cpu").run == RunMode()


def test_arena_plans_run_in_their_own_process(onnx_path, tmp_path, monkeypatch):
    in_process, isolated = [], []

    def fake_execute(graph, plan, **kw):
        in_process.append((plan.header.strategy, kw["mode"].replay, kw.get("device_busy")))
        return SimpleNamespace(median_s=0.5, peak_fast_bytes=1000, host_median_s=0.1,
                               alloc_retries=0, device_busy_s=0.48 if kw["device_busy"] else None)

    def fake_isolated(request, plan):
        isolated.append((request, plan))
        return SimpleNamespace(median_s=0.25, peak_fast_bytes=900, host_median_s=0.01,
                               alloc_retries=0, reserved_peak_bytes=950, replayed=True,
                               placed_outputs=7, copied_outputs=3, device_busy_s=0.24)

    monkeypatch.setattr(api, "execute", fake_execute)
    monkeypatch.setattr(child, "run_isolated", fake_isolated)
    plans = tmp_path / "plans"
    result = _run_bench(arena_spec(onnx_path, execute=True, plans_dir=str(plans)),
                        tmp_path / "b.csv", workers=1)
    row = result.rows[0]
    assert row["options"] == "arena+replay+placed+windows" and row["status"] == "optimal"
    assert (row["measured_s"], row["measured_reserved_peak_bytes"]) == (0.25, 950)
    assert (row["measured_replayed"], row["measured_placed_outputs"],
            row["measured_copied_outputs"]) == (True, 7, 3)
    # replays are profiled for the device's busy time (issue 14 item 4), eager runs not
    assert (row["measured_device_busy_s"], row["measured_all_fast_device_busy_s"]) == (0.24, 0.48)
    (request, plan), = isolated
    assert (request.model, request.options["training"], request.device,
            request.device_busy) == (onnx_path, True, "cuda:0", True)
    assert RunMode.from_dict(request.mode) == RunMode(arena=True, replay=True)
    # the default for placed arena plans: scratch windows
    assert plan.arena is not None and plan.header.run == RunMode(True, True, "windows", True)
    assert plan.header.config["read_pricing"] == "step"
    # the all-fast reference replayed (static inputs); the baselines eager, in this process
    assert ("all-fast", True, True) in in_process and ("lru", False, False) in in_process
    assert row["measured_all_fast_s"] == 0.5
    saved, = plans.iterdir()
    assert json.loads(gzip.decompress(saved.read_bytes()))["header"]["run"]["arena"]


def _cpu_arena_plan(onnx_path):
    graph = api.load_model(onnx_path, training=True)
    result = api.optimize(graph, PlanConfig(strategy="sync", ratio="1:1", device="cuda",
                                            run=RunMode(arena=True)))
    assert result.plan is not None and result.plan.arena is not None
    return result.plan


def test_child_runs_a_plan_in_an_arena_on_the_cpu(onnx_path):
    plan = _cpu_arena_plan(onnx_path)
    run = child.run_isolated(child.RunRequest(model=onnx_path, options={"training": True},
                                              mode={"arena": True}, device="cpu",
                                              iterations=2, warmup=1), plan)
    assert run.median_s > 0 and run.iterations == 2
    assert run.arena_bytes == plan.arena.nbytes and run.strategy == plan.header.strategy
    assert run.placed_outputs is None  # the placed allocator is for CUDA only


def test_a_failing_child_is_one_line_error(onnx_path, tmp_path):
    plan = _cpu_arena_plan(onnx_path)
    missing = str(tmp_path / "gone.onnx")
    with pytest.raises(ExecutionError, match=r"in its own process failed: error: .*gone\.onnx"):
        child.run_isolated(child.RunRequest(model=missing, options={"training": True},
                                            device="cpu"), plan)


def test_bench_cli_refuses_arena_in_host_mode(onnx_path, tmp_path, capsys):
    out = tmp_path / "b.csv"
    code = main(["bench", "--models", onnx_path, "--ratios", "1:1", "--arena", "--device", "cpu",
                 "-o", str(out)])
    assert code != 0 and "add --device cuda" in capsys.readouterr().err
    assert not out.exists()


def test_a_plan_read_back_is_priced_against_the_same_all_fast(onnx_path, tmp_path,
                                                              monkeypatch):
    """A plan read from --plans is compared with the all-fast iteration priced as the sweep
    prices it (replayed with --graph: device times, no launch gaps), as a plan solved in the
    sweep is. The tiny model's costs get device times (as in-context profiles have)."""
    load_costs = workload.load_costs

    def with_device_times(graph, **kw):
        costs = load_costs(graph, **kw)
        return replace(costs, device_s=tuple(t / 2 for t in costs.times_s))

    monkeypatch.setattr(workload, "load_costs", with_device_times)  # where models are priced
    kw = dict(plans_dir=str(tmp_path / "plans"))
    solved = _run_bench(arena_spec(onnx_path, **kw), tmp_path / "a.csv", workers=1).rows[0]
    read = _run_bench(arena_spec(onnx_path, **kw), tmp_path / "b.csv", workers=1).rows[0]
    assert read["all_fast_s"] == pytest.approx(solved["all_fast_s"])
    assert read["slowdown"] == pytest.approx(solved["slowdown"])
    assert read["all_fast_s"] < read["oracle_s"]  # replayed: no launch overhead in it


def test_an_arena_row_says_when_its_plan_has_no_arena(onnx_path, tmp_path):
    # a packing that never fits leaves the plan without an arena (`fitting.fit_arena`): it
    # runs on torch's caching allocator, and the row, whose options say arena, says so
    plans = tmp_path / "plans"
    spec = arena_spec(onnx_path, plans_dir=str(plans))
    first = _run_bench(spec, tmp_path / "a.csv", workers=1).rows[0]
    assert first["status"] == "optimal" and not (first.get("notes") or "").startswith("no arena")
    saved, = plans.iterdir()
    data = json.loads(gzip.decompress(saved.read_bytes()))
    data["arena"] = None
    data["header"]["notes"].append("no arena: with the packing's holes held back the budget "
                                   "is infeasible; the plan runs on torch's caching allocator")
    saved.write_bytes(gzip.compress(json.dumps(data).encode()))
    row = _run_bench(spec, tmp_path / "b.csv", workers=1).rows[0]
    assert row["notes"].startswith("no arena: with the packing's holes held back")
