"""Hand-made plans for the report tests (no solver needed). Holds no tests itself."""

from __future__ import annotations

from autotm_py.ir import GraphBuilder, Role, TensorGraph
from autotm_py.memory.tiers import preset
from autotm_py.plan import Compute, Free, Move, Plan, PlanHeader, names_table

KIB = 1024


def skip_graph() -> TensorGraph:
    """x -> a -> b -> c, then d = a + c: `a` is needed again late, so a plan may evict it."""
    g = GraphBuilder("skip")
    x = g.add_tensor("x", (256,), "float32", Role.INPUT)
    a = g.add_tensor("a", (512,), "float32", Role.ACTIVATION)
    b = g.add_tensor("b", (256,), "float32", Role.ACTIVATION)
    c = g.add_tensor("c", (512,), "float32", Role.ACTIVATION)
    d = g.add_tensor("d", (512,), "float32", Role.OUTPUT)
    g.inputs.append(x)
    g.add_kernel("Relu", [x], [a], name="k0")
    g.add_kernel("Relu", [a], [b], name="k1")
    g.add_kernel("Relu", [b], [c], name="k2")
    g.add_kernel("Add", [a, c], [d], name="k3")
    g.outputs.append(d)
    return g.build()


def skip_plan(graph: TensorGraph, *, mode: str = "async", budget: int = 6 * KIB) -> Plan:
    """Evict `a` (2 KiB) after k0, bring it back before k3; free each tensor after its last use."""
    x, a, b, c, _d = range(5)

    def move(t: int, to: str, over: int) -> Move:
        return Move(t, to, mode, over if mode == "async" else None)

    records = (
        Compute(0, ("fast", "fast")), Free(x, "fast"),
        move(a, "slow", 1), Compute(1, ("fast", "fast")), Free(a, "fast"),
        move(a, "fast", 2), Compute(2, ("fast", "fast")), Free(b, "fast"),
        Compute(3, ("fast", "fast", "fast")), Free(a, "fast"), Free(a, "slow"), Free(c, "fast"),
    )
    header = PlanHeader(model_hash=graph.model_hash, model_name=graph.name, strategy="sync",
                        budget_bytes=budget,
                        memory_system=preset("h100-pcie5").with_budget(budget).to_dict(),
                        predicted_time_s=1e-3)
    return Plan(header, {x: ("fast",)}, records, names_table(graph))


def simulation_dict() -> dict:
    """A simulator-shaped result for `skip_plan` (async), written out by hand for the tests."""
    ms = 1e-3
    return {
        "kernels": [{"kernel": k, "start_s": s * ms, "end_s": e * ms}
                    for k, (s, e) in enumerate([(0, 1), (1, 2), (2, 3), (3.5, 4.5)])],
        "moves": [
            {"record": 2, "tensor": 1, "to": "slow", "mode": "async", "start_s": 1 * ms,
             "end_s": 1.8 * ms, "bytes": 2 * KIB},
            {"record": 5, "tensor": 1, "to": "fast", "mode": "async", "start_s": 2 * ms,
             "end_s": 3.5 * ms, "bytes": 2 * KIB},
        ],
        "memory": {"time_s": [0, 1 * ms, 1.8 * ms, 2 * ms, 3 * ms, 4.5 * ms],
                   "fast_bytes": [3 * KIB, 3 * KIB, 1 * KIB, 5 * KIB, 4 * KIB, 2 * KIB],
                   "slow_bytes": [0, 2 * KIB, 2 * KIB, 2 * KIB, 2 * KIB, 0]},
        "total_s": 4.5 * ms,
    }


def tiny_onnx(path, hidden: int = 256, layers: int = 4) -> str:
    """A small MLP as an ONNX file (Gemm + Relu layers), for end-to-end tests."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    prev = "x"
    for i in range(layers):
        w = numpy_helper.from_array(np.zeros((hidden, hidden), np.float32), f"w{i}")
        inits.append(w)
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}"], [f"g{i}"], name=f"gemm{i}"))
        nodes.append(helper.make_node("Relu", [f"g{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes, "tiny_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, hidden])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [64, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return str(path)
