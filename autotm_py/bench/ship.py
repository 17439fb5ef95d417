"""What a sweep's worker gets besides the package, and the plans it reads and writes.

A worker on another machine cannot read the driver's files. `Inputs.pack` therefore reads, once
per sweep, exactly the files a cell needs: each model given as a file (ONNX), the profile JSON
documents of the user folder (`--profiles`, `AUTOTM_PROFILES` or the cache) and of the shipped
folder, and a memory-system file given to `--memory`; nothing else of the user's directory.
A worker writes them once into a folder named by their digest (`Inputs.resolve`) and reads them
from there. On this machine (`Inputs.local`) nothing is copied: the paths are valid.

Plans go through the driver too (`PlanBox`): it reads the task's plans from `--plans` before the
task starts, and saves the plans the task solved when it returns, so the driver alone writes
files, whatever machine a cell ran on.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotm_py.bench.spec import BenchSpec
from autotm_py.fileio import atomic_write_bytes
from autotm_py.plan import Plan
from autotm_py.profiling import shipped_profiles_dir, user_profiles_dir

GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Inputs:
    """Files by relative path (`models/<i>/<name>`, `profiles/user/`, `profiles/shipped/`,
    `memory/<name>`); empty for a worker on the driver's machine."""

    files: dict[str, bytes] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)  # model as given -> its file's path
    memory: str | None = None  # the memory-system file's path
    digest: str = ""
    shipped: bool = False  # False: the driver's paths are used as they are
    # where rows are made, when the driver knows (its own machine): a worker then need not
    # import torch to name the GPU (seconds per worker process)
    made_on: dict[str, Any] | None = None

    @classmethod
    def local(cls, made_on: dict[str, Any] | None = None) -> Inputs:
        return cls(made_on=made_on)

    @classmethod
    def pack(cls, spec: BenchSpec) -> Inputs:
        files: dict[str, bytes] = {}
        models = {}
        for i, model in enumerate(spec.models):
            if Path(model).is_file():
                models[model] = f"models/{i}/{Path(model).name}"
                files[models[model]] = Path(model).read_bytes()
        for folder, directory in (("user", user_profiles_dir(spec.profiles_dir)),
                                  ("shipped", shipped_profiles_dir())):
            if directory.is_dir():  # load_sets reads the top-level JSON documents only
                for path in sorted(directory.glob("*.json")):
                    files[f"profiles/{folder}/{path.name}"] = path.read_bytes()
        memory = None
        if spec.memory is not None and Path(spec.memory).is_file():
            memory = f"memory/{Path(spec.memory).name}"
            files[memory] = Path(spec.memory).read_bytes()
        digest = hashlib.sha256()
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
        return cls(files, models, memory, digest.hexdigest()[:16], shipped=True)

    @property
    def size(self) -> int:
        return sum(len(b) for b in self.files.values())

    def resolve(self, spec: BenchSpec) -> tuple[BenchSpec, dict[str, str], str | None]:
        """The spec as this worker reads it, each model's source, and the shipped profiles'
        folder (None: the package's own)."""
        if not self.shipped:
            return spec, {}, None
        root = self._materialize()
        spec = replace(spec, profiles_dir=str(root / "profiles" / "user"),
                       memory=str(root / self.memory) if self.memory else spec.memory)
        sources = {model: str(root / rel) for model, rel in self.models.items()}
        return spec, sources, str(root / "profiles" / "shipped")

    def _materialize(self) -> Path:
        """Write the files once per machine: a folder named by their digest, complete when its
        `.done` marker exists (files are written atomically, so two workers may race)."""
        root = Path(tempfile.gettempdir()) / f"autotm-bench-{self.digest}"
        if not (root / ".done").exists():
            for sub in ("profiles/user", "profiles/shipped"):
                (root / sub).mkdir(parents=True, exist_ok=True)
            for name, data in self.files.items():
                atomic_write_bytes(root / name, data)
            (root / ".done").touch()
        return root


@dataclass
class PlanBox:
    """The plans of one task, by file name in the sweep's plans folder: those the driver found
    there (`given`) and those the task solved (`solved`), as stored (gzip-compressed JSON, or
    plain JSON written by an earlier version)."""

    given: dict[str, bytes] = field(default_factory=dict)
    solved: dict[str, bytes] = field(default_factory=dict)

    def get(self, name: str) -> Plan | None:
        data = self.given.get(name)
        if data is None:
            return None
        if data[:2] == GZIP_MAGIC:
            data = gzip.decompress(data)
        return Plan.from_json(data.decode(), origin=name)

    def put(self, name: str, plan: Plan) -> None:
        data = plan.to_json().encode()
        self.solved[name] = gzip.compress(data, mtime=0) if name.endswith(".gz") else data

    @classmethod
    def read(cls, paths: list[Path]) -> PlanBox:
        """The driver's side: the plans among `paths` that exist (a plain `.json` kept by an
        earlier version stands in for its `.json.gz`)."""
        box = cls()
        for path in paths:
            for candidate in (path, path.with_suffix("")):
                if candidate.exists():
                    box.given[path.name] = candidate.read_bytes()
                    break
        return box

    @staticmethod
    def save(solved: dict[str, bytes], plans_dir: str | os.PathLike[str] | None) -> None:
        if plans_dir is None:
            return
        for name, data in solved.items():
            atomic_write_bytes(Path(plans_dir) / name, data)
