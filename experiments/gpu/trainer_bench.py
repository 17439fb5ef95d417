"""A user's model trained through `autotm_py.Trainer` under a budget, beside what a PyTorch user
runs for it (issue 44 item 6).

Plain PyTorch eager steps of a copy of the module on the same batches, uncapped (what the loss
curves are compared with); then for each budget (a share of one iteration's peak, the Trainer's
graph's; 1 = all fast, no budget) the Trainer's steps (its default run mode on a GPU: an arena
at planned addresses, replayed as a CUDA graph); with `--native`, PyTorch activation
checkpointing of the same module under the same cap (budget + 64 MiB: ResNet-50 by
`checkpoint_sequential` at the fewest segments that fit, GPT-2 every block) and, with
`--compile F1,F2`, torch.compile of the same module with `activation_memory_budget` at each
fraction (compiled once per fraction, run under every cap). Results are written after each
piece, so a run cut short keeps what it measured.

The Trainer's default GPU mode lets kernels allocate their outputs at their planned slots (the
placed allocator), installed here before CUDA starts, with a region of `--region` bytes (a
budget: what does not fit is reported as overflow) or the GPU's free memory. The eager steps then
run on it too, and caps do not work in such a process: the native options and the eager
reference run in a second process (`--native --caps-from` this result). `--copies`: the Trainer
on torch's allocator, its outputs copied into their slots (a Trainer made after CUDA started).

Usage (GPU machine, repository root, the wheels of setup.sh carried):
    python3 experiments/gpu/trainer_bench.py OUT.json --model resnet50 --batch 64 \
        --shares 1,0.5,0.25 --steps 50 [--loss-chunks 16] [--copies]
    python3 experiments/gpu/trainer_bench.py OURS.json --shares 0.5 --region BYTES ...
    python3 experiments/gpu/trainer_bench.py NATIVE.json --caps-from OURS.json [MORE.json] \
        --native [--compile 0.5,0.1] ...
    --model tiny (an MLP; --device cpu works): the script's own check
Models: torchvision's ResNet-50 (channels-last), an in-code GPT-2 small (12 layers, 768 wide,
tied embeddings, `scaled_dot_product_attention`; --seq), tiny. SGD with momentum 0.9, lr 0.01.
Step times: the median over the steps after the first three (each step waits for its loss);
the native options' the median of 10 steps after 2 (native_compare.measure_step).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotm_py.pipeline import prepare_cuda  # noqa: E402
from autotm_py.runtime.device import peaks, reset_peaks, use_replay_work_queues  # noqa: E402
from autotm_py.trainer import Trainer  # noqa: E402
from autotm_py.trainer.loop import GPU_MODE as PLACED_MODE  # noqa: E402

COPIES_MODE = replace(PLACED_MODE, placed=False)


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
        self.checkpointed = False  # native activation checkpointing: every block

    def forward(self, tokens):
        x = self.emb(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
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


def ratio_of(share: float) -> str:
    """fast:slow for a share of the peak: 0.25 -> 1/4 -> "1:3"; 1 -> "1:0" (all fast)."""
    part = Fraction(share).limit_denominator(100)
    return f"{part.numerator}:{part.denominator - part.numerator}"


def ours(net, loss_fn, data, share: float, args) -> dict[str, Any]:
    cuda = args.device.startswith("cuda")
    opt = sgd(net.parameters())
    started = time.perf_counter()
    trainer = Trainer(net, opt, loss_fn, example=data[0], ratio=ratio_of(share),
                      device=args.device, time_limit_s=args.time_limit,
                      plans_dir=tempfile.mkdtemp(), loss_chunks=args.loss_chunks,
                      mode=COPIES_MODE if args.copies else None)
    setup_s = time.perf_counter() - started
    if cuda:
        torch.cuda.synchronize()
        reset_peaks(args.device)
    losses, seconds = timed_steps(trainer.step, data[:3])  # two eager steps, then the capture
    if cuda:
        reserved = peaks(args.device)[1]
        reset_peaks(args.device)
    more = timed_steps(trainer.step, data[3:])
    losses, seconds = losses + more[0], seconds + more[1]
    plan = trainer.plan
    row = {"losses": losses, "step_s": statistics.median(seconds[3:]), "setup_s": setup_s,
           "budget_bytes": plan.header.budget_bytes, "peak_bytes": trainer.graph.peak_live_bytes,
           "predicted_s": plan.header.predicted_time_s, "status": plan.header.solver.status,
           "moves": sum(1 for _ in plan.moves()), "recomputes": sum(1 for _ in plan.recomputes()),
           "replayed": bool(trainer.loop.driver.replayed), "notes": trainer.notes,
           "describe": trainer.describe()}
    if cuda:  # what the steps held, arena included (torch's allocator's, or the placed one's)
        row["reserved_peak_first_steps_bytes"] = reserved
        row["reserved_peak_bytes"] = peaks(args.device)[1]
    return row


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
        reset_peaks(device)
    losses, seconds = timed_steps(step, data)
    peak = peaks(device)[0] if device.startswith("cuda") else None
    return {"losses": losses, "step_s": statistics.median(seconds[3:] or seconds),
            "peak_bytes": peak}


def native_step(net, loss_fn, batch, forward=None):
    """One SGD step of `net` (or of `forward`, its compiled or checkpointed form)."""
    opt = sgd(net.parameters())
    forward = net if forward is None else forward

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(forward(batch[0]), batch[1]).backward()
        opt.step()
    return step


def under_cap(nc, cap: int, make_step) -> dict[str, Any]:
    """The median step of `make_step()` under the cap (budget + 64 MiB), or out of memory."""
    torch.cuda.empty_cache()
    applied = nc.apply_cap(cap, nc.DEV, True, nc.SLACK)
    try:
        measured = nc.measure_step(make_step(), 10)
        return {k: measured[k] for k in ("median_s", "peak_bytes", "reserved_peak_bytes",
                                         "alloc_retries")} | {"cap": applied}
    except torch.OutOfMemoryError:
        return {"median_s": None, "out_of_memory": True, "cap": applied}
    finally:
        nc.release_cap(nc.DEV)
        torch.cuda.empty_cache()


def checkpointed(nc, name: str, net, loss_fn, batch, cap: int) -> dict[str, Any]:
    """PyTorch activation checkpointing of the same module under the cap: ResNet-50 by
    checkpoint_sequential at the fewest segments that fit, GPT-2 every block."""
    if name == "gpt2":
        net.checkpointed = True
        try:
            return under_cap(nc, cap, lambda: native_step(net, loss_fn, batch)) | {
                "form": "every block"}
        finally:
            net.checkpointed = False
    from torch.utils.checkpoint import checkpoint_sequential

    seq, missed = nc.cnn_sequential(net), []
    for segments in (s for s in nc.SEGMENTS if s <= len(seq)):
        row = under_cap(nc, cap, lambda s=segments: native_step(
            net, loss_fn, batch,
            lambda x, s=s: checkpoint_sequential(seq, s, x, use_reentrant=False)))
        if row["median_s"] is not None:
            return row | {"form": f"checkpoint_sequential, {segments} segments",
                          "out_of_memory_at": missed}
        missed.append(segments)
    return {"median_s": None, "out_of_memory_at": missed}


def compiled(nc, net, loss_fn, batch, caps: dict[float, int], fraction: float
             ) -> dict[float, dict[str, Any]]:
    """torch.compile of the same module with `activation_memory_budget` = fraction, compiled
    once (uncapped, its first step) and then run under each cap."""
    import torch._dynamo
    import torch._functorch.config as functorch_config

    torch._dynamo.reset()
    functorch_config.activation_memory_budget = fraction
    try:
        forward = torch.compile(net)
        started = time.perf_counter()
        native_step(net, loss_fn, batch, forward)()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - started
        return {share: under_cap(nc, cap, lambda: native_step(net, loss_fn, batch, forward))
                | {"activation_memory_budget": fraction, "compile_s": compile_s}
                for share, cap in caps.items()}
    finally:
        functorch_config.activation_memory_budget = 1.0
        torch._dynamo.reset()


def natives(name: str, net, loss_fn, data, caps: dict[float, int], fractions, device: str,
            out: dict[str, Any], write: Callable[[], None]) -> None:
    """PyTorch's own options on the same module under each cap, into `out`."""
    sys.path.insert(0, str(ROOT / "experiments" / "gpu"))
    import native_compare as nc

    nc.DEV = device
    net = net.to(device).train()
    batch = tuple(t.to(device) for t in data[0])
    out["checkpoint"] = {share: checkpointed(nc, name, net, loss_fn, batch, cap)
                         for share, cap in caps.items()}
    write()
    out["compile"] = {}
    for fraction in fractions:
        out["compile"][fraction] = compiled(nc, net, loss_fn, batch, caps, fraction)
        write()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--model", default="resnet50", choices=("resnet50", "gpt2", "tiny"))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--shares", default="1,0.5,0.25")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--device", default="cuda")
    p.add_argument("--time-limit", type=float, default=120.0)
    p.add_argument("--loss-chunks", type=int, default=1)
    p.add_argument("--native", action="store_true")
    p.add_argument("--compile", default="", help="activation_memory_budget values to try")
    p.add_argument("--copies", action="store_true", help="the Trainer on torch's allocator, "
                   "its outputs copied into their slots")
    p.add_argument("--region", type=int, help="bytes of the placed allocator's region (a "
                   "budget in bytes); default: the GPU's free memory")
    p.add_argument("--caps-from", type=Path, nargs="+", help="earlier results: their budgets, "
                   "no steps of ours (the native options alone)")
    args = p.parse_args(argv)
    torch.backends.cudnn.benchmark = False
    if args.native and not args.caps_from:
        p.error("--native needs --caps-from: the Trainer's placed allocator leaves caps "
                "without effect in its process, so the native options run in another")
    if args.device.startswith("cuda"):  # before CUDA starts: one work queue for replays
        use_replay_work_queues()
        if not (args.native or args.copies):
            notes = prepare_cuda(args.device, PLACED_MODE, args.region)
            print("\n".join(notes) or "placed allocator installed", flush=True)
    net, loss_fn, data = model_and_data(args.model, args.batch, args.seq, args.steps)
    result: dict[str, Any] = {"model": args.model, "batch": args.batch,
                              "args": {k: [str(p) for p in v] if k == "caps_from" and v else v
                                       for k, v in vars(args).items()},
                              "device": (torch.cuda.get_device_name()
                                         if args.device.startswith("cuda") else "cpu"),
                              "eager": eager(copy.deepcopy(net), loss_fn, data, args.device),
                              "rows": []}
    write = lambda: Path(args.out).write_text(json.dumps(result, indent=1) + "\n")  # noqa: E731
    write()
    print(f"eager uncapped {result['eager']['step_s'] * 1e3:.2f} ms", flush=True)
    shares = [] if args.caps_from else [float(s) for s in args.shares.split(",")]
    for share in shares:
        row = {"share": share, "ours": ours(copy.deepcopy(net), loss_fn, data, share, args)}
        row["loss_max_rel_diff"] = max(
            abs(a - b) / abs(b) for a, b in zip(row["ours"]["losses"], result["eager"]["losses"],
                                                strict=True))
        result["rows"].append(row)
        write()
        torch.cuda.empty_cache() if args.device.startswith("cuda") else None
        print(json.dumps({"share": share, "ours_s": row["ours"]["step_s"],
                          "predicted_s": row["ours"]["predicted_s"],
                          "describe": row["ours"]["describe"],
                          "loss_max_rel_diff": row["loss_max_rel_diff"]}), flush=True)
    if args.native:
        rows = [row for path in args.caps_from for row in json.loads(path.read_text())["rows"]]
        caps = {r["share"]: r["ours"]["budget_bytes"] for r in rows
                if r["ours"]["budget_bytes"] is not None}
        fractions = [float(f) for f in args.compile.split(",") if f]
        result["native"] = {}
        natives(args.model, copy.deepcopy(net), loss_fn, data, caps, fractions, args.device,
                result["native"], write)
        print(json.dumps(result["native"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
