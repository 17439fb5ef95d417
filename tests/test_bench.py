import csv
import gzip
import json
from types import SimpleNamespace

import pytest

from autotm_py import api
from autotm_py.bench import COLUMNS, BenchSpec, read_result, read_rows, typed_cell
from autotm_py.bench import run_bench as _run_bench
from autotm_py.cli import main
from autotm_py.errors import ConfigError
from autotm_py.options import ModelOptions, RunMode
from tests.test_report_support import tiny_onnx


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    return tiny_onnx(tmp_path_factory.mktemp("m") / "tiny.onnx", hidden=128, layers=3)


def run_bench(spec, output, **kw):
    """In this process: these tests monkeypatch the API and the presets (tests/conftest.py);
    tests/test_bench_engines.py runs sweeps in other processes."""
    return _run_bench(spec, output, workers=1, **kw)


def spec(model, **kw):
    # the portable sweep: move-only sync plans run eagerly (the defaults: tests/test_defaults.py)
    base = dict(models=(model,), ratios=("1:1", "1:2"), strategies=("sync",), device="cuda",
                recompute="off", run=RunMode(), model=ModelOptions(training=True))
    return BenchSpec(**{**base, **kw})


def test_rows_have_every_column_and_both_files(onnx_path, tmp_path):
    result = run_bench(spec(onnx_path), tmp_path / "b.csv")
    assert (result.ran, result.skipped, result.failed) == (2, 0, 0)
    ok, infeasible = result.rows
    assert ok["status"] == "optimal" and infeasible["status"] == "infeasible"
    assert ok["predicted_s"] > 0 and ok["slowdown"] >= 1.0
    assert ok["variables"] > 0 and ok["bytes_to_fast"] > 0  # a GPU plan at 1:1 must move
    assert ok["input_fast_fraction"] == 1.0  # GPU rule: kernels read only fast memory
    assert ok["all_fast_s"] == pytest.approx(ok["oracle_s"])
    assert ok["mode"] == "gpu" and ok["memory"] == "h100-pcie5"
    assert "pulp" in ok["versions"] and ok["date"] and ok["machine"]
    with (tmp_path / "b.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == COLUMNS and len(rows) == 2
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["format"] == "autotm-bench" and doc["spec"]["ratios"] == ["1:1", "1:2"]


def test_resume_skips_done_rows_and_retries_errors(onnx_path, tmp_path):
    out = tmp_path / "b.csv"
    run_bench(spec(onnx_path), out)
    again = run_bench(spec(onnx_path), out)
    assert (again.ran, again.skipped) == (0, 2)
    # an interrupted sweep: the JSON lost its last row; only that row runs again
    doc = json.loads((tmp_path / "b.json").read_text())
    doc["rows"] = doc["rows"][:1]
    (tmp_path / "b.json").write_text(json.dumps(doc))
    resumed = run_bench(spec(onnx_path), out)
    assert (resumed.ran, resumed.skipped) == (1, 1)
    assert len(read_rows(out, tmp_path / "b.json")) == 2
    # a CSV alone (no JSON) also resumes
    (tmp_path / "b.json").unlink()
    assert run_bench(spec(onnx_path), out).ran == 0
    bad = run_bench(spec("no_such_model", ratios=("1:1",)), out)
    assert bad.failed == 1 and "no_such_model" in bad.rows[-1]["error"]
    retried = run_bench(spec("no_such_model", ratios=("1:1",)), out)
    assert retried.ran == 1 and len(retried.rows) == 3  # replaced, not duplicated


def test_a_csv_alone_reads_back_as_the_typed_rows(onnx_path, tmp_path):
    """The GPU machine may send back the CSV without the JSON: summaries read it typed."""
    out = tmp_path / "b.csv"
    rows = run_bench(spec(onnx_path), out).rows
    (tmp_path / "b.json").unlink()
    again = read_result(out)
    for before, after in zip(rows, again, strict=True):
        for key in ("predicted_s", "budget_bytes", "variables", "hit_time_limit", "ratio",
                    "gap", "measured_s", "model", "batch"):
            assert after[key] == before.get(key), key
    assert typed_cell("1:4") == "1:4" and typed_cell("1e-05") == 1e-05
    assert typed_cell("-3") == -3 and typed_cell("False") is False and typed_cell("") is None
    assert typed_cell("inf") == "inf" and typed_cell("12 segments") == "12 segments"
    with pytest.raises(ConfigError, match="no such `autotm bench` result"):
        read_result(tmp_path / "missing.csv")


def test_execute_records_measured_times(onnx_path, tmp_path, monkeypatch):
    calls = []

    def fake_execute(graph, plan, **kw):
        calls.append(plan.header.strategy)
        return SimpleNamespace(median_s=0.5, peak_fast_bytes=1234, host_median_s=0.25,
                               alloc_retries=0)

    monkeypatch.setattr(api, "execute", fake_execute)
    result = run_bench(spec(onnx_path, ratios=("1:1",), execute=True), tmp_path / "b.csv")
    row = result.rows[0]
    assert (row["measured_s"], row["measured_peak_fast_bytes"]) == (0.5, 1234)
    assert (row["measured_host_s"], row["measured_alloc_retries"]) == (0.25, 0)
    assert row["measured_all_fast_s"] == 0.5
    assert "sync" in calls and "all-fast" in calls and "2lm" not in calls


def test_spec_checks_its_inputs():
    with pytest.raises(ConfigError, match="--ratios"):
        BenchSpec(models=("m",), ratios=("1-4",))
    with pytest.raises(ConfigError, match="--strategy"):
        BenchSpec(models=("m",), ratios=("1:4",), strategies=("fast",))
    with pytest.raises(ConfigError, match="at least one model"):
        BenchSpec(models=(), ratios=("1:4",))
    with pytest.raises(ConfigError, match="unknown solver glpk"):
        BenchSpec(models=("m",), ratios=("1:4",), solvers=("glpk",))
    with pytest.raises(ConfigError, match="--time-limit"):
        BenchSpec(models=("m",), ratios=("1:4",), time_limit_s=-1)
    with pytest.raises(ConfigError, match="memory system 'nope'"):
        BenchSpec(models=("m",), ratios=("1:4",), memory="nope")


def test_bench_cli(onnx_path, tmp_path, capsys):
    out = tmp_path / "r" / "bench.csv"
    args = ["bench", "--models", onnx_path, "--ratios", "1:1", "--strategies", "sync",
            "--device", "cuda", "--training", "-o", str(out)]
    assert main([*args, "--no-progress"]) == 0
    assert "1 rows run, 0 already there, 0 failed" in capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ran"] == 0 and doc["skipped"] == 1
    assert main(["bench", "--models", onnx_path, "--ratios", "x", "-o", str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: --ratios 'x'")


def test_failed_runs_are_noted_not_fatal(onnx_path, tmp_path, monkeypatch):
    from autotm_py.errors import ExecutionError

    def failing(graph, plan, **kw):
        raise ExecutionError("ran out of fast memory under its cap")

    monkeypatch.setattr(api, "execute", failing)
    result = run_bench(spec(onnx_path, ratios=("1:1",), strategies=("sync", "async"),
                            execute=True), tmp_path / "b.csv")
    assert result.failed == 0
    for row in result.rows:
        assert row["measured_s"] is None and row["status"] == "optimal"
        assert "run of all-fast failed" in row["notes"]  # baselines' failures on every row
        assert f"run of {row['strategy']} failed" in row["notes"]


def test_fit_replans_with_more_headroom_until_the_run_fits(onnx_path, tmp_path, monkeypatch):
    """--fit (AutoTM's defrag loop): a plan whose run fails under the cap or makes the
    allocator retry is solved again with 5% more headroom; the row keeps the one that fit."""
    from autotm_py.errors import ExecutionError

    tried = []

    def fake_execute(graph, plan, **kw):
        headroom = plan.header.headroom
        if plan.header.strategy == "sync":
            tried.append(headroom)
            if headroom == 0.0:
                raise ExecutionError("ran out of fast memory under its cap")
        retries = 2 if headroom == 0.05 else 0
        return SimpleNamespace(median_s=0.5, peak_fast_bytes=1, host_median_s=0.1,
                               alloc_retries=retries)

    monkeypatch.setattr(api, "execute", fake_execute)
    plans = tmp_path / "plans"
    result = run_bench(spec(onnx_path, ratios=("1:1",), execute=True, fit=True,
                            plans_dir=str(plans)), tmp_path / "b.csv")
    row = result.rows[0]
    assert tried == [0.0, 0.05, 0.1]
    assert row["headroom"] == 0.1 and row["measured_alloc_retries"] == 0
    assert "headroom 0.00: the run failed" in row["notes"]
    assert "headroom 0.05: 2 allocator retries" in row["notes"]
    assert {p.name.split("_")[-1] for p in plans.glob("*.json.gz")} >= {"h0.05.json.gz",
                                                                     "h0.10.json.gz"}
    assert row["peak_fast_bytes"] <= row["budget_bytes"] * 0.9


def test_fit_needs_execute_and_ladders_up_to_a_quarter():
    assert BenchSpec(models=("m",), ratios=("1:4",), execute=True, fit=True,
                     headroom=0.1).headrooms() == (0.1, 0.15, 0.2, 0.25)
    assert BenchSpec(models=("m",), ratios=("1:4",), headroom=0.1).headrooms() == (0.1,)
    with pytest.raises(ConfigError, match="--fit needs --execute"):
        BenchSpec(models=("m",), ratios=("1:4",), fit=True)


def test_fit_keeps_the_last_run_when_a_replan_cannot_be_solved(onnx_path, tmp_path,
                                                                monkeypatch):
    from autotm_py.errors import SolverError

    real_optimize = api.optimize

    def optimize(graph, config, **kw):
        if config.headroom:
            raise SolverError("solver highs is not installed")
        return real_optimize(graph, config, **kw)

    monkeypatch.setattr(api, "optimize", optimize)
    monkeypatch.setattr(api, "execute", lambda graph, plan, **kw: SimpleNamespace(
        median_s=0.5, peak_fast_bytes=1, host_median_s=0.1, alloc_retries=4))
    row = run_bench(spec(onnx_path, ratios=("1:1",), execute=True, fit=True),
                    tmp_path / "b.csv").rows[0]
    assert row["status"] == "optimal" and row["headroom"] == 0.0
    assert row["measured_alloc_retries"] == 4
    assert "headroom 0.05: SolverError: solver highs is not installed" in row["notes"]


def test_fit_keeps_the_fastest_run_when_every_headroom_retries(onnx_path, tmp_path,
                                                               monkeypatch):
    """A run that makes the allocator retry at every headroom (a constant cost more headroom
    does not remove) keeps the fastest measured attempt, not the last one."""
    times = {0.0: 0.9, 0.05: 0.6, 0.1: 0.7, 0.15: 0.8, 0.2: 0.8, 0.25: 0.8}

    def fake_execute(graph, plan, **kw):
        headroom = plan.header.headroom
        return SimpleNamespace(median_s=times[headroom], peak_fast_bytes=1,
                               host_median_s=0.1, alloc_retries=3)

    monkeypatch.setattr(api, "execute", fake_execute)
    row = run_bench(spec(onnx_path, ratios=("1:1",), strategies=("sync",), execute=True,
                         fit=True), tmp_path / "b.csv").rows[0]
    assert row["headroom"] == 0.05 and row["measured_s"] == 0.6
    assert "no headroom ran without retries: kept the fastest run (headroom 0.05)" in \
        row["notes"]


def test_fit_gives_the_baselines_the_same_defrag_loop(onnx_path, tmp_path, monkeypatch):
    """A baseline whose run fails under the cap is planned again with more headroom, as the
    ILP plans are: the comparison stays fair."""
    from autotm_py.errors import ExecutionError

    runs = {"first-touch": 0}
    replanned = []
    real_baselines = api.baselines

    def baselines(graph, config, **kw):
        if kw.get("names"):
            replanned.append((kw["names"], config.headroom))
        return real_baselines(graph, config, **kw)

    def fake_execute(graph, plan, **kw):
        if plan.header.strategy == "first-touch":
            runs["first-touch"] += 1
            if runs["first-touch"] == 1:
                raise ExecutionError("ran out of fast memory under its cap")
        return SimpleNamespace(median_s=0.5, peak_fast_bytes=1, host_median_s=0.1,
                               alloc_retries=0)

    monkeypatch.setattr(api, "baselines", baselines)
    monkeypatch.setattr(api, "execute", fake_execute)
    row = run_bench(spec(onnx_path, ratios=("1:1",), execute=True, fit=True),
                    tmp_path / "b.csv").rows[0]
    # all-fast is planned alone, once per model, for its uncapped run (bench/tasks.py)
    assert replanned == [(("all-fast",), 0.0), (("first-touch",), 0.05)]
    assert row["measured_first_touch_s"] == 0.5
    assert "first-touch at headroom 0.00: the run failed" in row["notes"]


def test_plans_folder_reuses_plain_json_plans(onnx_path, tmp_path, monkeypatch):
    """Plans are kept gzip-compressed; a plain .json kept by an earlier version still serves."""
    plans = tmp_path / "plans"
    first = spec(onnx_path, ratios=("1:1",), plans_dir=str(plans))
    run_bench(first, tmp_path / "a.csv")
    (packed,) = plans.glob("*.json.gz")
    plain = packed.with_suffix("")
    plain.write_bytes(gzip.decompress(packed.read_bytes()))
    packed.unlink()
    monkeypatch.setattr(api, "optimize", lambda *a, **k: pytest.fail("solved again"))
    row = run_bench(first, tmp_path / "b.csv").rows[0]
    assert row["status"] == "optimal" and row["predicted_s"] > 0


def test_a_plan_solved_for_another_graph_is_solved_again(onnx_path, tmp_path, monkeypatch):
    """A kept plan whose model hash is not the graph's (the model re-imported with other
    kernels or fusions) is not reused: its predictions would be reported as this graph's."""
    import dataclasses

    from autotm_py.plan import Plan

    plans = tmp_path / "plans"
    first = spec(onnx_path, ratios=("1:1",), plans_dir=str(plans))
    run_bench(first, tmp_path / "a.csv")
    (packed,) = plans.glob("*.json.gz")
    kept = Plan.from_json(gzip.decompress(packed.read_bytes()).decode())
    stale = dataclasses.replace(kept, header=dataclasses.replace(
        kept.header, model_hash="0" * 16, predicted_time_s=123.0))
    packed.write_bytes(gzip.compress(stale.to_json().encode()))
    solved = []
    real = api.optimize

    def counting(*args, **kwargs):
        solved.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "optimize", counting)
    row = run_bench(first, tmp_path / "b.csv").rows[0]
    assert solved and row["predicted_s"] != 123.0 and row["status"] == "optimal"


def test_dims_are_part_of_the_row_key_and_the_plan_file():
    """Two sequence lengths of one model are two rows and two plans; a sweep without dims
    keeps the keys and plan names of files written before dims were in the key."""
    from autotm_py.bench import key_of as _key

    def bench(dims):
        return BenchSpec(models=("bert_base",), ratios=("1:2",), model=ModelOptions(dims=dims),
                         plans_dir="p", device="cpu")

    short, long, none = bench({"seq": 128}), bench({"seq": 512}), bench({})
    cell = ("bert_base", "1:2", "sync", "cbc")
    assert short.row_key(*cell) != long.row_key(*cell)
    assert short.plan_path(*cell) != long.plan_path(*cell)
    assert "seq-512" in long.plan_path(*cell).name
    memory = none.memory_name
    assert none.plan_path(*cell).name == f"bert_base_False_cpu_{memory}_1-2_sync_cbc.json.gz"
    old_row = dict(zip(("model", "training", "device", "memory", "ratio", "strategy", "solver"),
                       ("bert_base", "False", "cpu", none.memory_name, "1:2", "sync", "cbc"),
                       strict=True))
    assert _key(old_row) == none.row_key(*cell)


def test_bench_exits_non_zero_when_every_row_fails_and_zero_when_some_do(onnx_path, tmp_path,
                                                                          capsys):
    out = str(tmp_path / "b.csv")
    args = ["bench", "--ratios", "1:1", "--strategies", "static", "--workers", "1",
            "--no-progress", "-o", out]
    assert main([*args, "--models", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert "error: every row failed (1 of 1)" in err and "Traceback" not in err
    assert main([*args, "--models", f"nosuch,{onnx_path}"]) == 0  # the bad row retried, fails
    assert "error:" not in capsys.readouterr().err
