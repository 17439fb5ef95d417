"""Bytes an arena run copies into planned slots per iteration, by op (CPU, no profiles needed).

In an arena run every output that torch allocates (no `out=` kernel writes it in place,
`memory.scratch.allocated_outputs`) is copied into its slot; a replay in an arena pays those
copies, a replay with static inputs does not (docs/gpu.md, "Scratch"). The benchmark models at
their benchmark shapes, training with SGD, the fused graphs:

    python experiments/slot_copies.py [--models resnet200,densenet264,...] [--top 6]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotm_py import api
from autotm_py.memory.scratch import allocated_outputs

SHAPES = {"resnet200": (32, {}), "densenet264": (32, {}), "inception_v4": (64, {}),
          "bert_base": (16, {"seq": 512}), "gpt2_small": (8, {"seq": 1024}), "vgg19": (64, {})}


def copied_bytes(model: str) -> collections.Counter[str]:
    batch, dims = SHAPES[model]
    graph = api.load_model(model, batch=batch, dims=dims, training=True)
    by_op: collections.Counter[str] = collections.Counter()
    for kernel in graph.kernels:
        for t in allocated_outputs(graph, kernel):
            by_op[kernel.op_type] += graph.tensors[t].nbytes
    return by_op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SHAPES))
    parser.add_argument("--top", type=int, default=6)
    args = parser.parse_args()
    for model in args.models.split(","):
        by_op = copied_bytes(model)
        ops = ", ".join(f"{op} {b / 1e9:.2f}" for op, b in by_op.most_common(args.top) if b)
        print(f"{model}: {sum(by_op.values()) / 1e9:.1f} GB ({ops})")


if __name__ == "__main__":
    main()
