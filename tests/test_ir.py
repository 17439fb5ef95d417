import dataclasses

import numpy as np
import pytest

from autotm_py.errors import GraphError
from autotm_py.ir import GraphBuilder, Role
from tests.synthetic import chain, diamond, random_dag


def test_chain_liveness_and_peak():
    g = chain(4, size=256)  # 1 KiB per tensor
    assert [k.id for k in g.kernels] == [0, 1, 2, 3]
    assert g.live_ranges[0] == (0, 0)  # input dies after first use
    assert g.live_ranges[4] == (3, 3)  # output survives to the end (last kernel)
    assert g.live_bytes.tolist() == [2048, 2048, 2048, 2048]
    assert g.peak_live_bytes == 2048
    assert g.max_working_set == (2048, 0)


def test_diamond_users_and_working_set():
    g = diamond(256)
    x = g.by_name("x")
    assert x.users == (0, 1)
    assert g.live_bytes.tolist() == [2048, 3072, 3072]
    assert g.working_set_bytes.tolist() == [2048, 2048, 3072]


def test_weights_persist_unless_replaced():
    b = GraphBuilder("w")
    x = b.add_tensor("x", (4,), "float32", Role.INPUT)
    w = b.add_tensor("w", (4,), "float32", Role.WEIGHT)
    y = b.add_tensor("y", (4,), "float32", Role.OUTPUT)
    z = b.add_tensor("z", (4,), "float32", Role.ACTIVATION)
    b.add_kernel("Mul", [x, w], [y])
    b.add_kernel("Relu", [y], [z])
    b.outputs += [y]
    g = b.build()
    assert g.live_ranges[w] == (0, 1)  # weight persists to the end
    b2 = GraphBuilder("w2")
    x = b2.add_tensor("x", (4,), "float32", Role.INPUT)
    w = b2.add_tensor("w", (4,), "float32", Role.WEIGHT)
    w2 = b2.add_tensor("w_new", (4,), "float32", Role.WEIGHT)
    y = b2.add_tensor("y", (4,), "float32", Role.OUTPUT)
    b2.add_kernel("Mul", [x, w], [y])
    b2.add_kernel("SGDUpdate", [w, y], [w2], domain="autotm")
    b2.add_kernel("Relu", [y], [b2.add_tensor("z", (4,), "float32", Role.OUTPUT)])
    b2.carried.append((w, w2))
    b2.outputs += [w2, y]
    g2 = b2.build()
    assert g2.live_ranges[w] == (0, 1)
    assert g2.live_ranges[w2] == (1, 2)


def test_frozen_and_hash_stable():
    g = diamond()
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.kernels[0].op_type = "Tanh"  # type: ignore[misc]
    assert diamond().model_hash == g.model_hash
    assert diamond(size=512).model_hash != g.model_hash


def test_identical_kernels_share_signature():
    g = chain(5)
    assert g.unique_signatures == 1


def test_validate_names_the_problem():
    b = GraphBuilder("bad")
    x = b.add_tensor("x", (4,), "float32", Role.INPUT)
    y = b.add_tensor("y", (4,), "float32", Role.ACTIVATION)
    b.add_kernel("Relu", [y], [x])  # reads y, never produced, writes the input
    b.add_kernel("Relu", [x], [y])  # cycle: y produced after it is read
    with pytest.raises(GraphError, match="before its producer"):
        b.build()


def test_double_producer_rejected():
    b = GraphBuilder("bad")
    x = b.add_tensor("x", (4,), "float32", Role.INPUT)
    y = b.add_tensor("y", (4,), "float32", Role.ACTIVATION)
    b.add_kernel("Relu", [x], [y])
    with pytest.raises(GraphError, match="produced twice"):
        b.add_kernel("Relu", [x], [y])


@pytest.mark.parametrize("seed", range(5))
def test_live_bytes_matches_bruteforce(seed):
    g = random_dag(seed, n_kernels=10)
    for k in range(len(g.kernels)):
        expect = sum(g.tensors[t].nbytes for t in g.live_at(k))
        assert g.live_bytes[k] == expect
    assert isinstance(g.live_bytes, np.ndarray)
