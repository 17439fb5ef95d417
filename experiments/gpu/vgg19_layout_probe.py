"""Why torch.compile runs VGG19 b64 in 3.8 GB where our plans hold a 1.53 GiB cuDNN workspace.
torchvision VGG19, one SGD training step, timed and its peak measured: eager NCHW and eager
channels-last (uncapped and under a cap), and torch.compile with `activation_memory_budget`
with and without inductor's layout optimization (which converts convolutions to
channels-last) under the same cap.

    for case in 0 1 2 3 4 5 6; do
        python3 experiments/gpu/vgg19_layout_probe.py OUT_DIR/case$case.json --case $case
    done

A process of its own per case, since torch keeps the cuDNN engine it first chose for a shape
(the first whose workspace it could allocate) for the life of the process. The default budget
is our VGG19 plan's at 80% of its peak (4:1, as native_compare.py computes it); the cap adds
64 MiB to it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gpu"))

import native_compare as nc  # noqa: E402


def eager_step(channels_last: bool):
    """native_compare's eager SGD step, the model and its images channels-last if asked."""
    net, make, loss = nc.native_model("vgg19", 64, {})
    net = net.to(nc.DEV).train()
    if channels_last:
        net = net.to(memory_format=torch.channels_last)

        def make_channels_last():
            images, labels = make()
            return images.contiguous(memory_format=torch.channels_last), labels
        return nc.native_step("vgg19", net, make_channels_last, loss, None)
    return nc.native_step("vgg19", net, make, loss, None)


def compiled_step(layout_optimization: bool, fraction: float):
    import torch._dynamo
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    torch._dynamo.reset()
    functorch_config.activation_memory_budget = fraction
    inductor_config.layout_optimization = layout_optimization
    return nc.compiled_step(*nc.native_model("vgg19", 64, {}))


def measure(label, make_step, cap_bytes):
    torch.cuda.empty_cache()
    cap = nc.apply_cap(cap_bytes, nc.DEV, cap_bytes is not None, nc.SLACK)
    try:
        step = make_step()
        row = nc.measure_step(step, 7)
        row.pop("times_s")
    except torch.OutOfMemoryError:
        row = {"median_s": None, "out_of_memory": True}
    finally:
        if cap is not None:
            nc.release_cap(nc.DEV)
        torch.cuda.empty_cache()
    row.update(label=label, cap=cap)
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--cap-bytes", type=int, default=4328072860)
    parser.add_argument("--case", type=int, required=True, help="0-6: which run (below)")
    args = parser.parse_args()
    nc.configure_cuda(deterministic=False)
    cap = args.cap_bytes
    cases = [("eager NCHW uncapped", lambda: eager_step(False), None),
             ("eager channels-last uncapped", lambda: eager_step(True), None),
             ("eager NCHW capped", lambda: eager_step(False), cap),
             ("eager channels-last capped", lambda: eager_step(True), cap),
             ("compile 0.5 layout-opt capped", lambda: compiled_step(True, 0.5), cap),
             ("compile 0.5 no-layout-opt capped", lambda: compiled_step(False, 0.5), cap),
             ("compile 1.0 layout-opt uncapped", lambda: compiled_step(True, 1.0), None)]
    row = measure(*cases[args.case])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "cap_bytes": cap,
                                    "row": row}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
