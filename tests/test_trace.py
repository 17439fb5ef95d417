"""The Chrome/Perfetto trace obeys the Trace Event Format's rules."""

import json
from collections import defaultdict

import pytest

from autotm_py.report.build import make_report, timelines
from autotm_py.report.trace import chrome_trace
from tests.test_report_support import simulation_dict, skip_graph, skip_plan

PHASES = {"X", "M", "C", "s", "f", "i"}  # the subset we emit, all defined by the format
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}
RUN = {"iteration_times_s": [5e-3, 5.2e-3], "median_s": 5.1e-3,
       "kernel_times_s": [1e-3, 1e-3, 1.2e-3, 1e-3], "peak_fast_bytes": 7000}


def check_trace(doc):
    """Assert the format's rules; return events grouped by phase."""
    assert set(doc) >= {"traceEvents"} and doc.get("displayTimeUnit") in ("ms", "ns")
    by_phase = defaultdict(list)
    for ev in doc["traceEvents"]:
        assert ev["ph"] in PHASES, ev
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        assert isinstance(ev["name"], str) and ev["name"]
        if ev["ph"] != "M":
            assert isinstance(ev["ts"], int | float) and ev["ts"] >= 0
        by_phase[ev["ph"]].append(ev)
    for ev in by_phase["M"]:
        assert ev["name"] in METADATA and isinstance(ev["args"], dict)
    for ev in by_phase["X"]:
        assert isinstance(ev["dur"], int | float) and ev["dur"] >= 0
    for ev in by_phase["C"]:
        assert ev["args"] and all(isinstance(v, int | float) for v in ev["args"].values())
    for ev in by_phase["i"]:
        assert ev["s"] in ("g", "p", "t")
    _check_nesting(by_phase["X"])
    _check_flows(by_phase)
    named = {(ev["pid"], ev["tid"]) for ev in by_phase["M"] if ev["name"] == "thread_name"}
    assert {(ev["pid"], ev["tid"]) for ev in by_phase["X"]} <= named  # every track is named
    return by_phase


def _check_nesting(slices):
    """Slices on one track must nest or be disjoint (Perfetto's rule)."""
    tracks = defaultdict(list)
    for ev in slices:
        tracks[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"]))
    for spans in tracks.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for start, end in spans:
            while stack and stack[-1] <= start + 1e-9:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-9, (start, end, stack)
            stack.append(end)


def _enclosing(slices, pid, tid, ts):
    return [s for s in slices if (s["pid"], s["tid"]) == (pid, tid)
            and s["ts"] - 1e-9 <= ts <= s["ts"] + s["dur"] + 1e-9]


def _check_flows(by_phase):
    starts = {ev["id"]: ev for ev in by_phase["s"]}
    ends = {ev["id"]: ev for ev in by_phase["f"]}
    assert len(starts) == len(by_phase["s"]) and len(ends) == len(by_phase["f"])
    assert starts.keys() == ends.keys()
    for fid, s in starts.items():
        f = ends[fid]
        assert (s["cat"], s["name"], s["pid"]) == (f["cat"], f["name"], f["pid"])
        assert f["ts"] >= s["ts"]
        assert _enclosing(by_phase["X"], s["pid"], s["tid"], s["ts"])  # binds to the copy
        assert f.get("bp") == "e" and _enclosing(by_phase["X"], f["pid"], f["tid"], f["ts"])


def test_simulated_trace_with_measured_process(tmp_path):
    plan = skip_plan(skip_graph())
    make_report(plan, tmp_path, simulation=simulation_dict(), measured=RUN,
                trace_path=tmp_path / "t.json", formats=("png",))
    doc = json.loads((tmp_path / "t.json").read_text())
    ph = check_trace(doc)
    names = {ev["args"]["name"] for ev in ph["M"] if ev["name"] == "process_name"}
    assert names == {"predicted (simulated)", "measured (measured)"}
    threads = {ev["args"]["name"] for ev in ph["M"] if ev["name"] == "thread_name"}
    assert {"compute", "copy slow→fast (prefetch)", "copy fast→slow (evict)"} <= threads
    # microseconds: kernel k2 runs 2..3 ms in the simulation
    k2 = next(e for e in ph["X"] if e["name"] == "k2" and e["pid"] == 1)
    assert (k2["ts"], k2["dur"]) == pytest.approx((2000.0, 1000.0))
    # one prefetch of `a`, whose arrow lands on k3, its reader
    (s,), (f,) = ph["s"], ph["f"]
    assert _enclosing(ph["X"], f["pid"], f["tid"], f["ts"])[0]["name"] == "k3"
    assert s["tid"] != f["tid"]
    counters = {ev["name"] for ev in ph["C"]}
    assert counters == {"fast tier bytes", "slow tier bytes", "fast tier budget"}
    measured = [e for e in ph["X"] if e["pid"] == 2 and e["cat"] == "iteration"]
    assert [e["dur"] for e in measured] == pytest.approx([5000.0, 5200.0])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_plan_order_trace_is_valid(mode):
    view, _, tl, _ = timelines(skip_plan(skip_graph(), mode=mode))
    doc = chrome_trace(view, tl)
    ph = check_trace(json.loads(json.dumps(doc)))
    assert "steps" in doc["otherData"]["units"]
    assert len(ph["s"]) == 1 and len([e for e in ph["X"] if e["cat"] == "kernel"]) == 4


def test_overlapping_copies_get_separate_lanes():
    sim = simulation_dict()
    extra = dict(sim["moves"][1], record=99, start_s=2.5e-3, end_s=3.2e-3)
    sim["moves"] = [*sim["moves"], extra]
    view, _, tl, _ = timelines(skip_plan(skip_graph()), simulation=sim)
    ph = check_trace(chrome_trace(view, tl))
    lanes = {e["tid"] for e in ph["X"] if e["cat"] == "copy" and "→ fast" in e["name"]}
    assert len(lanes) == 2
