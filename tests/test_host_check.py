"""experiments/host_check.py: the fit of its one parameter (issue 17, item 5), and the committed
result says what it is (a fitted simulation, no NUMA machine) and agrees with the fit."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def _host_check():
    spec = importlib.util.spec_from_file_location("host_check", EXPERIMENTS / "host_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fit_puts_first_touch_on_the_target():
    hc = _host_check()
    losses = [0.036, 0.044, 0.010, 0.110]
    first = {"speedup": 2.0, "rows": [{"first_touch_slowdown": 1 + a} for a in losses]}
    f = hc.fit_factor(first, target=0.719)
    got = statistics.geometric_mean(1 + f / 2.0 * a for a in losses) - 1
    assert got == pytest.approx(0.719, rel=1e-9)


def test_committed_result_is_a_fitted_simulation():
    doc = json.loads((EXPERIMENTS / "results" / "host_check.json").read_text())
    assert doc["version"] == 2 and "NUMA" in doc["slow_tier"]
    fitted = doc["fitted"]["run"]
    assert fitted["geomean"]["first_touch_slowdown"] - 1 == pytest.approx(0.719, rel=1e-6)
    assert doc["runs"][0]["speedup"] == 1.0
    hc = _host_check()
    assert hc.fit_factor(doc["runs"][0]) == pytest.approx(doc["fitted"]["speedup"], rel=1e-9)
    ratios = [run["loss_ratio"] for run in (*doc["runs"], fitted)]
    assert max(ratios) - min(ratios) < 0.05  # the figure the fit does not decide
    assert doc["paper_loss_ratio"] == pytest.approx(0.277 / 0.719)
