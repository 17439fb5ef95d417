"""Every optional dependency that is missing gives one line naming the extra to install, a
non-zero exit and no traceback (issue 12 item 3). Each command runs as a user runs it,
``python -m autotm_py ...``, with the module made unimportable (a `sitecustomize` puts None in
`sys.modules` for it, which makes `import torch` raise ModuleNotFoundError)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODEL = ["tests/fixtures/tiny_cnn_opset13.onnx", "--batch", "2"]
BLOCKER = """
import os, sys
for name in os.environ.get("AUTOTM_TEST_MISSING", "").split(","):
    if name:
        sys.modules[name] = None
"""


def autotm(tmp_path: Path, missing: str, *args: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
           "AUTOTM_TEST_MISSING": missing, "TMPDIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "autotm_py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def plan_without_torch(tmp_path_factory) -> Path:
    """Planning needs no torch: optimize writes a plan with torch missing."""
    tmp = tmp_path_factory.mktemp("plan")
    plan = tmp / "plan.json"
    done = autotm(tmp, "torch", "optimize", *MODEL, "--device", "cpu", "--ratio", "1:2",
                  "--no-baselines", "-o", str(plan))
    assert done.returncode == 0, done.stderr
    return plan


def _one_clean_line(done: subprocess.CompletedProcess, needs: str, install: str) -> None:
    """One ``error:`` line (warnings about the model may come before it), no traceback."""
    errors = [ln for ln in done.stderr.splitlines() if not ln.startswith("warning: ")]
    assert done.returncode != 0, done.stdout
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert errors[0].startswith("error: ") and needs in errors[0] and install in errors[0]


@pytest.mark.parametrize("command", [
    ["profile", *MODEL, "--device", "cpu", "--no-progress"],
    ["calibrate", "--device", "cpu", "--no-progress"],
    ["run", *MODEL, "--plan", "{plan}", "--device", "cpu"],
    ["bench", "--models", MODEL[0], "--batch", "2", "--ratios", "1:2", "--strategies", "sync",
     "--execute", "-o", "{tmp}/bench.csv"],
], ids=["profile", "calibrate", "run", "bench-execute"])
def test_missing_torch(tmp_path, plan_without_torch, command):
    args = [a.replace("{plan}", str(plan_without_torch)).replace("{tmp}", str(tmp_path))
            for a in command]
    done = autotm(tmp_path, "torch", *args)
    _one_clean_line(done, f"autotm {command[0]}", 'pip install "autotm_py[torch]"')
    assert "needs torch, which is not installed" in done.stderr


def test_missing_highspy(tmp_path):
    done = autotm(tmp_path, "highspy", "optimize", *MODEL, "--device", "cpu", "--ratio", "1:2",
                  "--solver", "highs", "--no-baselines")
    _one_clean_line(done, "--solver highs needs highspy", 'pip install "autotm_py[highs]"')
    assert list(tmp_path.glob("autotm-solve-*")) == []
    again = autotm(tmp_path, "highspy", "optimize", *MODEL, "--device", "cpu", "--ratio",
                   "1:2", "--solver", "cbc", "--no-baselines")
    assert again.returncode == 0, again.stderr  # CBC does not need it


def test_missing_ray(tmp_path):
    done = autotm(tmp_path, "ray", "bench", "--models", MODEL[0], "--batch", "2", "--ratios",
                  "1:2", "--strategies", "sync", "--engine", "ray", "-o",
                  str(tmp_path / "bench.csv"))
    _one_clean_line(done, "--engine ray needs Ray", "pip install 'autotm_py[ray]'")
    assert not (tmp_path / "bench.csv").exists()


def test_missing_juliacall_is_one_line_through_the_api(tmp_path):
    """No command uses Julia; the API's bridge says what to install, in one line, before it
    looks for Julia (tests/test_julia_bridge.py has the rest)."""
    code = ("from autotm_py import julia\n"
            "try:\n    julia.load_bridge()\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
           "AUTOTM_TEST_MISSING": "juliacall"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ConfigError "), done.stdout + done.stderr
    assert "needs juliacall, which is not installed" in lines[0]
    assert "pip install 'autotm_py[julia]'" in lines[0]


def test_missing_matplotlib(tmp_path, plan_without_torch):
    done = autotm(tmp_path, "matplotlib", "report", str(plan_without_torch), "-o",
                  str(tmp_path / "report"))
    _one_clean_line(done, "autotm report needs matplotlib", "pip install matplotlib")
