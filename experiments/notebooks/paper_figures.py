# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The paper's figures from saved results
#
# Every figure of `experiments/` drawn from the results under `experiments/results/`
# (`autotm bench` output). Set `AUTOTM_RESULTS` to read another folder and `AUTOTM_FIGURES`
# to write elsewhere. Figures whose results are missing are listed with the command that makes
# them. How to read each figure: `docs/figures.md`.

# %%
import os
import sys
from pathlib import Path

from IPython.display import SVG, display

here = Path.cwd()
experiments = next(p for p in (here, *here.parents) if (p / "figlib.py").exists())
sys.path.insert(0, str(experiments))

import figures  # noqa: E402

results = Path(os.environ.get("AUTOTM_RESULTS", experiments / "results"))
out = Path(os.environ.get("AUTOTM_FIGURES", experiments / "figures"))
print("results:", results, "\nfigures:", out)

# %% [markdown]
# ## Regenerate every figure

# %%
written, skipped = figures.make_all(results, out)
for line in skipped:
    print(line)

# %% [markdown]
# ## Show them

# %%
for path in written:
    if path.suffix == ".svg":
        print(path.name)
        display(SVG(filename=str(path)))

# %% [markdown]
# ## The numbers behind Fig. 7 (speedup over all slow)

# %%
import fig07_speedup  # noqa: E402
from figlib import MissingResults, require  # noqa: E402

try:
    rows = require(results, "host_conventional.json", "run experiments/run_experiments.py host")
except MissingResults as exc:
    print(exc)
else:
    for model in sorted({r["model"] for r in rows}):
        for name, values in fig07_speedup.speedups(rows, model).items():
            cells = "  ".join(f"{v:6.2f}" for v in values)
            print(f"{model:14s} {name:12s} {cells}")
