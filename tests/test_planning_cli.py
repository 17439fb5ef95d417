"""`autotm optimize` and `autotm simulate` on a synthetic model (the loader is patched)."""

import json

import pytest

from autotm_py import api
from autotm_py.cli import main
from tests.graphs import costs_for, small_training


def test_help_explains_the_ratio(capsys):
    assert main(["optimize", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1:4 = the fast tier holds 1/5" in out and "PMM:DRAM" in out and "1:0" in out


def test_optimize_writes_plan_and_prints_summary(net, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    code = main(["optimize", "net", "--fast-mem", "900KiB", "--solver", "highs",
                 "-o", str(plan)])
    out = capsys.readouterr().out
    assert code == 0 and plan.exists()
    assert "predicted" in out and "x all-fast" in out and "first-touch" in out
    assert "solver     highs: optimal" in out
    code = main(["simulate", "net", "--plan", str(plan), "-o", str(tmp_path / "tl.json")])
    out = capsys.readouterr().out
    assert code == 0 and "verified" in out
    timeline = json.loads((tmp_path / "tl.json").read_text())
    assert timeline["kernels"] and "fast_bytes" in timeline["memory"]


def test_optimize_json(net, capsys):
    code = main(["optimize", "net", "--ratio", "1:0", "--json", "--no-baselines"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["status"] == "optimal" and data["budget_bytes"] is None


def test_infeasible_exits_3_with_the_smallest_budget(net, capsys):
    code = main(["optimize", "net", "--ratio", "0:1", "--no-arena"])  # no scratch region
    out = capsys.readouterr().out
    assert code == 3
    assert "smallest feasible budget of 768.00 KiB" in out and "ReluGrad" in out


def test_bad_options_and_bad_plans(net, tmp_path, capsys):
    assert main(["optimize", "net", "--ratio", "fast"]) == 2
    assert "error: --ratio 'fast'" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{\"format\": \"autotm-plan\", \"format_version\": 1")
    assert main(["simulate", "net", "--plan", str(bad)]) == 1
    assert "error:" in capsys.readouterr().err


def test_async_candidates_option(net, capsys):
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--strategy", "async",
                 "--async-candidates", "all", "--solver", "highs", "--no-baselines"]) == 0
    assert "async+recompute search started from the sync+recompute plan" in capsys.readouterr().out
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--async-candidates", "few"]) == 2
    assert "error: --async-candidates 'few'" in capsys.readouterr().err


def test_read_pricing_option(net, tmp_path, capsys):
    from autotm_py.plan import Plan

    path = tmp_path / "plan.json"
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--strategy", "async",
                 "--read-pricing", "spread", "--solver", "highs", "--no-baselines",
                 "-o", str(path)]) == 0
    capsys.readouterr()
    assert Plan.load(path).header.config["read_pricing"] == "spread"
    assert main(["simulate", "net", "--plan", str(path)]) == 0
    capsys.readouterr()
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--read-pricing", "late"]) == 2
    assert "--read-pricing" in capsys.readouterr().err


def test_placed_option_sizes_the_scratch_for_the_placed_allocator(net, tmp_path, capsys):
    from autotm_py.plan import Plan

    plans = {}
    for flag in ("--placed", "--no-placed"):
        path = tmp_path / f"plan{flag}.json"
        assert main(["optimize", "net", "--fast-mem", "70MiB", "--arena", "--solver", "highs",
                     flag, "--no-baselines", "-o", str(path)]) == 0
        plans[flag] = Plan.load(path)
    capsys.readouterr()
    assert plans["--placed"].header.run.placed and not plans["--no-placed"].header.run.placed
    assert plans["--placed"].arena is not None and plans["--no-placed"].arena is not None


def test_headroom_option_leaves_room_and_writes_compressed_plans(net, tmp_path, capsys):
    from autotm_py.plan import Plan

    path = tmp_path / "plan.json.gz"
    code = main(["optimize", "net", "--fast-mem", "1MiB", "--headroom", "0.2", "--solver",
                 "highs", "--no-baselines", "-o", str(path)])
    capsys.readouterr()
    plan = Plan.load(path)
    assert code == 0 and path.read_bytes()[:2] == b"\x1f\x8b"
    assert plan.header.headroom == 0.2 and plan.header.budget_bytes == 1 << 20
    assert plan.header.counts["fast_peak_bytes"] <= 0.8 * (1 << 20)
    assert main(["simulate", "net", "--plan", str(path)]) == 0
    assert main(["optimize", "net", "--fast-mem", "1MiB", "--headroom", "0.5"]) == 2


@pytest.mark.parametrize(("args", "name"), [
    (["--recompute", "on"], "sync+recompute"), ([], "sync+recompute"),  # auto: on on a GPU
    (["--recompute", "off"], "sync"), (["--recompute", "only"], "recompute-only"),
    (["--device", "cpu"], "sync"),  # auto: off in host mode
    (["--strategy", "sync+recompute"], "sync+recompute"),  # a plan name fixes recompute
    (["--strategy", "recompute-only"], "recompute-only"),
])
def test_recompute_modes_name_the_plan_and_print_what_moves_and_reruns(monkeypatch, tmp_path,
                                                                        capsys, args, name):
    import re

    from autotm_py.plan import Plan

    graph = small_training(kib=256)
    monkeypatch.setattr(api, "load_model", lambda *a, **k: graph)
    monkeypatch.setattr(api, "load_costs", lambda g, device="cuda", profiles_dir=None, gpu=None:
                        costs_for(g, device, scale_s=2e-6))  # kernels cheap next to copies
    path = tmp_path / "plan.json"
    strategy = [] if "--strategy" in args else ["--strategy", "sync"]
    assert main(["optimize", "net", "--fast-mem", "1200KiB", *strategy, *args, "--solver",
                 "highs", "--no-baselines", "-o", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"plan {name} (strategy sync, recompute " in out and "moved      to fast" in out
    ms, reruns = re.search(r"recomputed ([\d.]+) ms: (\d+) kernel re-runs", out).groups()
    assert Plan.load(path).header.strategy == name
    assert (int(reruns) > 0 and float(ms) > 0) == ("recompute" in name)
