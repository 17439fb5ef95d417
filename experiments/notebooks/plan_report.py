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
# # Why is this plan good? The report of one plan
#
# The same figures as `autotm report`: bytes per tier over the iteration with the budget line,
# where each tensor lives while each kernel runs (with its copies), and bytes moved over time.
# Set `AUTOTM_PLAN` to a plan file (`autotm optimize ... -o plan.json`) and, optionally,
# `AUTOTM_TIMELINE` to its simulation (`autotm simulate ... -o timeline.json`) and
# `AUTOTM_MEASURED` to a measured run (`autotm run ... -o run.json`).

# %%
import io
import json
import os
from pathlib import Path

from IPython.display import SVG, Markdown, display

from autotm_py.plan import Plan
from autotm_py.report.build import timelines
from autotm_py.report.metrics import plan_metrics
from autotm_py.report.plots import plot_memory, plot_moves, plot_residency
from autotm_py.report.summary import markdown_summary


def show(fig):
    """Display a pyplot-free matplotlib figure inline, as SVG."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    display(SVG(buf.getvalue()))


def read(variable):
    path = os.environ.get(variable)
    return json.loads(Path(path).read_text()) if path else None


plan = Plan.load(os.environ.get("AUTOTM_PLAN", "plan.json"))
view, res, predicted, measured = timelines(plan, simulation=read("AUTOTM_TIMELINE"),
                                           measured=read("AUTOTM_MEASURED"))
print(plan.header.model_name, plan.header.strategy, "timeline:", predicted.source)

# %% [markdown]
# ## Memory per tier, with the budget

# %%
show(plot_memory(predicted, measured))

# %% [markdown]
# ## Tensor x kernel residency (moved tensors first)

# %%
show(plot_residency(view, res, max_tensors=150))

# %% [markdown]
# ## Bytes moved per direction

# %%
show(plot_moves(predicted))

# %% [markdown]
# ## Summary

# %%
display(Markdown(markdown_summary(plan, view, res, plan_metrics(plan, view), predicted,
                                  measured, read("AUTOTM_MEASURED"))))
