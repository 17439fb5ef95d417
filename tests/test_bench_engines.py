"""`autotm bench` engines: the same rows in this process, in local worker processes and on a
local Ray instance (2 CPUs); a worker killed during a cell loses nothing; an interrupted driver
leaves whole rows; Ray's absence and an unreachable cluster are one-line errors."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autotm_py.bench import BenchSpec, run_bench
from autotm_py.bench.engines import LocalEngine, open_engine
from autotm_py.bench.tasks import MAX_ATTEMPTS, run_task, split
from autotm_py.cli import main
from autotm_py.memory.tiers import preset
from autotm_py.options import ModelOptions
from tests.test_report_support import tiny_onnx

REPO = Path(__file__).resolve().parents[1]
# columns that are timings or say where and when a row was made
VARYING = {"build_s", "solve_s", "date", "machine", "device_name", "versions", "measured_s",
           "measured_host_s"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny ONNX model and a memory-system file without the runtime reserve: worker
    processes do not see tests/conftest.py's patched presets, so the sweep names a file."""
    root = tmp_path_factory.mktemp("engines")
    model = tiny_onnx(root / "tiny.onnx", hidden=128, layers=3)
    memory = replace(preset("h100-pcie5"), runtime_reserve_bytes=0).save(root / "h100.json")
    return str(model), str(memory)


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    from autotm_py.bench.ray_engine import PACKAGE_DIR

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"py_modules": [str(PACKAGE_DIR)]})
    yield ray
    ray.shutdown()


def sweep(files, **kw):
    model, memory = files
    base = dict(models=(model,), ratios=("1:1", "2:1", "1:2"), strategies=("sync", "async"),
                device="cuda", model=ModelOptions(training=True), memory=memory)
    return BenchSpec(**{**base, **kw})


def comparable(rows):
    return [{k: v for k, v in r.items() if k not in VARYING} for r in rows]


def test_serial_local_and_ray_give_the_same_rows(files, tmp_path, local_ray):
    spec = sweep(files, plans_dir=str(tmp_path / "plans-serial"))
    serial = run_bench(spec, tmp_path / "serial.csv", workers=1).rows
    local = run_bench(replace(spec, plans_dir=str(tmp_path / "plans-local")),
                      tmp_path / "local.csv", workers=2).rows
    ray = run_bench(replace(spec, plans_dir=str(tmp_path / "plans-ray")),
                    tmp_path / "ray.csv", engine="ray").rows
    assert len(serial) == 6 and {r["status"] for r in serial} == {"optimal", "infeasible"}
    assert comparable(local) == comparable(serial)
    assert comparable(ray) == comparable(serial)
    names = {d: sorted(p.name for p in (tmp_path / d).iterdir())
             for d in ("plans-serial", "plans-local", "plans-ray")}
    assert names["plans-serial"] == names["plans-local"] == names["plans-ray"]
    assert len(names["plans-serial"]) == 4  # the feasible cells
    # a second sweep with the plans there reads them (sent to the workers) instead of solving
    # them again: the driver rewrites no plan file, and the rows are the same
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "plans-ray").iterdir()}
    again = run_bench(replace(spec, plans_dir=str(tmp_path / "plans-ray")),
                      tmp_path / "again.csv", engine="ray").rows
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "plans-ray").iterdir()} == stamps
    assert comparable(again) == comparable(serial)


def test_executed_cells_share_the_model_measurements_across_workers(files, tmp_path):
    """With --execute (here on the CPU), one task per (model, ratio) and one for the model's
    own runs; the driver merges them, so rows equal the serial ones (timings aside)."""
    spec = sweep(files, device="cpu", memory=None, ratios=("1:1", "2:1"), execute=True,
                 iterations=1, warmup=0)
    assert [t.ratio for t in split(spec, spec.cells())] == [None, "1:1", "2:1"]
    serial = run_bench(spec, tmp_path / "serial.csv", workers=1).rows
    local = run_bench(spec, tmp_path / "local.csv", workers=2).rows
    measured = {k for r in serial for k, v in r.items() if k.startswith("measured_") and v}
    assert {"measured_s", "measured_all_fast_s", "measured_lru_s",
            "measured_torch_autograd_s"} <= measured
    for rows in (serial, local):
        assert len({r["measured_all_fast_s"] for r in rows}) == 1  # measured once per model
        assert {k for r in rows for k, v in r.items() if k.startswith("measured_") and v} \
            == measured
    strip = {k for k in measured if k.endswith("_s")}
    assert [{k: v for k, v in r.items() if k not in strip} for r in comparable(local)] == \
        [{k: v for k, v in r.items() if k not in strip} for r in comparable(serial)]


def die_once(marker_dir, spec, task, inputs, plans):
    """A task function that kills its own worker process the first time it runs a task."""
    marker = Path(marker_dir) / task.label.replace(" ", "_").replace("/", "_")
    attempts = int(marker.read_text()) if marker.exists() else 0
    marker.write_text(str(attempts + 1))
    if attempts == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return run_task(spec, task, inputs, plans)


def die_always(spec, task, inputs, plans):
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_a_worker_killed_during_a_cell_loses_nothing(files, tmp_path, engine, request):
    if engine == "ray":
        request.getfixturevalue("local_ray")
    (tmp_path / "m").mkdir()
    spec = sweep(files, ratios=("1:1", "2:1"))
    out = tmp_path / "b.csv"
    result = run_bench(spec, out, engine=engine, workers=2,
                       task_fn=functools.partial(die_once, str(tmp_path / "m")))
    assert (result.ran, result.failed) == (4, 0)
    attempts = sorted(int(p.read_text()) for p in (tmp_path / "m").iterdir())
    assert attempts == [2, 2, 2, 2]  # every cell killed once, then run again
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    reference = run_bench(spec, tmp_path / "ref.csv", workers=1).rows
    assert comparable(rows) == comparable(reference)


def test_a_cell_whose_worker_always_dies_is_an_error_row_then_retried(files, tmp_path):
    spec = sweep(files, ratios=("1:1", "2:1"), strategies=("sync",))
    out = tmp_path / "b.csv"
    failed = run_bench(spec, out, workers=2, task_fn=die_always)
    assert failed.failed == 2
    assert all(f"WorkerDied: the worker died on each of {MAX_ATTEMPTS} attempts" in r["error"]
               for r in failed.rows)
    retried = run_bench(spec, out, workers=2)
    assert (retried.ran, retried.failed, len(retried.rows)) == (2, 0, 2)


def test_an_interrupted_driver_leaves_whole_rows_and_stops_its_workers(files, tmp_path):
    spec = sweep(files, ratios=("1:1", "2:1"))
    out = tmp_path / "b.csv"

    def interrupt(done, total, label):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_bench(spec, out, workers=2, progress=interrupt)
    assert not multiprocessing.active_children()
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert len(rows) == 2 and all(r["status"] for r in rows)
    assert len(out.read_text().splitlines()) == 3  # header and the same two rows
    resumed = run_bench(spec, out, workers=2)
    assert (resumed.ran, resumed.skipped, len(resumed.rows)) == (2, 2, 4)
    assert len({tuple(r[k] for k in ("ratio", "strategy")) for r in resumed.rows}) == 4


def report_placement(spec, task, inputs, plans):
    """A task function that says where its worker runs: GPU, CPUs and torch's thread count."""
    return (os.environ.get("CUDA_VISIBLE_DEVICES"), sorted(os.sched_getaffinity(0)),
            os.environ.get("OMP_NUM_THREADS"))


def test_gpu_workers_get_cpus_of_their_own(files, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpus = sorted(os.sched_getaffinity(0))
    spec = sweep(files, ratios=("1:1", "2:1"))
    engine = LocalEngine(2, gpus=["0", "1"], task_fn=report_placement)
    try:
        got = {gpu: (mine, threads) for _, (gpu, mine, threads) in
               engine.run(spec, split(spec, spec.cells())[:2], lambda task: None)}
    finally:
        engine.close()
    half = len(cpus) // 2
    assert got == {"0": (cpus[:half], str(half)), "1": (cpus[half:2 * half], str(half))}


def test_workers_never_share_a_gpu(files, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    spec = sweep(files, execute=True)
    engine = open_engine("local", spec, n_tasks=4)
    assert isinstance(engine, LocalEngine) and engine.gpus == ["3", "5"]
    from autotm_py.errors import ConfigError

    with pytest.raises(ConfigError, match="one GPU each"):
        open_engine("local", spec, n_tasks=4, workers=3)
    with pytest.raises(ConfigError, match="--address is for --engine ray"):
        open_engine("local", spec, n_tasks=4, address="auto")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_address_is_a_one_line_error(files, tmp_path):
    pytest.importorskip("ray")
    model, memory = files
    proc = subprocess.run(
        [sys.executable, "-m", "autotm_py", "bench", "--models", model, "--ratios", "1:1",
         "--device", "cuda", "--memory", memory, "--engine", "ray", "--address",
         f"127.0.0.1:{_closed_port()}", "-o", str(tmp_path / "b.csv")],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.startswith("error: --address 127.0.0.1:") and \
        proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_ray_on_its_own_instance_from_the_command_line(files, tmp_path):
    """No address: the driver starts a Ray instance here, runs the sweep, and stops it."""
    pytest.importorskip("ray")
    model, memory = files
    out = tmp_path / "b.csv"
    args = [sys.executable, "-m", "autotm_py", "bench", "--models", model, "--ratios",
            "1:1,2:1", "--strategies", "sync", "--device", "cuda", "--memory", memory,
            "--training", "--engine", "ray", "--no-progress", "-o", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "2 rows run, 0 already there, 0 failed" in proc.stdout


def test_without_ray_the_engine_is_a_one_line_error(files, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    model, memory = files
    code = main(["bench", "--models", model, "--ratios", "1:1", "--device", "cuda",
                 "--memory", memory, "--engine", "ray", "-o", str(tmp_path / "b.csv")])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1
    assert "pip install 'autotm_py[ray]'" in err
