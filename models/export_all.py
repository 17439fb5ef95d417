"""Regenerate models/: every zoo model as ONNX at its default (paper) dims, without weights.

    python models/export_all.py            # writes models/<name>.onnx
    python models/export_all.py --check    # exit 1 if a file differs from what the code builds

Weights are not written (each file names `<name>.weights.bin`, which `autotm zoo export NAME
--with-weights -o FILE` creates). See docs/zoo.md for what each file holds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from autotm_py.frontend.zoo import ZOO, export_model

HERE = Path(__file__).resolve().parent


def check() -> list[str]:
    """Names whose file in models/ differs from a fresh export."""
    stale = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in ZOO:
            fresh = export_model(name, Path(scratch) / f"{name}.onnx")
            shipped = HERE / f"{name}.onnx"
            if not shipped.exists() or shipped.read_bytes() != fresh.read_bytes():
                stale.append(name)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare instead of writing; exit 1 on any difference")
    if parser.parse_args(argv).check:
        stale = check()
        print("stale: " + ", ".join(stale) if stale else "models/ is up to date")
        return 1 if stale else 0
    for name in ZOO:
        target = export_model(name, HERE / f"{name}.onnx")
        print(f"models/{target.name:<20} {target.stat().st_size:>10,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
