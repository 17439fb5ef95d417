"""Benchmark sweeps (`autotm bench`): a face of the package beside the CLI, above the API.

`spec` (what a sweep covers), `rows` (its CSV/JSON results), `cells` (one model's rows),
`env` (where a row was made), `runner` (`run_bench`, the sweep itself).
"""

from autotm_py.bench.rows import (
    key_of,
    output_paths,
    read_result,
    read_rows,
    typed_cell,
    write_results,
)
from autotm_py.bench.runner import BenchResult, run_bench
from autotm_py.bench.spec import COLUMNS, ROW_KEY, BenchSpec, sweep_layout

__all__ = [
           "COLUMNS",
           "ROW_KEY",
           "BenchResult",
           "BenchSpec",
           "key_of",
           "output_paths",
           "read_result",
           "read_rows",
           "run_bench",
           "sweep_layout",
           "typed_cell",
           "write_results",
]
