"""How much tighter the packing search packs a plan's arena than greedy by size alone.

For each plan with an arena (e.g. experiments/plans/bench_arena/*), its buffers' live peak and
the extent of greedy by size (lowest gap, tightest gap) against `arena.tightest_packing`, which
adds random orders where greedy leaves holes. CPU only:

    python experiments/packing_search.py MODEL BATCH [seq=N] PLAN...
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotm_py import api, arena, pipeline
from autotm_py.plan import Plan


def main(argv: list[str]) -> int:
    model, batch, *rest = argv
    dims = dict((k, int(v)) for k, v in (a.split("=") for a in rest if "=" in a))
    plans = [a for a in rest if "=" not in a]
    graph = api.load_model(model, batch=int(batch), dims=dims or None, training=True)
    for path in plans:
        plan = Plan.load(path)
        machine = pipeline.machine_for_plan(graph, plan, None)
        machine = replace(machine, run=replace(machine.run, arena=True))
        life = arena.lifetimes(machine, plan)
        peak = life.live_peak()
        greedy = arena.extent(life, arena.greedy_by_size(life))
        started = time.perf_counter()
        searched = arena.extent(life, arena.tightest_packing(life))
        print(f"{Path(path).name}: {len(life.spans)} buffers, live peak {peak / 2**30:.3f} GiB, "
              f"greedy {greedy / peak - 1:+.1%}, with the search {searched / peak - 1:+.1%} "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
