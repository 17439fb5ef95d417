"""Why does the bf16 Trainer's first loss on CUDA sit nearer fp32 training's than native
autocast's (tests/test_precision_gpu.py, the MLP and the LM, the H200 2026-12-04), where on the
CPU it equals autocast's bitwise? The Trainer's bf16 graph of a test model (built on the CPU),
its forward kernels run one by one with `run_kernel` on DEVICE from the module's weights and
the first batch: each kernel's output dtype beside the graph's, the first kernels whose value
differs between the CPU and DEVICE by more than bf16 rounding, and the loss beside the module's
under torch.autocast(DEVICE, bf16) and in fp32.

Usage: python3 experiments/gpu/bf16_dtype_probe.py [mlp|lm|cnn] [--device cuda] > OUT.txt
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotm_py.runtime.reference import init_values, run_kernel  # noqa: E402
from autotm_py.trainer import Trainer  # noqa: E402
from tests.test_trainer import MODELS, OPTIMIZERS, batches  # noqa: E402


def forward_values(graph, masters: dict, device: str) -> dict:
    env = {t: v.to(device) for t, v in masters.items()}
    for k in graph.kernels[: graph.meta["training"]["forward_kernels"]]:
        env.update(zip(k.outputs, run_kernel(k, [env[t] for t in k.inputs]), strict=True))
    return env


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="mlp", choices=sorted(MODELS))
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    make, loss_fn = MODELS[args.model]
    torch.manual_seed(0)
    module = make()
    x, y = batches(args.model, 1, scale=16 if args.device == "cuda" else 1)[0]
    ours = copy.deepcopy(module)
    trainer = Trainer(ours, OPTIMIZERS["adamw"](ours.parameters()), loss_fn, example=(x, y),
                      ratio="1:0", device="cpu", precision="bf16", plans_dir=tempfile.mkdtemp())
    graph = trainer.graph
    masters = trainer.map.masters(graph, init_values(graph))
    masters.update(trainer._batch_masters(trainer.example))
    cpu = forward_values(graph, masters, "cpu")
    dev = forward_values(graph, masters, args.device)
    shown = 0
    for k in graph.kernels[: graph.meta["training"]["forward_kernels"]]:
        for t in k.outputs:
            want = graph.tensors[t].dtype
            a, b = cpu[t], dev[t].cpu()
            diff = (float((a.double() - b.double()).abs().max() / a.double().abs().max()
                          .clamp(min=1e-30)) if a.is_floating_point() and a.numel() else 0.0)
            odd = str(b.dtype) != f"torch.{want}" or str(a.dtype) != str(b.dtype)
            if odd or diff > 4e-3 or shown < 40:
                print(f"{k.op_type:<24} {graph.name_of(t)[:40]:<40} graph {want:<9} cpu "
                      f"{str(a.dtype)[6:]:<9} {args.device} {str(b.dtype)[6:]:<9} "
                      f"max rel diff {diff:.2e}{'  <--' if odd else ''}")
                shown += 1
    loss = graph.meta["training"]["loss"]
    net = copy.deepcopy(module).to(args.device)
    xd, yd = x.to(args.device), y.to(args.device)
    with torch.no_grad(), torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16):
        auto = float(loss_fn(net(xd), yd))
    with torch.no_grad():
        fp32 = float(loss_fn(net(xd), yd))
    print(f"loss: ours cpu {float(cpu[loss]):.7f}, ours {args.device} {float(dev[loss]):.7f}, "
          f"autocast {args.device} {auto:.7f}, fp32 {args.device} {fp32:.7f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
