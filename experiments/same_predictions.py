"""Whether two versions of autotm_py predict the same for saved plans: each version simulates
every plan (non-strict, with the shipped profiles) in a process of its own, and the predicted
iteration and fast-tier peak are compared exactly.

Usage:
    git archive REV autotm_py | tar -x -C /tmp/old      # the other version's package
    python experiments/same_predictions.py /tmp/old OUT.json PLAN [PLAN ...]

OUT.json: per plan, both versions' (predicted seconds, fast peak bytes) or error, and whether
they are equal; the last line printed counts the equal ones. A plan that no longer belongs to
today's graph of its model (solved before an importer or fusion change) is an error in both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What each version runs: simulate every plan given, write name -> [total_s, peak] or error.
CHILD = r"""
import json, sys
from pathlib import Path
from autotm_py import api
from autotm_py.plan import Plan
out = {}
for p in sys.argv[2:]:
    plan = Plan.load(p)
    m = plan.header.model
    try:
        graph = api.load_model(plan.header.model_name.split("/")[0], batch=m.batch,
                               dims=dict(m.dims), training=m.training,
                               optimizer=m.optimizer or "sgd", fuse=m.fuse,
                               loss=m.loss or "auto", loss_chunks=m.loss_chunks,
                               channels_last=m.channels_last)
        sim = api.simulate(graph, plan, strict=False)
        out[Path(p).name] = [sim.total_s, sim.fast_peak_bytes]
    except Exception as exc:  # a stale plan: reported, compared like any value
        out[Path(p).name] = f"{type(exc).__name__}: {str(exc)[:160]}"
Path(sys.argv[1]).write_text(json.dumps(out))
"""


def predictions(package_root: Path, plans: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        env = {**os.environ, "PYTHONPATH": str(package_root),
               "AUTOTM_SHIPPED_PROFILES": str(ROOT / "profiles")}
        subprocess.run([sys.executable, "-c", CHILD, str(out), *plans], env=env, check=True)
        return json.loads(out.read_text())


def main(argv: list[str]) -> int:
    old_root, out_path, plans = Path(argv[0]), Path(argv[1]), argv[2:]
    old, new = predictions(old_root, plans), predictions(ROOT, plans)
    rows = {name: {"old": old[name], "new": new.get(name), "equal": old[name] == new.get(name)}
            for name in old}
    out_path.write_text(json.dumps(rows, indent=1) + "\n")
    equal = sum(r["equal"] for r in rows.values())
    errors = sum(isinstance(r["old"], str) for r in rows.values())
    print(f"{equal} of {len(rows)} plans predicted the same ({errors} an error in both)")
    return 0 if equal == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
