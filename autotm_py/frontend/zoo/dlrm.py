"""DLRM (Naumov et al. 2019) in its Criteo Kaggle configuration, as in AutoTM's zoo/dlrm.jl.

13 dense features through the bottom MLP [13, 512, 256, 64, 16] (ReLU after every layer); 26
categorical features, one index each, looked up in 26 tables of 16-wide embeddings (Gather:
with one index per bag, EmbeddingBag is a plain lookup). The dot interaction stacks the 27
16-vectors, takes all pairwise dot products (a batched MatMul), keeps the 351 distinct pairs
(strict lower triangle, as the reference implementation) and concatenates them after the
dense vector: 16 + 351 = 367 features into the top MLP [367, 512, 256, 2].

Two decisions, both in docs/zoo.md: the top MLP ends in *two* logits (no click/no-click) instead
of one sigmoid logit, so the softmax cross-entropy that the training derivation appends is the
usual logistic loss (softmax over two logits is a sigmoid of their difference); and the table
sizes are the Kaggle ones (AutoTM multiplied them by 5: `table_scale=5`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import onnx

from autotm_py.frontend.zoo.layers import FLOAT, INT64, NetBuilder, gemm

# Rows of the 26 Criteo Kaggle tables (category counts + 1), the list AutoTM's zoo used.
KAGGLE_TABLES: tuple[int, ...] = (
    1461, 586, 10131227, 2202608, 306, 24, 12518, 634, 4, 93146, 5684, 8351593, 3195, 28,
    14993, 5461306, 11, 5653, 2173, 4, 7046547, 18, 16, 286181, 105, 142572)
EMBED_DIM = 16
BOTTOM_MLP = (13, 512, 256, 64, 16)
TOP_HIDDEN = (512, 256)
CLASSES = 2


def _mlp(b: NetBuilder, x: str, sizes: Sequence[int], name: str, last_relu: bool) -> str:
    for i, (fin, fout) in enumerate(pairwise(sizes)):
        x = gemm(b, x, fin, fout, name=f"{name}.{i}")
        if last_relu or i < len(sizes) - 2:
            x = b.op("Relu", x)
    return x


def _lookups(b: NetBuilder, sparse: str, tables: Sequence[int]) -> list[str]:
    """One (batch, 1, 16) embedding per table, from column i of the (batch, 26) indices."""
    columns = b.op_multi("Split", sparse, b.const([1] * len(tables)), outputs=len(tables),
                         axis=1)
    out = []
    for i, (rows, column) in enumerate(zip(tables, columns, strict=True)):
        with b.scope(f"emb.{i}"):
            out.append(b.op("Gather", b.weight("weight", (rows, EMBED_DIM)), column, axis=0))
    return out


def pair_indices(n: int) -> np.ndarray:
    """Flat indices i * n + j of the pairs j < i of an n x n matrix, row by row."""
    return np.array([i * n + j for i in range(n) for j in range(i)], dtype=np.int64)


def _interact(b: NetBuilder, dense: str, embedded: Sequence[str]) -> str:
    stacked = b.op("Concat", b.op("Unsqueeze", dense, b.const([1])), *embedded, axis=1)
    dots = b.op("MatMul", stacked, b.op("Transpose", stacked, perm=[0, 2, 1]))  # (b, 27, 27)
    flat = b.op("Reshape", dots, b.const([0, -1]))
    pairs = b.op("Gather", flat, b.const(pair_indices(len(embedded) + 1)), axis=1)
    return b.op("Concat", dense, pairs, axis=1)


def dlrm(batch: int, table_scale: int = 1) -> onnx.ModelProto:
    tables = tuple(rows * table_scale for rows in KAGGLE_TABLES)
    b = NetBuilder("dlrm")
    dense_in = b.add_input("dense", FLOAT, ["batch", BOTTOM_MLP[0]])
    sparse_in = b.add_input("sparse", INT64, ["batch", len(tables)])
    dense = _mlp(b, dense_in, BOTTOM_MLP, "bot_mlp", last_relu=True)
    z = _interact(b, dense, _lookups(b, sparse_in, tables))
    pairs = (len(tables) + 1) * len(tables) // 2
    top = (EMBED_DIM + pairs, *TOP_HIDDEN, CLASSES)
    b.add_output(_mlp(b, z, top, "top_mlp", last_relu=False), "logits", ["batch", CLASSES])
    doc = f"DLRM, Criteo Kaggle tables x{table_scale}, dot interaction, two-class logits"
    return b.build({"batch": batch}, doc, {"sparse": list(tables)})
