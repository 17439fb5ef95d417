"""Reports: read a plan (and simulated or measured runs) into metrics, tables, timelines,
figures (`plots`, matplotlib inside its functions) and a Chrome trace.

The public names are imported lazily (on first use); other layers import them from here.
"""

from __future__ import annotations

from autotm_py.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "make_report": "autotm_py.report.build",
    "plan_metrics": "autotm_py.report.metrics",
    "PlanView": "autotm_py.report.residency",
    "kernel_csv": "autotm_py.report.tables",
    "kernel_report": "autotm_py.report.tables",
    "render_kernel_report": "autotm_py.report.tables",
    "load_measured": "autotm_py.report.timeline",
    "plot_values": "autotm_py.report.values",
    "values_lines": "autotm_py.report.values",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals)
