"""A plan's run in a process of its own (`python -m autotm_py.bench.child REQUEST OUT`).

`autotm bench --arena` runs every plan this way. The placed allocator (`runtime.placed`) has
to become torch's allocator before the process first uses CUDA and stays so for the rest of
it, while the sweep's other runs (the baselines, native autograd and checkpointing) are what a
PyTorch user runs, on torch's caching allocator: they cannot share a process. A fresh process
per plan also starts each arena run from an empty allocator, as `autotm run` does. The parent
waits for the child (one run at a time on a GPU) and reads its `RunResult` back as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from autotm_py import api
from autotm_py.errors import AutoTMError, ExecutionError
from autotm_py.fileio import atomic_write_text
from autotm_py.options import ModelOptions, RunMode
from autotm_py.plan import Plan

# A child that runs longer than this is stopped and its run reported as failed: a capture or
# a kernel that hangs must not stall a sweep (the longest benchmark run takes about a minute).
CHILD_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class RunRequest:
    """What the child runs: the model and its options (`options.ModelOptions`, as a dict), the
    run mode (`options.RunMode`, as a dict) and what to measure."""

    model: str
    options: dict[str, Any] = field(default_factory=dict)
    mode: dict[str, Any] = field(default_factory=dict)
    device: str = "cuda"
    iterations: int = 5
    warmup: int = 2
    capped: bool = True
    device_busy: bool = False


def run_isolated(request: RunRequest, plan: Plan, *, timeout_s: float = CHILD_TIMEOUT_S
                 ) -> SimpleNamespace:
    """Run `plan` in a child process; its `RunResult`'s fields as attributes. A child that
    fails or times out raises `ExecutionError` with the child's last error line."""
    with tempfile.TemporaryDirectory(prefix="autotm-child-") as tmp:
        plan_path, request_path, out_path = (Path(tmp) / name for name in
                                             ("plan.json.gz", "request.json", "result.json"))
        plan.save(plan_path)
        request_path.write_text(json.dumps({**asdict(request), "plan": str(plan_path)}))
        command = [sys.executable, "-m", "autotm_py.bench.child", str(request_path),
                   str(out_path)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                  env=_child_env())
        except subprocess.TimeoutExpired as exc:
            raise ExecutionError(f"the run of {plan.header.strategy} in its own process took "
                                 f"over {timeout_s:.0f} s and was stopped") from exc
        if done.returncode != 0 or not out_path.exists():
            raise ExecutionError(f"the run of {plan.header.strategy} in its own process failed: "
                                 f"{_last_error_line(done.stderr)}")
        return SimpleNamespace(**json.loads(out_path.read_text()))


def _child_env() -> dict[str, str]:
    """The parent's environment, with this package importable from where the parent has it
    (a source checkout that is not installed)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
    return env


def _last_error_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no error output (killed?)"


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    """The child's work: set the process up for the run before anything uses CUDA (one work
    queue for a replay, the placed allocator where asked), load the model and the plan, run,
    and return the `RunResult` as a dict."""
    plan = Plan.load(request.pop("plan"))
    req = RunRequest(**request)
    mode = RunMode.from_dict(req.mode)
    api.prepare_cuda_process(plan, req.device, mode, capped=req.capped)
    graph = api.load_model(req.model, ModelOptions(**req.options))
    result = api.execute(graph, plan, device=req.device, mode=mode,
                         iterations=req.iterations, warmup=req.warmup, capped=req.capped,
                         device_busy=req.device_busy)
    return result.to_dict()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m autotm_py.bench.child REQUEST.json OUT.json", file=sys.stderr)
        return 2
    request_path, out_path = argv
    try:
        result = run_request(json.loads(Path(request_path).read_text()))
    except AutoTMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    atomic_write_text(out_path, json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
