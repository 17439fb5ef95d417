"""The GPU machine's measurement scripts, smoke-tested on the CPU (their `--device cpu` mode):
a script bug found here costs no device time. Times on the CPU mean nothing; what is checked is
that the script runs a plan the way the GPU run would and writes the results it promises."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from autotm_py import api
from autotm_py.config import PlanConfig
from autotm_py.pipeline import optimize
from autotm_py.units import parse_ratio

ROOT = Path(__file__).resolve().parents[1]


def test_recompute_check_runs_joint_plans_and_merges_their_rows(tmp_path):
    graph = api.load_model("transformer", batch=1, dims={"seq": 8}, training=True)
    config = PlanConfig(device="cuda", ratio=parse_ratio("1:1"), strategy="async",
                        recompute="on", arena=True, graph=True, time_limit_s=10)
    plan = optimize(graph, config).plan
    assert plan is not None and plan.arena is not None
    plans = tmp_path / "plans"
    plan.save(plans / "transformer_1-1_smoke.json.gz")
    out = tmp_path / "out"
    env = os.environ | {"PLANS": str(plans), "MATCH": "*smoke", "ITERATIONS": "1",
                        "BUDGET_S": "300", "EXTRA": "--device cpu --no-ours"}
    done = subprocess.run(["bash", "experiments/gpu/recompute_check.sh", str(out),
                           "transformer,bert_base"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "bert_base: no plans" in done.stdout  # a model without plans is skipped, not an error
    doc = json.loads((out / "recompute_check.json").read_text())  # merged from out/transformer/
    (row,) = doc["rows"]
    assert row["model"] == "transformer" and row["all_fast"]["median_s"] > 0
    (cell,) = row["budgets"].values()
    result = cell["async+recompute"]["result"]
    assert result["file"] == "transformer_1-1_smoke.json.gz"
    assert result["median_s"] > 0 and result["arena"] and result["strategy"] == "async+recompute"
    assert "transformer" in (out / "recompute_check.txt").read_text()
