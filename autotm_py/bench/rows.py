"""The rows of a sweep on disk: a CSV and a JSON document with the same stem, rewritten
atomically after every row, so an interrupted sweep keeps every finished row."""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotm_py.bench.spec import COLUMNS, ROW_KEY, BenchSpec, cell_text
from autotm_py.errors import ConfigError
from autotm_py.fileio import atomic_write_text

BENCH_FORMAT, BENCH_VERSION = "autotm-bench", 1


def key_of(row: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(cell_text(row.get(k)) for k in ROW_KEY)


def output_paths(output: str | os.PathLike[str]) -> tuple[Path, Path]:
    path = Path(output)
    if path.suffix == ".json":
        return path.with_suffix(".csv"), path
    return path if path.suffix else path.with_suffix(".csv"), path.with_suffix(".json")


def read_rows(csv_path: Path, json_path: Path) -> list[dict[str, Any]]:
    """Rows already written: the JSON document when present, else the CSV, its cells read back
    as the numbers, booleans and blanks they were written from (a sweep whose JSON did not come
    back from the GPU machine is summarized from its CSV alone)."""
    if json_path.exists():
        try:
            doc = json.loads(json_path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{json_path}: not valid JSON ({exc}); remove it to start the "
                              "sweep afresh") from None
        if doc.get("format") != BENCH_FORMAT:
            raise ConfigError(f"{json_path}: not an `autotm bench` result; choose another -o")
        return list(doc.get("rows", []))
    if csv_path.exists():
        with csv_path.open(newline="") as fh:
            return [{k: typed_cell(v) for k, v in r.items()} for r in csv.DictReader(fh)]
    return []


def read_result(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of one sweep's result, named by its CSV or its JSON (the JSON is preferred)."""
    csv_path, json_path = output_paths(path)
    if not csv_path.exists() and not json_path.exists():
        raise ConfigError(f"{path}: no such `autotm bench` result (neither {csv_path.name} nor "
                          f"{json_path.name}); pass the CSV or JSON that `autotm bench -o` wrote")
    return read_rows(csv_path, json_path)


_INT = re.compile(r"-?\d+")
_FLOAT = re.compile(r"-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?")
_BOOLS = {"True": True, "False": False}


def typed_cell(text: str) -> Any:
    """A CSV cell as the value `cell_text` wrote it from: blank -> None, True/False, integers
    and decimals as numbers, anything else (names, ratios like 1:4, notes) as text."""
    if text == "":
        return None
    if text in _BOOLS:
        return _BOOLS[text]
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


def write_results(rows: Sequence[Mapping[str, Any]], csv_path: Path, json_path: Path,
                  spec: BenchSpec | None = None) -> None:
    """Rewrite both files atomically (temp file + rename): never half a file."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: cell_text(row.get(k)) for k in COLUMNS})
    atomic_write_text(csv_path, buf.getvalue())
    doc = {"format": BENCH_FORMAT, "version": BENCH_VERSION, "columns": list(COLUMNS),
           "spec": None if spec is None else _spec_dict(spec), "rows": list(rows)}
    atomic_write_text(json_path, json.dumps(doc, indent=1, default=str) + "\n")


def _spec_dict(spec: BenchSpec) -> dict[str, Any]:
    plain = {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.__dict__.items()
             if k not in ("model", "run")}
    return plain | {"model": spec.model.to_dict(), "run": spec.run.to_dict()}
