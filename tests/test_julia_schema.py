"""The plan JSON contract shared by Python (writer) and Julia (AutoTMBridge, reader).

`autotm_py/schemas/plan.schema.json` is the one description of the format. These tests check
that real plans written by `Plan.to_json()` satisfy it, that it rejects broken plans, that it
names exactly the fields of the plan dataclasses, and that the fixture the Julia tests read
is the one Python writes today. Regenerate the fixture after a format change with

    python -m tests.test_julia_schema
"""

from __future__ import annotations

import copy
import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from autotm_py.fileio import atomic_write_text
from autotm_py.ir import Role
from autotm_py.plan import (
    Compute,
    CostsIdentity,
    Free,
    ModelOptions,
    Move,
    Plan,
    PlanHeader,
    SolverStats,
    names_table,
)
from tests.synthetic import chain, diamond, random_dag

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "julia" / "AutoTMBridge" / "test" / "fixtures"
PLAN_FIXTURE = FIXTURES / "plan_small.json"
EXPECTED_FIXTURE = FIXTURES / "plan_small.expected.json"
REGENERATE = "regenerate with `python -m tests.test_julia_schema`"


def load_schema() -> dict[str, Any]:
    """The schema as shipped in the package (package data, not a repo path)."""
    text = resources.files("autotm_py").joinpath("schemas/plan.schema.json").read_text()
    return json.loads(text)


def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(load_schema())


def strict_json(text: str) -> Any:
    """Parse as standard JSON: NaN/Infinity (which Python's json writes) are errors."""
    def reject(name: str) -> Any:
        raise ValueError(f"plan JSON contains {name}, which is not standard JSON")
    return json.loads(text, parse_constant=reject)


def fixture_plan() -> Plan:
    """A hand-built host-mode plan of `diamond()`: a sync prefetch, an async offload that
    overlaps kernel 1, a kernel reading one input from the slow tier, and frees."""
    graph = diamond()
    header = PlanHeader(
        model_hash=graph.model_hash, model_name=graph.name, strategy="async",
        budget_bytes=12288, memory_system={"name": "optane", "mode": "host"},
        predicted_time_s=0.00123,
        solver=SolverStats(solver="cbc", status="optimal", objective_s=0.00123, gap=0.0,
                           variables=42, constraints=17, build_s=0.01, solve_s=0.02),
        graph_summary={"kernels": 3, "tensors": 4}, counts={"moves": 2, "frees": 4},
        config={"strategy": "async", "ratio": "1:2"},
        notes=("hand-built fixture for the AutoTMBridge tests",), device="cpu",
        model=ModelOptions(batch=4, dims={"N": 4}, training=False, optimizer=None),
        costs=CostsIdentity("0123456789abcdef", kernels=3, estimated=1, scaled=0,
                            total_s=0.00096))
    records = (
        Move(0, "fast", "sync"),
        Compute(0, ("fast", "fast")),
        Move(1, "slow", "async", overlaps=1),
        Compute(1, ("fast", "fast")),
        Free(1, "fast"),
        Free(0, "fast"),
        Compute(2, ("slow", "fast", "fast")),
        Free(1, "slow"),
        Free(2, "fast"),
    )
    plan = Plan(header, {0: ("slow",)}, records, names_table(graph))
    return plan.with_arena(_fixture_arena(graph, plan))


def _fixture_arena(graph, plan: Plan):
    """The fixture's fast copies packed into an arena (as `autotm optimize --arena` does)."""
    from autotm_py.arena import pack
    from autotm_py.costs import KernelCosts
    from autotm_py.machine import MachineModel
    from autotm_py.memory.tiers import preset

    costs = KernelCosts.from_times("cpu", [1e-3] * len(graph.kernels))
    return pack(MachineModel(graph, preset("optane").with_budget(12288), costs), plan)


def fixture_expected(plan: Plan) -> dict[str, Any]:
    """What the Julia tests must find in the fixture, computed on the Python side."""
    sizes = {row[0]: row[2] for row in plan.names["tensors"]}
    moved = {tier: sum(sizes[m.tensor] for m in plan.moves() if m.to == tier)
             for tier in ("fast", "slow")}
    return {
        "model_hash": plan.header.model_hash,
        "model_name": plan.header.model_name,
        "device": plan.header.device,
        "batch": plan.header.model.batch if plan.header.model else None,
        "costs_digest": plan.header.costs.digest if plan.header.costs else None,
        "ops": [type(r).__name__.lower() for r in plan.records],
        "n_records": len(plan.records),
        "bytes_moved": moved["fast"] + moved["slow"],
        "bytes_moved_to_fast": moved["fast"],
        "bytes_moved_to_slow": moved["slow"],
        "tensor_names": {str(row[0]): row[1] for row in plan.names["tensors"]},
        "kernel_names": {str(row[0]): row[1] for row in plan.names["kernels"]},
        "kernel_io": {str(k): io for k, io in enumerate(plan.names["kernel_io"])},
        "initial": plan.to_dict()["initial"],
        "placements": [list(r.placement) for r in plan.computes()],
        "graph": plan.header.graph,
        "arena_bytes": plan.arena.nbytes if plan.arena else None,
        "arena_scratch_offset": plan.arena.scratch_offset if plan.arena else None,
        "arena_offsets": [[b.record, b.tensor, b.offset] for b in plan.arena.buffers]
        if plan.arena else [],
    }


def write_fixtures() -> None:
    plan = fixture_plan()
    atomic_write_text(PLAN_FIXTURE, plan.to_json(indent=1) + "\n")
    atomic_write_text(EXPECTED_FIXTURE, json.dumps(fixture_expected(plan), indent=1) + "\n")


# ---- the schema itself ------------------------------------------------------------------------
def test_schema_is_valid_draft_2020_12() -> None:
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


# Header fields added within format 2: plans written before them lack them (readers default).
OPTIONAL_HEADER_FIELDS = {"graph"}


def test_schema_header_fields_are_the_dataclass_fields() -> None:
    defs = load_schema()["$defs"]
    header_fields = {f.name for f in dataclasses.fields(PlanHeader)}
    solver_fields = {f.name for f in dataclasses.fields(SolverStats)}
    assert set(defs["header"]["properties"]) == header_fields
    assert set(defs["header"]["required"]) == header_fields - OPTIONAL_HEADER_FIELDS
    assert set(defs["solver"]["properties"]) == solver_fields
    assert set(defs["solver"]["required"]) == solver_fields
    for name, cls in (("modelOptions", ModelOptions), ("costsIdentity", CostsIdentity)):
        fields = {f.name for f in dataclasses.fields(cls)}
        assert set(defs[name]["properties"]) == fields
        assert set(defs[name]["required"]) == fields


def test_schema_roles_are_the_ir_roles() -> None:
    row = load_schema()["$defs"]["names"]["properties"]["tensors"]["items"]["prefixItems"]
    assert set(row[3]["enum"]) == {r.value for r in Role}


# ---- real plans satisfy it --------------------------------------------------------------------
def test_hand_built_plan_is_valid() -> None:
    plan = fixture_plan()
    plan.validate(diamond())
    validator().validate(strict_json(plan.to_json()))


@pytest.mark.parametrize("seed", range(4))
def test_plans_of_random_graphs_are_valid(seed: int) -> None:
    """An all-fast schedule with a sync offload after each kernel, over random DAGs."""
    graph = random_dag(seed, n_kernels=6)
    records: list[Any] = []
    for k in graph.kernels:
        records.append(Compute(k.id, ("fast",) * len(k.io)))
        records += [Move(t, "slow", "sync") for t in k.outputs]
    header = PlanHeader(model_hash=graph.model_hash, model_name=graph.name, strategy="sync",
                        budget_bytes=None, memory_system={})
    initial = {t.id: ("fast", "slow") for t in graph.tensors if t.producer is None}
    plan = Plan(header, initial, tuple(records), names_table(graph))
    plan.validate(graph)
    validator().validate(strict_json(plan.to_json()))


def test_plan_without_names_is_valid() -> None:
    graph = chain(2)
    header = PlanHeader(model_hash=graph.model_hash, model_name=graph.name, strategy="static",
                        budget_bytes=0, memory_system={"mode": "gpu"})
    plan = Plan(header, {}, (Compute(0, ("fast", "fast")), Compute(1, ("fast", "fast"))))
    plan.validate(graph)
    validator().validate(strict_json(plan.to_json()))


def test_optimized_plan_is_valid() -> None:
    """A plan from the real planner, once `autotm_py.planning.solve` is part of the tree."""
    pytest.importorskip("autotm_py.planning.solve")
    from autotm_py import api
    from autotm_py.config import PlanConfig

    graph = chain(4)
    result = api.optimize(graph, PlanConfig(strategy="sync", fast_mem_bytes=3 * 4096))
    validator().validate(strict_json(result.plan.to_json()))


# ---- it rejects broken plans ------------------------------------------------------------------
def _break(path: list[Any], value: Any = None, *, delete: bool = False):
    def mutate(doc: dict[str, Any]) -> dict[str, Any]:
        doc = copy.deepcopy(doc)
        target = doc
        for key in path[:-1]:
            target = target[key]
        if delete:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return doc
    return mutate


BROKEN = {
    "wrong format": _break(["format"], "other"),
    "future version": _break(["format_version"], 2),
    "missing header field": _break(["header", "model_hash"], delete=True),
    "unknown header field": _break(["header", "surprise"], 1),
    "solver status not a string": _break(["header", "solver", "status"], 3),
    "bad tier code in initial": _break(["initial", "0"], "X"),
    "non-id initial key": _break(["initial", "x0"], "F"),
    "unknown op": _break(["records", 0, "op"], "swap"),
    "move to a third tier": _break(["records", 0, "to"], "disk"),
    "async move without overlaps": _break(["records", 2, "overlaps"], delete=True),
    "negative kernel id": _break(["records", 1, "kernel"], -1),
    "bad placement code": _break(["records", 1, "placement"], "FX"),
    "free without tier": _break(["records", 4, "tier"], delete=True),
    "extra record field": _break(["records", 4, "bytes"], 4),
    "role outside the IR": _break(["names", "tensors", 0, 3], "scratch"),
    "short tensor row": _break(["names", "tensors", 0], [0, "x"]),
    "missing records": _break(["records"], delete=True),
    "graph not a boolean": _break(["header", "graph"], "yes"),
    "arena without buffers": _break(["arena", "buffers"], delete=True),
    "short arena row": _break(["arena", "buffers", 0], [0, 1, 2]),
    "arena record below -1": _break(["arena", "buffers", 0, 0], -2),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_schema_rejects_broken_plans(name: str) -> None:
    doc = BROKEN[name](fixture_plan().to_dict())
    assert not validator().is_valid(doc), f"schema accepted a plan with {name}"


# ---- the Julia fixture is what Python writes today -------------------------------------------
def test_julia_fixture_matches_python_output() -> None:
    committed = strict_json(PLAN_FIXTURE.read_text())
    written = json.loads(fixture_plan().to_json())
    assert committed == written, f"{PLAN_FIXTURE} drifted from Python; {REGENERATE}"
    validator().validate(committed)
    assert Plan.from_json(PLAN_FIXTURE.read_text()) == fixture_plan()


def test_julia_expected_values_match_python() -> None:
    committed = json.loads(EXPECTED_FIXTURE.read_text())
    assert committed == fixture_expected(fixture_plan()), f"{EXPECTED_FIXTURE}: {REGENERATE}"
    assert committed["bytes_moved"] == 2 * 4096  # one prefetch and one offload of 1024 floats


if __name__ == "__main__":
    write_fixtures()
    print(f"wrote {PLAN_FIXTURE} and {EXPECTED_FIXTURE}")
