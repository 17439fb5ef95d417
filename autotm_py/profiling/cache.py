"""The profile cache: JSON files of measured kernel times, one file per device.

A file holds one or more *sets*, one per device fingerprint (the same GPU under two CUDA
versions gives two sets in one file). A set maps a kernel signature and an IO placement
("FFF": every input and output in fast memory) to an entry: median, p10, p90, run count,
measured or estimated, when, and the graph batch it was measured at:

    {"format": "autotm-profiles", "version": 1, "device": "cpu",
     "sets": {"<fingerprint id>": {"fingerprint": {...}, "roofline": {...} | null,
                                   "entries": {"<signature>": {"FFF": {"median_s": ...}}}}}}

Writes are atomic (temporary file + rename) and merge: the file is re-read under a lock and the
new entries are added to what is there, so an interrupted or concurrent profiler never loses or
corrupts entries. A file that cannot be parsed is a `ProfileError` naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotm_py.errors import ProfileError
from autotm_py.fileio import atomic_write_text
from autotm_py.profiling.fingerprint import Fingerprint

log = logging.getLogger(__name__)

FORMAT = "autotm-profiles"
FORMAT_VERSION = 1
MEASURED, ESTIMATED = "measured", "estimated"

Entries = Mapping[str, Mapping[str, "ProfileEntry"]]  # signature -> placement -> entry


@dataclass(frozen=True)
class ProfileEntry:
    """One kernel time: median and spread of `runs` timed runs (seconds)."""

    median_s: float
    p10_s: float
    p90_s: float
    runs: int
    source: str = MEASURED
    when: str = ""
    batch: int | None = None  # batch of the graph it was measured in (for batch scaling)
    op: str = ""
    load: float | None = None  # 1-minute load average while measured (CPU; shared machines)
    # device memory a kernel allocates beyond its inputs and outputs while it runs (CUDA)
    workspace_bytes: int | None = None
    # "graph": timed inside whole-graph iterations (profiling/in_context.py); None: alone
    context: str | None = None
    # CUDA: the time the kernel keeps the GPU busy, without the launch gaps that `median_s`
    # includes (in context: torch's profiler; alone, since 2026-12-03: CUDA graph replays,
    # `torch_profiler.graph_device_time`); the simulator's GPU clock uses it
    device_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfileEntry:
        entry = cls(float(data["median_s"]), float(data["p10_s"]), float(data["p90_s"]),
                    int(data["runs"]), str(data.get("source", MEASURED)),
                    str(data.get("when", "")),
                    None if data.get("batch") is None else int(data["batch"]),
                    str(data.get("op", "")),
                    None if data.get("load") is None else float(data["load"]),
                    None if data.get("workspace_bytes") is None
                    else int(data["workspace_bytes"]),
                    None if data.get("context") is None else str(data["context"]),
                    None if data.get("device_s") is None else float(data["device_s"]))
        if entry.source not in (MEASURED, ESTIMATED) or not entry.median_s >= 0:
            raise ValueError(f"bad entry {dict(data)}")
        return entry


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ProfileSet:
    """The entries measured under one fingerprint, and where they were read from."""

    fingerprint: Fingerprint
    entries: Entries
    roofline: Mapping[str, Any] | None = None
    origin: str = ""
    shipped: bool = False

    def get(self, signature: str, placement: str) -> ProfileEntry | None:
        return self.entries.get(signature, {}).get(placement)

    def __len__(self) -> int:
        return sum(len(v) for v in self.entries.values())


@dataclass
class _FileData:
    device: str
    sets: dict[str, ProfileSet] = field(default_factory=dict)


# ---- reading -------------------------------------------------------------------------------
def _corrupt(path: Path, why: str) -> ProfileError:
    return ProfileError(f"{path}: corrupt or truncated profile file ({why}); delete it (a user "
                        "cache is re-measured) or restore it from version control (shipped)")


def read_profile_file(path: str | os.PathLike[str], *, shipped: bool = False) -> dict[str,
                                                                                   ProfileSet]:
    """Every set of a profile file by fingerprint id; a missing file has none."""
    data = _read(Path(path), shipped)
    return data.sets if data else {}


def _read(path: Path, shipped: bool, *, others_ok: bool = False) -> _FileData | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile file ({exc})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _corrupt(path, f"invalid JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        if others_ok and isinstance(raw, dict) and "format" not in raw:
            log.warning("%s is not a profile file (no \"format\": %r); skipped", path, FORMAT)
            return None
        raise _corrupt(path, f"not an {FORMAT} document")
    if not isinstance(raw.get("version"), int) or raw["version"] > FORMAT_VERSION:
        raise ProfileError(f"{path}: profile format version {raw.get('version')!r} is newer "
                           f"than this autotm_py reads ({FORMAT_VERSION}); upgrade autotm_py")
    try:
        sets = {fp_id: _parse_set(body, path, shipped) for fp_id, body in raw["sets"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _corrupt(path, f"bad set or entry: {exc!r}") from None
    return _FileData(str(raw.get("device", "")), sets)


def _parse_set(body: Mapping[str, Any], path: Path, shipped: bool) -> ProfileSet:
    entries = {sig: {pl: ProfileEntry.from_dict(e) for pl, e in by_pl.items()}
               for sig, by_pl in body["entries"].items()}
    roofline = body.get("roofline")
    return ProfileSet(Fingerprint.from_dict(body["fingerprint"]), entries,
                      dict(roofline) if roofline else None, str(path), shipped)


# ---- writing -------------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (lock file in the temp dir, so no litter beside it)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    lock = Path(tempfile.gettempdir()) / f"autotm-profile-{digest}.lock"
    try:
        import fcntl
    except ImportError:  # not POSIX: rely on re-read + atomic replace alone
        yield
        return
    with lock.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_entries(path: str | os.PathLike[str], fingerprint: Fingerprint, entries: Entries,
                  *, roofline: Mapping[str, Any] | None = None) -> Path:
    """Merge `entries` (and the device roofline) into the set of `fingerprint` in `path`.

    Re-reads the file under a lock so entries written meanwhile by another process are kept;
    new entries replace old ones with the same signature and placement.
    """
    target = Path(path)
    with _locked(target):
        current = _read(target, shipped=False) or _FileData(fingerprint.kind)
        old = current.sets.get(fingerprint.id)
        merged: dict[str, dict[str, ProfileEntry]] = {
            sig: dict(by_pl) for sig, by_pl in (old.entries if old else {}).items()}
        for sig, by_pl in entries.items():
            merged.setdefault(sig, {}).update(by_pl)
        keep_roofline = roofline if roofline is not None else (old.roofline if old else None)
        current.sets[fingerprint.id] = ProfileSet(fingerprint, merged, keep_roofline)
        atomic_write_text(target, _dumps(current, fingerprint.kind))
    log.debug("wrote %d entries to %s", sum(len(v) for v in entries.values()), target)
    return target


def _dumps(data: _FileData, kind: str) -> str:
    sets = {
        fp_id: {
            "fingerprint": s.fingerprint.to_dict(),
            "roofline": dict(s.roofline) if s.roofline else None,
            "entries": {sig: {pl: e.to_dict() for pl, e in sorted(by_pl.items())}
                        for sig, by_pl in sorted(s.entries.items())},
        }
        for fp_id, s in sorted(data.sets.items())
    }
    doc = {"format": FORMAT, "version": FORMAT_VERSION, "device": data.device or kind,
           "sets": sets}
    return json.dumps(doc, indent=1) + "\n"


# ---- where profiles live -------------------------------------------------------------------
def shipped_profiles_dir() -> Path:
    """The profiles shipped with the project (`profiles/` at the repository root).

    `AUTOTM_SHIPPED_PROFILES` points elsewhere (an installed copy, or tests).
    """
    env = os.environ.get("AUTOTM_SHIPPED_PROFILES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "profiles"


def user_profiles_dir(profiles_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where this user's measurements go: the argument, else `AUTOTM_PROFILES`, else
    `$XDG_CACHE_HOME/autotm/profiles` (default `~/.cache/autotm/profiles`)."""
    if profiles_dir is not None:
        return Path(profiles_dir)
    env = os.environ.get("AUTOTM_PROFILES")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "autotm" / "profiles"


def profile_path(directory: str | os.PathLike[str], fingerprint: Fingerprint) -> Path:
    """The file of a device in a profile directory: one JSON per device."""
    return Path(directory) / f"{fingerprint.slug}.json"


def load_sets(kind: str, user_dir: Path, shipped_dir: Path | None) -> list[ProfileSet]:
    """Every set of device `kind` in the user directory, then in the shipped directory.

    A JSON document with no "format" key (a memory-system file, say) is skipped with a
    warning; a broken or truncated file is an error."""
    sets: list[ProfileSet] = []
    seen: set[Path] = set()
    for directory, shipped in ((user_dir, False), (shipped_dir, True)):
        if directory is None or not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.json")):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            data = _read(path, shipped, others_ok=True)
            if data is not None and data.device in ("", kind):
                sets.extend(s for s in data.sets.values() if s.fingerprint.kind == kind)
    return sets
