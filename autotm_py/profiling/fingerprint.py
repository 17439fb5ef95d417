"""Device fingerprints: which machine a profile was measured on, and how close two machines are.

A fingerprint names the device kind (cpu|cuda), the device (CPU model or GPU name), the torch,
CUDA and cuDNN versions and the thread count. Profiles measured under one fingerprint are exact
for it; for another machine of the same kind the closest fingerprint is used instead (see
`closeness` and docs/profiling.md).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotm_py.config import gpus_named
from autotm_py.errors import ConfigError, ProfileError

DEVICE_KINDS = ("cpu", "cuda")

# What `device="cuda"` means on a machine without a GPU: the shipped profiles of this device.
REFERENCE_CUDA_DEVICE = "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True)
class Fingerprint:
    """The machine and software a kernel time was measured with."""

    kind: str
    name: str
    torch: str
    cuda: str = ""
    cudnn: str = ""
    threads: int = 0

    @property
    def id(self) -> str:
        """A readable, stable key for the profile file."""
        parts = [self.kind, self.name, f"torch {self.torch}"]
        if self.cuda:
            parts.append(f"cuda {self.cuda}")
        if self.cudnn:
            parts.append(f"cudnn {self.cudnn}")
        parts.append(f"{self.threads} threads")
        return " | ".join(parts)

    @property
    def slug(self) -> str:
        """The profile file stem of this device: ``cpu-amd-epyc``, ``h100-80gb-hbm3``."""
        name = re.sub(r"^(nvidia|amd|intel)\s+(?=\S*\d)", "", self.name.strip(), flags=re.I)
        body = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"
        return f"cpu-{body}" if self.kind == "cpu" else body

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fingerprint:
        return cls(kind=str(data["kind"]), name=str(data["name"]), torch=str(data["torch"]),
                   cuda=str(data.get("cuda", "")), cudnn=str(data.get("cudnn", "")),
                   threads=int(data.get("threads", 0)))


def check_device(device: str) -> str:
    """'cpu' or 'cuda' ('cuda:0' is accepted as 'cuda'); anything else is a ConfigError."""
    kind = device.split(":", 1)[0].lower()
    if kind not in DEVICE_KINDS:
        raise ConfigError(f"--device {device!r}: choose cpu or cuda")
    return kind


def cpu_model_name() -> str:
    """The CPU model from /proc/cpuinfo, else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def current_fingerprint(device: str) -> Fingerprint:
    """The fingerprint of this machine's `device`; needs torch (and a GPU for cuda)."""
    import torch

    kind = check_device(device)
    cuda = torch.version.cuda or ""
    cudnn_v = _cudnn_version()
    cudnn = str(cudnn_v) if cudnn_v else ""
    if kind == "cpu":
        return Fingerprint("cpu", cpu_model_name(), torch.__version__,
                           threads=torch.get_num_threads())
    if not torch.cuda.is_available():
        raise ProfileError("--device cuda: torch sees no CUDA GPU on this machine; measure on "
                           "a GPU machine, or plan with the shipped profiles (load_costs)")
    return Fingerprint("cuda", _cuda_device_name(), torch.__version__, cuda, cudnn,
                       threads=torch.get_num_threads())


def _cuda_device_name() -> str:
    """The current CUDA device's name, as torch gives it. Before this process has made its
    CUDA context, from NVML (`nvidia-smi`, which names the device as torch does): naming the
    GPU, to pick its profiles and link while planning, must not make one, because the placed
    allocator can become torch's allocator only before it (a plan made and run in one process
    ran on torch's allocator, its outputs copied into their slots: the H200, 2026-12-04)."""
    import torch

    if not torch.cuda.is_initialized():
        name = _nvml_device_name(_visible_device())
        if name:
            return name
    return torch.cuda.get_device_name(torch.cuda.current_device())


def _cudnn_version() -> int | None:
    """cuDNN's version as `torch.backends.cudnn.version()` gives it, without the check of
    every device's capability that comes with that call before CUDA is up: it makes the CUDA
    context (see `_cuda_device_name`)."""
    import torch

    if torch.cuda.is_initialized():
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    lib = getattr(torch._C, "_cudnn", None)
    try:
        return int(lib.getVersionInt()) if lib is not None else None
    except (AttributeError, RuntimeError):
        return None


def _visible_device() -> str:
    """The device torch's index 0 is, as nvidia-smi's `-i` takes it: the first entry of
    CUDA_VISIBLE_DEVICES (an index or a UUID), else 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first or "0"


@functools.lru_cache(maxsize=8)
def _nvml_device_name(device: str) -> str | None:
    """nvidia-smi's name of `device`, None where it cannot say (no nvidia-smi, a MIG slice)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader", "-i", device],
                              capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and len(lines) == 1 else None


def target_fingerprint(device: str) -> Fingerprint:
    """The machine whose profiles `load_costs(device=...)` should prefer.

    This machine's device when it has one; for cuda without a GPU (or without torch), the
    reference device whose profiles ship with the project (an H100). torch is imported only
    when it is already loaded or an NVIDIA device is present: planning stays torch-free and
    does not pay the import (seconds) just to name this CPU.
    """
    kind = check_device(device)
    if "torch" in sys.modules or (kind == "cuda" and _nvidia_present()):
        try:
            return current_fingerprint(kind)
        except (ImportError, ProfileError):
            pass
    if kind == "cuda":
        return Fingerprint("cuda", REFERENCE_CUDA_DEVICE, torch="")
    return Fingerprint("cpu", cpu_model_name(), _installed("torch"), threads=_default_threads())


def detected_gpu() -> str | None:
    """This machine's GPU as torch names it, None where it has none (or no torch): the GPU a
    plan made here runs on unless `--gpu` names another."""
    if not ("torch" in sys.modules or _nvidia_present()):
        return None
    try:
        return current_fingerprint("cuda").name
    except (ImportError, ProfileError):
        return None


def profiled_gpu(name: str, known: Iterable[str]) -> str:
    """The GPU that `--gpu NAME` means among the GPUs with profiles (`known`): the one whose
    name equals NAME, else the only one whose name contains it ("h200" for "NVIDIA H200"),
    ignoring case. Planning for a GPU this machine does not have needs its profiles."""
    names = sorted(set(known))
    named = gpus_named(name, names)
    if len(named) == 1:
        return named[0]
    have = ", ".join(repr(n) for n in names) or "none"
    if named:
        raise ConfigError(f"--gpu {name!r} names several GPUs with profiles ({have}): give "
                          "more of the name")
    raise ConfigError(f"--gpu {name!r}: no profiles of that GPU (profiles of: {have}); measure "
                      "them on it with `autotm profile MODEL --device cuda`")


def _nvidia_present() -> bool:
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _default_threads() -> int:
    """The intra-op thread count torch would pick: OMP_NUM_THREADS, else the usable CPUs."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def _model_tokens(name: str) -> list[str]:
    """Tokens of a device name that carry a digit, in order: the first is the model number
    ('h100' of 'NVIDIA H100 80GB HBM3', '7763' of 'AMD EPYC 7763 64-Core Processor')."""
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if any(c.isdigit() for c in t)]


def _same_model(a: str, b: str) -> int:
    ta, tb = _model_tokens(a), _model_tokens(b)
    return int(bool(ta) and bool(tb) and ta[0] == tb[0])


def _minor(version: str) -> str:
    return ".".join(version.split("+", 1)[0].split(".")[:2])


def closeness(have: Fingerprint, want: Fingerprint) -> tuple[int, ...]:
    """A sort key (higher is closer) of a measured fingerprint for a wanted one.

    Lexicographic: same kind, same device name, same model number (H100 for H100 PCIe), more
    shared name tokens, same thread count, same torch minor version, same CUDA, same cuDNN.
    """
    return (
        int(have.kind == want.kind),
        int(have.name == want.name),
        _same_model(have.name, want.name),
        len(set(_model_tokens(have.name)) & set(_model_tokens(want.name))),
        int(have.threads == want.threads),
        int(_minor(have.torch) == _minor(want.torch)),
        int(have.cuda == want.cuda),
        int(have.cudnn == want.cudnn),
    )
