"""A user's model trained through `autotm_py.Trainer` under a budget, beside what a PyTorch user
runs for it, in one process (issue 44 item 6).

For each budget (a share of one iteration's peak, the Trainer's graph's): the Trainer's steps
(default run mode: an arena, the placed allocator, CUDA-graph replay) and plain PyTorch eager
steps of a copy of the same module on the same batches, uncapped (the loss curves compared, the
step times side by side); with `--native`, also PyTorch activation checkpointing
(`checkpoint_sequential`, fewest segments that fit) and torch.compile with
`activation_memory_budget`, under the same cap, timed by experiments/gpu/native_compare.py.

Usage (GPU machine, repository root, the wheels of setup.sh carried):
    python3 experiments/gpu/trainer_bench.py OUT.json --model resnet50 --batch 64 \
        --shares 0.5,0.25 --steps 50 [--native] [--compile 0.5]
    --model tiny (an MLP; --device cpu works): the script's own check
Models: torchvision's ResNet-50 (channels-last), an in-code GPT-2 small (12 layers, 768 wide,
tied embeddings, `scaled_dot_product_attention`; --seq), tiny. SGD with momentum 0.9, lr 0.01.
Step times: the median over the steps after the first three (each step waits for its loss).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotm_py.trainer import Trainer  # noqa: E402


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT2(nn.Module):
    """GPT-2 small as a torch user writes it: token and position embeddings, 12 blocks, the
    output layer tied to the token embedding."""

    def __init__(self, vocab: int = 50257, dim: int = 768, layers: int = 12, heads: int = 12,
                 seq: int = 1024) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens):
        x = self.emb(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def lm_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def model_and_data(name: str, batch: int, seq: int, steps: int):
    """(module, loss function, batches on the CPU, memory format), seeded."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if name == "resnet50":
        import torchvision

        net = torchvision.models.resnet50().to(memory_format=torch.channels_last)
        data = [(torch.randn(batch, 3, 224, 224, generator=gen)
                 .contiguous(memory_format=torch.channels_last),
                 torch.randint(0, 1000, (batch,), generator=gen)) for _ in range(steps)]
        return net, F.cross_entropy, data
    if name == "gpt2":
        net = GPT2(seq=seq)
        tokens = [torch.randint(0, 50257, (batch, seq + 1), generator=gen) for _ in range(steps)]
        return net, lm_loss, [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                        nn.Linear(256, 10))
    data = [(torch.randn(batch, 64, generator=gen), torch.randint(0, 10, (batch,),
                                                                    generator=gen))
            for _ in range(steps)]
    return net, F.cross_entropy, data


def sgd(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def timed_steps(step, data) -> tuple[list[float], list[float]]:
    """(each step's loss, each step's seconds): a step ends when its loss is read."""
    losses, seconds = [], []
    for x, y in data:
        start = time.perf_counter()
        losses.append(float(step(x, y)))
        seconds.append(time.perf_counter() - start)
    return losses, seconds


def ours(net, loss_fn, data, share: float, device: str, time_limit: float) -> dict[str, Any]:
    part = Fraction(share).limit_denominator(100)  # 0.25 -> 1/4 -> fast:slow 1:3
    ratio = f"{part.numerator}:{part.denominator - part.numerator}"
    opt = sgd(net.parameters())
    trainer = Trainer(net, opt, loss_fn, example=data[0], ratio=ratio, device=device,
                      time_limit_s=time_limit, plans_dir=tempfile.mkdtemp())
    losses, seconds = timed_steps(trainer.step, data)
    plan = trainer.plan
    return {"losses": losses, "step_s": statistics.median(seconds[3:]),
            "budget_bytes": plan.header.budget_bytes, "peak_bytes": trainer.graph.peak_live_bytes,
            "predicted_s": plan.header.predicted_time_s, "status": plan.header.solver.status,
            "moves": sum(1 for _ in plan.moves()), "recomputes": sum(1 for _ in plan.recomputes()),
            "replayed": bool(trainer.loop.driver.replayed), "notes": trainer.notes}


def eager(net, loss_fn, data, device: str) -> dict[str, Any]:
    """Plain PyTorch, uncapped: what the loss curves are compared with."""
    net = net.to(device).train()
    opt = sgd(net.parameters())

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        return loss.detach()

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    losses, seconds = timed_steps(step, data)
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    return {"losses": losses, "step_s": statistics.median(seconds[3:]), "peak_bytes": peak}


def natives(name: str, batch: int, seq: int, cap: int, compile_fractions) -> dict[str, Any]:
    """PyTorch's own options under the same cap (experiments/gpu/native_compare.py)."""
    sys.path.insert(0, str(ROOT / "experiments" / "gpu"))
    import native_compare as nc

    zoo = {"resnet50": "resnet50", "gpt2": "gpt2_small"}[name]
    nc.CHANNELS_LAST = name == "resnet50"
    dims = {"seq": seq} if name == "gpt2" else {}
    out = {"checkpoint": nc.measure_native(zoo, batch, dims, 10, budget=cap)}
    if compile_fractions:
        out["compile"] = nc.measure_compiled(zoo, batch, dims, 10, cap, compile_fractions)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--model", default="resnet50", choices=("resnet50", "gpt2", "tiny"))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--shares", default="0.5,0.25")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--device", default="cuda")
    p.add_argument("--time-limit", type=float, default=120.0)
    p.add_argument("--native", action="store_true")
    p.add_argument("--compile", default="", help="activation_memory_budget values to try")
    args = p.parse_args(argv)
    net, loss_fn, data = model_and_data(args.model, args.batch, args.seq, args.steps)
    rows = []
    for share in (float(s) for s in args.shares.split(",")):
        row = {"model": args.model, "batch": args.batch, "share": share,
               "ours": ours(copy.deepcopy(net), loss_fn, data, share, args.device,
                            args.time_limit),
               "eager": eager(copy.deepcopy(net), loss_fn, data, args.device)}
        worst = max(abs(a - b) / abs(b) for a, b in zip(row["ours"]["losses"],
                                                         row["eager"]["losses"], strict=True))
        row["loss_max_rel_diff"] = worst
        if args.native:
            fractions = [float(f) for f in args.compile.split(",") if f]
            row["native"] = natives(args.model, args.batch, args.seq,
                                    row["ours"]["budget_bytes"], fractions)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("ours", "eager")}
                         | {"ours_s": row["ours"]["step_s"], "eager_s": row["eager"]["step_s"]}))
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
