"""Where a bench row was made: machine, accelerator, package versions and date."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
from functools import cache
from typing import Any

_PACKAGES = ("autotm_py", "pulp", "highspy", "numpy", "onnx", "torch")


@cache
def versions() -> str:
    """'autotm_py 0.1.0; pulp 3.3.2; ...' for the packages that are installed."""
    out = [f"python {platform.python_version()}"]
    for name in _PACKAGES:
        try:
            out.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return "; ".join(out)


@cache
def machine() -> str:
    """CPU model (from /proc/cpuinfo where there is one), architecture and core count."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}; {platform.machine()}; {os.cpu_count()} cores; {platform.system()}"


@cache
def device_name(device: str) -> str:
    """The GPU's name for cuda (torch is imported only then), else the CPU. Asked once per
    process: a sweep's worker keeps its GPU."""
    if device != "cuda":
        return machine().split(";")[0]
    import torch

    if not torch.cuda.is_available():
        return "cuda (not available)"
    return str(torch.cuda.get_device_name(torch.cuda.current_device()))


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def environment(device: str) -> dict[str, Any]:
    return {"machine": machine(), "device_name": device_name(device), "versions": versions(),
            "date": now()}
