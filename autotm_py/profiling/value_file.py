"""The value profile file (`autotm profile --values FILE`, docs/values.md): its format, reading
it, and the facts the planner takes from it. No torch: `autotm optimize --values` reads it on a
machine without one."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotm_py.errors import ConfigError

FORMAT = "autotm-values"
FORMAT_VERSION = 1
CLASSES = ("zero", "constant", "low-entropy", "varied")
FILLABLE = ("zero", "constant")  # classes the planner may fill instead of copying


def load_values(path: str | Path) -> dict[str, Any]:
    """A value profile (`autotm profile --values`; a ConfigError naming the file otherwise)."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read value profile {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"value profile {path} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a value profile (`autotm profile MODEL --values FILE`)")
    return doc


def value_fills(doc: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    """(tensor name, value) of every tensor the profile found zero or constant: the facts the
    planner may use (`PlanConfig.fills`)."""
    return tuple((str(r["name"]), float(r["value"])) for r in doc.get("tensors", ())
                 if r.get("class") in FILLABLE and r.get("value") is not None)
