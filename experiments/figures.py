"""Regenerate every figure from the saved results: `python experiments/figures.py`.

Figures whose results do not exist yet are skipped with a line saying how to make them; the
exit code is non-zero only when a figure fails for another reason.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fig07_speedup  # noqa: E402
import fig09_cost  # noqa: E402
import fig10_inception_sweep  # noqa: E402
import fig11_error  # noqa: E402
import fig12_gpu  # noqa: E402
import fig_ilp_times  # noqa: E402
from figlib import FIGURES, RESULTS, MissingResults  # noqa: E402

FIGURE_MODULES = (fig07_speedup, fig09_cost, fig10_inception_sweep, fig11_error, fig12_gpu,
                  fig_ilp_times)


def make_all(results: Path = RESULTS, figures: Path = FIGURES) -> tuple[list[Path], list[str]]:
    """(files written, one line per skipped figure)."""
    written, skipped = [], []
    for module in FIGURE_MODULES:
        name = module.__name__
        try:
            written += module.make(results, figures)
        except MissingResults as exc:
            skipped.append(f"{name}: skipped, {exc}")
    return written, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--figures", type=Path, default=FIGURES)
    args = parser.parse_args()
    written, skipped = make_all(args.results, args.figures)
    for path in written:
        print(f"wrote {path}")
    for line in skipped:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
