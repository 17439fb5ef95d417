"""The pure parts of `autotm calibrate`: fitting measured tables into a MemorySystem.

The measurement itself needs a CUDA GPU (`test_calibrate_on_gpu`, marked gpu).
"""

from __future__ import annotations

import json

import pytest

from autotm_py.cli import main
from autotm_py.errors import ProfileError
from autotm_py.memory.tiers import MemorySystem, load_memory_system
from autotm_py.profiling.calibrate import DEFAULT_SIZES, MiB, fit_link, row, summarize

GB = 1e9


def table(bandwidth: float, latency: float, sizes=DEFAULT_SIZES, factor: int = 1):
    """Rows of an ideal link: time = latency + bytes / bandwidth."""
    return [row(n * factor, [latency + n * factor / bandwidth] * 3) for n in sizes]


def tables(**extra):
    base = {
        "h2d_pinned": table(55 * GB, 10e-6),
        "d2h_pinned": table(52 * GB, 12e-6),
        "h2d_pageable": table(15 * GB, 50e-6),
        "d2h_pageable": table(12 * GB, 50e-6),
        "both_pinned": table(91 * GB, 15e-6, factor=2),
        "d2d": table(3000 * GB, 5e-6, factor=2),
        "under_compute": {"h2d_gbps": 50.0, "d2h_gbps": 48.0, "compute_slowdown": 1.03},
        "pin_alloc": [{"bytes": MiB, "first_s": 1e-3, "reuse_s": 1e-5, "register_s": 5e-4}],
    }
    base.update(extra)
    return base


def test_fit_link_recovers_bandwidth_and_latency():
    bandwidth, latency = fit_link(table(55 * GB, 10e-6))
    assert bandwidth == pytest.approx(55 * GB, rel=0.01)  # large sizes: latency negligible
    assert latency == pytest.approx(10e-6, rel=1e-6)
    with pytest.raises(ProfileError):
        fit_link([])


def test_fit_link_uses_small_sizes_only_when_nothing_is_large():
    bw, _ = fit_link(table(20 * GB, 0.0, sizes=(MiB, 4 * MiB)))
    assert bw == pytest.approx(20 * GB)


def test_summarize_builds_a_gpu_memory_system():
    memory = summarize(tables(), device_name="NVIDIA H100 80GB HBM3", date="2026-01-02",
                       versions={"torch": "2.11"})
    assert memory.mode == "gpu" and memory.name == "calibrated-nvidia-h100-80gb-hbm3"
    link = memory.link
    assert link.read_bw == pytest.approx(55 * GB, rel=0.01)
    assert link.write_bw == pytest.approx(52 * GB, rel=0.01)
    assert link.async_read_bw == 50 * GB and link.async_write_bw == 48 * GB
    assert link.both_directions_bw == pytest.approx(91 * GB, rel=0.01)
    assert link.latency_s == pytest.approx(11e-6, rel=1e-3)
    assert memory.fast.read_bw == pytest.approx(3000 * GB, rel=0.01)
    assert memory.slow.read_bw == link.read_bw
    assert memory.measured["device"] == "NVIDIA H100 80GB HBM3"
    assert memory.measured["date"] == "2026-01-02" and memory.measured["torch"] == "2.11"
    assert memory.measured["tables"]["pin_alloc"][0]["first_s"] == 1e-3
    assert "2026-01-02" in memory.source


def test_summarize_without_optional_tables_falls_back_to_the_sync_rates():
    t = tables()
    for key in ("under_compute", "both_pinned", "d2d"):
        t.pop(key)
    memory = summarize(t, device_name="gpu", date="d")
    assert memory.link.async_read_bw == memory.link.read_bw
    assert memory.link.both_directions_bw is None
    with pytest.raises(ProfileError, match="h2d_pinned"):
        summarize({"d2h_pinned": table(1 * GB, 0)}, device_name="gpu", date="d")


def test_the_file_round_trips_through_the_memory_system_loader(tmp_path):
    memory = summarize(tables(), device_name="NVIDIA H100", date="2026-01-02")
    path = tmp_path / "memory.json"
    path.write_text(json.dumps(memory.to_dict()))
    loaded = load_memory_system(path)
    assert loaded == MemorySystem.from_dict(memory.to_dict())
    assert loaded.link == memory.link


def test_cli_refuses_cpu_and_reports_a_missing_gpu(capsys, tmp_path):
    out = tmp_path / "m.json"
    assert main(["calibrate", "--device", "cpu", "-o", str(out)]) == 2
    assert "needs --device cuda" in capsys.readouterr().err
    assert main(["calibrate", "--max-size", "10KiB", "-o", str(out)]) == 2
    assert "at least 1MiB" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        assert main(["calibrate", "-o", str(out)]) == 1
        assert "no CUDA GPU" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.gpu
def test_calibrate_on_gpu(tmp_path):
    out = tmp_path / "m.json"
    assert main(["calibrate", "--max-size", "16MiB", "--repeats", "2", "--no-progress", "-o",
                 str(out)]) == 0
    memory = load_memory_system(out)
    assert memory.mode == "gpu" and memory.link.read_bw > 1e9
