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
    python3 experiments/gpu/trainer_bench.py OUT.json --model bert --batch 32 --seq 512 \
        --precision bf16 ...      (bf16: the Trainer's bf16 plan beside native autocast)
    --model tiny (an MLP; --device cpu works): the script's own check
Models: torchvision's ResNet-50 and ResNet-200 (channels-last), an in-code GPT-2 small (12
layers, 768 wide, tied embeddings, `scaled_dot_product_attention`; --seq), BERT-base (HF
`BertForMaskedLM` from `BertConfig()`, SDPA attention, dropout off as the Trainer's capture has
none, the module's forward giving the logits; its loss a cross-entropy at every position;
needs transformers), tiny. `--small`: the same code at toy sizes (ResNet-200 one block per
stage, GPT-2 and BERT 2 layers 64 wide, a 512-token vocabulary), for a smoke test on the CPU.
SGD with momentum 0.9, lr 0.01. Step times: the median over the steps after the first three
(each step waits for its loss); the native options' the median of 10 steps after 2
(native_compare.measure_step).

`--precision bf16` (issue 46 item 5): the Trainer plans and runs the bf16 iteration
(`Trainer(precision="bf16")`, docs/precision.md), and every native option runs its forward and
loss under `torch.autocast(device, dtype=torch.bfloat16)` (eager, checkpointing, torch.compile;
fp32 weights and SGD on both sides).

Several processes of one model can share a GPU (experiments/gpu/bf16_bench.sh): `--lock FILE`
holds an exclusive lock on FILE around everything this process times or profiles on the GPU
(our steps, the Trainer's kernel profiling, the native options), so no two processes measure
at once while the others capture, solve or compile; `--budgets-out FILE --budget-shares
0.5,0.25` writes the budget of each share (bytes, as the Trainer's plan will have it) as soon
as the graph exists, before profiling; `--signal FILE` touches FILE once the Trainer exists (its
kernels profiled into the cache); `--after FILE` makes the Trainer's planning wait for FILE
(profiles measured by another process: none measured twice, none while another process
times); `--budgets FILE` takes the budgets from such a file, waiting for it: with --native
the caps, else ours' budget at each share (the same bytes as the natives' caps);
`--no-eager` skips the uncapped eager steps (measured by the natives' process instead);
`--profile-chunks N` (with `--signal`) also measures, before its own plan, the kernels of the
graph whose loss is in N chunks (the capped processes' graph): measured in this process's large
placed region rather than in a capped process's region of its budget, whose plans were priced
17% over their steps on the H200 (BERT, 2026-12-04) where a process alone was within 4%;
`--save-plans` writes each plan beside OUT (OUT.SHARE.plan.json) and every row of ours carries
the simulator's breakdown of its prediction (`predicted_breakdown`), to set beside a trace.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotm_py import pipeline  # noqa: E402
from autotm_py.errors import ConfigError  # noqa: E402
from autotm_py.pipeline import prepare_cuda  # noqa: E402
from autotm_py.runtime import placed  # noqa: E402
from autotm_py.runtime.device import peaks, reset_peaks, use_replay_work_queues  # noqa: E402
from autotm_py.trainer import Trainer  # noqa: E402
from autotm_py.trainer.loop import GPU_MODE as PLACED_MODE  # noqa: E402
from autotm_py.trainer.loop import gpu_name  # noqa: E402

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


class BertMLM(nn.Module):
    """HF `BertForMaskedLM` (SDPA attention) whose forward gives the logits (the Trainer takes
    modules that return one tensor); its output layer is tied to the word embedding."""

    def __init__(self, config) -> None:
        super().__init__()
        import transformers

        self.mlm = transformers.BertForMaskedLM(config)
        self.mlm.config.use_cache = False

    def forward(self, tokens):
        return self.mlm(input_ids=tokens).logits


def bert_config(seq: int, small: bool):
    """BERT-base (or a 2-layer, 64-wide one), SDPA attention, dropout off: the Trainer's
    capture has no dropout (it exports in eval mode), so the native options train without it
    too."""
    try:
        import transformers
    except ImportError:
        raise SystemExit("--model bert needs transformers (pip install transformers)") from None
    sizes = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=256) if small else {}
    return transformers.BertConfig(**sizes, max_position_embeddings=max(512, seq),
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                   attn_implementation="sdpa")


def lm_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def images(name: str, batch: int, steps: int, size: int, gen):
    """(net, batches) of a torchvision ResNet, channels-last on both sides."""
    import torchvision
    from torchvision.models.resnet import Bottleneck

    blocks = {"resnet50": [3, 4, 6, 3], "resnet200": [3, 24, 36, 3], "small": [1, 1, 1, 1]}
    net = torchvision.models.ResNet(Bottleneck, blocks[name]).to(
        memory_format=torch.channels_last)
    data = [(torch.randn(batch, 3, size, size, generator=gen)
             .contiguous(memory_format=torch.channels_last),
             torch.randint(0, 1000, (batch,), generator=gen)) for _ in range(steps)]
    return net, data


def model_and_data(name: str, batch: int, seq: int, steps: int, small: bool = False,
                   size: int = 224, pin: bool = False):
    """(module, loss function, batches on the CPU), seeded; `small`: toy sizes (`--small`);
    `pin`: the batches in pinned memory, as `DataLoader(pin_memory=True)` gives them (a GPU
    run: both sides copy them asynchronously)."""
    net, loss_fn, data = _model_and_data(name, batch, seq, steps, small, size)
    if pin:
        data = [tuple(t.pin_memory() for t in b) for b in data]
    return net, loss_fn, data


def _model_and_data(name: str, batch: int, seq: int, steps: int, small: bool, size: int):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if name in ("resnet50", "resnet200"):
        net, data = images("small" if small else name, batch, steps, size, gen)
        return net, F.cross_entropy, data
    if name in ("gpt2", "bert"):
        if name == "gpt2":
            net = GPT2(vocab=512, dim=64, layers=2, heads=2, seq=seq) if small else GPT2(seq=seq)
            vocab = net.emb.num_embeddings
        else:
            config = bert_config(seq, small)
            net, vocab = BertMLM(config), config.vocab_size
        tokens = [torch.randint(0, vocab, (batch, seq + 1), generator=gen) for _ in range(steps)]
        return net, lm_loss, [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                        nn.Linear(256, 10))
    data = [(torch.randn(batch, 64, generator=gen), torch.randint(0, 10, (batch,),
                                                                    generator=gen))
            for _ in range(steps)]
    return net, F.cross_entropy, data


def autocast(device: str, precision: str):
    """What a PyTorch user puts around the forward and the loss: torch.autocast in bf16
    (`precision` "bf16"), or nothing."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16,
                          enabled=precision == "bf16")


@contextlib.contextmanager
def gpu_lock(path: str | None) -> Iterator[None]:
    """An exclusive lock on `path` (None: no lock) while the body measures on the GPU: the
    processes of one model that share a GPU take turns (released when the process ends, too)."""
    if path is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def wait_for(path: str, timeout_s: float, what: str) -> bool:
    """Wait until `path` exists (at most `timeout_s`); whether it does."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            print(f"waited {timeout_s:.0f} s for {what} ({path}): going on without it",
                  flush=True)
            return False
        time.sleep(0.5)
    return True


def quiet(args) -> None:
    """Before this process first times anything: say it is ready (`--ready-dir`) and wait until
    `--parties` processes are (at most `--wait-s`), so that nothing is timed while another
    process captures, profiles, solves or compiles: ResNet-200's all-fast bf16 step measured
    94.8 ms beside three solves and a compile, 64.4 ms alone (H200, 2026-12-04); the GPU lock
    keeps GPU work apart, not the host's."""
    if not args.ready_dir or _ready_file(args).exists():  # once per process
        return
    mark_ready(args)
    deadline = time.monotonic() + args.wait_s
    while len(list(Path(args.ready_dir).glob("ready.*"))) < args.parties:
        if time.monotonic() > deadline:
            print(f"waited {args.wait_s:.0f} s for {args.parties} processes to be ready: "
                  "timing anyway", flush=True)
            return
        time.sleep(0.5)


def mark_ready(args) -> None:
    """This process is ready to time, or has ended (it holds no one up either way)."""
    if args.ready_dir:
        Path(args.ready_dir).mkdir(parents=True, exist_ok=True)
        _ready_file(args).touch()


def _ready_file(args) -> Path:
    return Path(args.ready_dir) / f"ready.{os.getpid()}"


def write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    Path(tmp).write_text(text)
    os.replace(tmp, path)


def write_budgets(args, graph, config) -> dict[str, int | None]:
    """The budget of each `--budget-shares` share of `graph` under `config` (bytes, as the
    Trainer's plan will have it), into `--budgets-out`."""
    budgets = {s: pipeline.user_budget(graph, config.with_ratio(ratio_of(float(s))))
               for s in args.budget_shares.split(",") if s}
    write_atomically(args.budgets_out, json.dumps(
        {"budgets": budgets, "peak_bytes": graph.peak_live_bytes}, indent=1) + "\n")
    return budgets


def coordinate_planning(args) -> None:
    """The Trainer's construction made to take part in a shared GPU (`--budgets-out`,
    `--after`, `--lock`, `--signal`; see the module docstring): the budgets written as soon as
    the graph is captured (before the module's weights are mapped and the kernels profiled),
    and its planning (`trainer.core.plan_for`: kernel profiling, then the solve) gated."""
    if not (args.budgets_out or args.after or args.signal):
        return
    from autotm_py.config import PlanConfig
    from autotm_py.trainer import core

    real_capture, real_plan_for = core.Trainer._capture, core.plan_for
    real_costs, real_pieces = pipeline.device_costs, core.capture_training
    written: dict[str, int | None] = {}
    others: list[Any] = []  # graphs whose kernels this process measures before its own plan
    plain: list[Any] = []  # the graph with the plain loss, whose peak the budgets share
    forwards: list[Any] = []  # (forward, loss rule, optimizer spec) of each capture

    def capture_training(*given, **named):
        pieces = real_pieces(*given, **named)
        forwards.append(pieces[:3])  # not the capture itself: it holds the weights again
        return pieces

    def capture(self, loss_fn, channels_last, loss_chunks, precision="fp32", budget=None):
        graph, captured = real_capture(self, loss_fn, channels_last, loss_chunks, precision,
                                       budget)
        chunks = loss_chunks_of(graph)
        if args.budgets_out:  # the Trainer's PlanConfig as far as a budget depends on it
            cuda = self.device.startswith("cuda")
            config = PlanConfig(device="cuda", gpu=core.gpu_name(self.device),
                                reserve_bytes=None if cuda else 0)
            # shares of the model as users run it, whatever loss this process trains with:
            # the plain loss derived from the same forward (no second export)
            forward, rule, spec = forwards[-1]
            plain.append(graph if chunks == 1 else
                         core.derive_training(forward, optimizer=spec, loss=rule))
            written.update(write_budgets(args, plain[0], config))
        if args.profile_chunks > 1 and args.profile_chunks != chunks:
            # the capped processes' graph (their loss in chunks): its kernels measured here,
            # in this process's large region and before any capped process plans
            others.append(real_capture(self, loss_fn, channels_last, args.profile_chunks,
                                       precision)[0])
        return graph, captured

    def plan_for(graph, config, device, **kw):
        if args.budgets_out and write_budgets(args, plain[0], config) != written:
            print(f"budgets rewritten with the Trainer's own config: {written} before",
                  flush=True)
        if args.after:
            wait_for(args.after, args.wait_s, "the kernel profiles")
        for other in others:
            device_costs(other, device, config.gpu, measure=kw.get("measure", False))
        planned = real_plan_for(graph, config, device, **kw)  # (the graph it runs, the plan)
        if args.signal:
            Path(args.signal).touch()
        return planned

    def device_costs(graph, device, gpu, *, measure=False):
        # every process measures the kernels no profile has yet (a capped graph's chunked
        # loss) holding the GPU: measured beside another process's steps, profiling or
        # compile, BERT's chunked-loss kernels priced its capped plans 32-58% high on the
        # H200 (2026-12-03; 4% alone, 2026-12-04); the solves that follow need no GPU
        with gpu_lock(args.lock if measure else None):
            return real_costs(graph, device, gpu, measure=measure)

    core.Trainer._capture = capture
    core.capture_training = capture_training
    core.plan_for = plan_for
    pipeline.device_costs = device_costs


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


def plan_option(text: str) -> tuple[str, Any]:
    """KEY=VALUE of --plan-option: a whole number or a decimal as a number, else the text."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE, e.g. write_pricing=spread")
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, value


def budget_of(args, share: float) -> dict[str, Any]:
    """The Trainer's budget at `share`: the bytes a `--budgets` file gives it (the shares of
    another graph's peak: the unchunked model's, as users run it, where this one chunks its
    loss), else the share of its own graph's peak."""
    if args.budgets and not args.native:
        if not wait_for(str(args.budgets), args.wait_s, "the budgets"):
            raise SystemExit(f"--budgets {args.budgets}: not written within {args.wait_s} s")
        return {"budget": int(json.loads(args.budgets.read_text())["budgets"][str(share)])}
    return {"ratio": ratio_of(share)}


def ours(net, loss_fn, data, share: float, args, ready: Callable[[dict], None] | None = None
         ) -> dict[str, Any]:
    """The Trainer's steps at `share` of the peak; `ready(row)` is told the plan's figures as
    soon as the Trainer exists (before any step)."""
    cuda = args.device.startswith("cuda")
    opt = sgd(net.parameters())
    started = time.perf_counter()
    trainer = Trainer(net, opt, loss_fn, example=data[0], **budget_of(args, share),
                      device=args.device, time_limit_s=args.time_limit,
                      plans_dir=tempfile.mkdtemp(), loss_chunks=args.loss_chunks,
                      mode=COPIES_MODE if args.copies else None, precision=args.precision,
                      plan_options=dict(args.plan_option))
    setup_s = time.perf_counter() - started
    plan = trainer.plan
    row = {"setup_s": setup_s, "precision": trainer.graph.meta.get("precision", "fp32"),
           "budget_bytes": plan.header.budget_bytes, "peak_bytes": trainer.graph.peak_live_bytes,
           "predicted_s": plan.header.predicted_time_s, "status": plan.header.solver.status,
           "gap": plan.header.solver.gap,  # where a time limit stopped the search
           "moves": sum(1 for _ in plan.moves()), "recomputes": sum(1 for _ in plan.recomputes()),
           "describe": trainer.describe()}
    if cuda:  # what the prediction is made of, to set beside a trace (trainer_kernels.py)
        row["predicted_breakdown"] = predicted_breakdown(trainer)
    if args.save_plans:  # to simulate again on the CPU with this run's profiles
        trainer.plan.save(f"{args.out}.{share}.plan.json")
    if ready is not None:
        ready(row)
    quiet(args)
    with gpu_lock(args.lock):
        if cuda:
            torch.cuda.synchronize()
            reset_peaks(args.device)
        losses, seconds = timed_steps(trainer.step, data[:3])  # two eager steps, the capture
        if cuda:
            reserved = peaks(args.device)[1]
            reset_peaks(args.device)
        more = timed_steps(trainer.step, data[3:])
        losses, seconds = losses + more[0], seconds + more[1]
        if cuda:  # what the steps held, arena included (torch's allocator's, or the placed one's)
            row["reserved_peak_first_steps_bytes"] = reserved
            row["reserved_peak_bytes"] = peaks(args.device)[1]
    lib = placed.active()
    if lib is not None:  # the region, and what overflowed it (cudaMalloc'd beyond it)
        row["placed"] = asdict(lib.stats())
    # every step's seconds too: a median alone could not say why ResNet-200's 33% plan ran 18.6%
    # over its prediction (H100, 2026-12-07)
    return row | {"losses": losses, "step_s": statistics.median(seconds[3:] or seconds),
                  "step_times_s": seconds, "replayed": bool(trainer.loop.driver.replayed),
                  "notes": trainer.notes}


def predicted_breakdown(trainer, top: int = 15) -> dict:
    """What the simulator predicts of the Trainer's plan, per step in ms: the step, the kernels
    and re-runs summed, the time no kernel runs (waiting for copies), copies per direction
    (ms and MB) and the kernels and re-runs by op type."""
    graph = trainer.run_graph  # the graph the plan is for
    # the costs the Trainer priced its plan with: every kernel measured by now, none again
    costs = pipeline.device_costs(graph, "cuda", gpu_name("cuda"), measure=False)
    sim = pipeline.simulate(graph, trainer.plan, costs=costs)
    by_op, reruns, count = Counter(), Counter(), Counter()
    for span in sim.kernels:
        op = graph.kernels[span.kernel].op_type
        by_op[op] += (span.end_s - span.start_s) * 1e3
        count[op] += 1
    for span in sim.recomputes:
        reruns[graph.kernels[span.kernel].op_type] += (span.end_s - span.start_s) * 1e3
    copy_ms, copy_mb = Counter(), Counter()
    for move in sim.moves:
        copy_ms[move.to] += (move.end_s - move.start_s) * 1e3
        copy_mb[move.to] += move.bytes / 2 ** 20
    kernel_ms, rerun_ms = sum(by_op.values()), sum(reruns.values())
    return {"step_ms": sim.total_s * 1e3, "all_fast_ms": sim.all_fast_s * 1e3,
            "kernel_ms": kernel_ms, "rerun_ms": rerun_ms,
            "waiting_ms": sim.total_s * 1e3 - kernel_ms - rerun_ms,
            "copy_ms": dict(copy_ms), "copy_mb": dict(copy_mb),
            "ops_ms": [(op, round(ms, 3), count[op]) for op, ms in by_op.most_common(top)],
            "reruns_ms": [(op, round(ms, 3)) for op, ms in reruns.most_common(top)]}


def eager_step(net, loss_fn, device: str, precision: str = "fp32"):
    """A plain PyTorch training step of `net` on `device` (under torch.autocast in bf16): the
    batch copied as a user with `DataLoader(pin_memory=True)` copies it, without waiting."""
    net = net.to(device).train()
    opt = sgd(net.parameters())

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = loss_fn(net(x.to(device, non_blocking=True)),
                           y.to(device, non_blocking=True))
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def eager(net, loss_fn, data, device: str, precision: str = "fp32") -> dict[str, Any]:
    """Plain PyTorch, uncapped (under torch.autocast in bf16): what the loss curves are compared
    with."""
    step = eager_step(net, loss_fn, device, precision)
    if device.startswith("cuda"):
        reset_peaks(device)
    losses, seconds = timed_steps(step, data)
    peak = peaks(device)[0] if device.startswith("cuda") else None
    return {"losses": losses, "step_s": statistics.median(seconds[3:] or seconds),
            "peak_bytes": peak, "precision": precision}


def native_step(net, loss_fn, batch, forward=None, precision: str = "fp32"):
    """One SGD step of `net` (or of `forward`, its compiled or checkpointed form), its forward
    and loss under torch.autocast in bf16."""
    opt = sgd(net.parameters())
    forward = net if forward is None else forward
    device = batch[0].device.type

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = loss_fn(forward(batch[0]), batch[1])
        loss.backward()
        opt.step()
    return step


def measure(nc, step, device: str) -> dict[str, Any]:
    """The median of 10 steps after 2 (native_compare.measure_step on a GPU; wall time on the
    CPU, where only the script itself is checked)."""
    if device.startswith("cuda"):
        measured = nc.measure_step(step, 10)
        return {k: measured[k] for k in ("median_s", "peak_bytes", "reserved_peak_bytes",
                                         "alloc_retries")}
    for _ in range(2):
        step()
    seconds = []
    for _ in range(10):
        started = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - started)
    return {"median_s": statistics.median(seconds), "peak_bytes": None}


def under_cap(nc, cap: int, make_step) -> dict[str, Any]:
    """The median step of `make_step()` under the cap (budget + 64 MiB), or out of memory."""
    cuda = nc.DEV.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
    applied = nc.apply_cap(cap, nc.DEV, True, nc.SLACK)
    try:
        return measure(nc, make_step(), nc.DEV) | {"cap": applied}
    except torch.OutOfMemoryError:
        return {"median_s": None, "out_of_memory": True, "cap": applied}
    finally:
        if cuda:
            nc.release_cap(nc.DEV)
            torch.cuda.empty_cache()


def checkpointed(nc, name: str, net, loss_fn, batch, cap: int, precision: str = "fp32"
                 ) -> dict[str, Any]:
    """PyTorch activation checkpointing of the same module under the cap: ResNets by
    checkpoint_sequential at the fewest segments that fit, GPT-2 every block, BERT HF's
    gradient checkpointing (every layer)."""
    if name in ("gpt2", "bert"):
        if name == "gpt2":
            net.checkpointed = True
        else:
            net.mlm.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        try:
            return under_cap(nc, cap, lambda: native_step(net, loss_fn, batch,
                                                          precision=precision)) | {
                "form": "every block" if name == "gpt2" else "HF gradient checkpointing"}
        finally:
            if name == "gpt2":
                net.checkpointed = False
            else:
                net.mlm.gradient_checkpointing_disable()
    from torch.utils.checkpoint import checkpoint_sequential

    seq, missed = nc.cnn_sequential(net), []
    for segments in (s for s in nc.SEGMENTS if s <= len(seq)):
        row = under_cap(nc, cap, lambda s=segments: native_step(
            net, loss_fn, batch,
            lambda x, s=s: checkpoint_sequential(seq, s, x, use_reentrant=False), precision))
        if row["median_s"] is not None:
            return row | {"form": f"checkpoint_sequential, {segments} segments",
                          "out_of_memory_at": missed}
        missed.append(segments)
    return {"median_s": None, "out_of_memory_at": missed}


@contextlib.contextmanager
def compiling(fraction: float) -> Iterator[None]:
    """torch.compile's state for `activation_memory_budget` = fraction, reset after."""
    import torch._dynamo
    import torch._functorch.config as functorch_config

    torch._dynamo.reset()
    functorch_config.activation_memory_budget = fraction
    try:
        yield
    finally:
        functorch_config.activation_memory_budget = 1.0
        torch._dynamo.reset()


def compile_first(net, loss_fn, batch, precision: str):
    """torch.compile of the module and its first step (the compile), uncapped: (the compiled
    forward, seconds). Call inside `compiling`."""
    forward = torch.compile(net)
    started = time.perf_counter()
    native_step(net, loss_fn, batch, forward, precision)()
    if batch[0].is_cuda:
        torch.cuda.synchronize()
    return forward, time.perf_counter() - started


def compiled(nc, net, loss_fn, batch, caps: dict[float, int], fraction: float,
             precision: str = "fp32", first=None) -> dict[float, dict[str, Any]]:
    """torch.compile of the same module with `activation_memory_budget` = fraction, compiled
    once (uncapped, its first step; `first`: already compiled so, inside `compiling`) and then
    run under each cap."""
    with contextlib.ExitStack() as stack:
        if first is None:
            stack.enter_context(compiling(fraction))
            first = compile_first(net, loss_fn, batch, precision)
        forward, compile_s = first
        return {share: under_cap(nc, cap, lambda: native_step(net, loss_fn, batch, forward,
                                                               precision))
                | {"activation_memory_budget": fraction, "compile_s": compile_s}
                for share, cap in caps.items()}


def natives(name: str, net, loss_fn, data, caps_of: Callable[[], dict[float, int]], fractions,
            args, out: dict[str, Any], write: Callable[[], None],
            timing: Callable[[], None] = lambda: None) -> None:
    """PyTorch's own options on the same module under each cap, into `out`: torch.compile at
    each fraction and checkpointing. The first fraction compiles before the caps are known
    (`caps_of` may wait for them), without holding the GPU (`--lock`): compiling is CPU work
    beside the other processes' captures and solves, and the one step it runs is a second of
    GPU work at most. Everything timed holds it."""
    sys.path.insert(0, str(ROOT / "experiments" / "gpu"))
    import native_compare as nc

    nc.DEV = args.device
    net = net.to(args.device).train()
    batch = tuple(t.to(args.device) for t in data[0])
    out["compile"] = {}
    with contextlib.ExitStack() as stack:
        first = None
        if fractions:
            stack.enter_context(compiling(fractions[0]))
            first = compile_first(net, loss_fn, batch, args.precision)
        caps = caps_of()
        quiet(args)
        timing()  # the uncapped eager steps, when they wait for the quiet too
        with gpu_lock(args.lock):
            if fractions:
                out["compile"][fractions[0]] = compiled(nc, net, loss_fn, batch, caps,
                                                        fractions[0], args.precision, first)
            write()
    with gpu_lock(args.lock):
        out["checkpoint"] = {share: checkpointed(nc, name, net, loss_fn, batch, cap,
                                                 args.precision)
                             for share, cap in caps.items()}
        write()
        for fraction in fractions[1:]:
            out["compile"][fraction] = compiled(nc, net, loss_fn, batch, caps, fraction,
                                                args.precision)
            write()


def caps_reader(args) -> Callable[[], dict[float, int]]:
    """The caps of the native options: the budgets of `--caps-from` results, or of a
    `--budgets` file (waited for)."""
    def caps() -> dict[float, int]:
        if args.budgets:
            if not wait_for(str(args.budgets), args.wait_s, "the budgets"):
                return {}
            budgets = json.loads(args.budgets.read_text())["budgets"]
            return {float(s): int(b) for s, b in budgets.items() if b is not None}
        rows = [row for path in args.caps_from for row in json.loads(path.read_text())["rows"]]
        return {r["share"]: r["ours"]["budget_bytes"] for r in rows
                if r["ours"]["budget_bytes"] is not None}
    return caps


def loss_chunks_of(graph) -> int:
    """The blocks of `graph`'s loss (1: the plain loss), as the Trainer resolved them."""
    return int((graph.meta.get("training") or {}).get("loss_chunks", 1))


def loss_chunks_arg(text: str) -> int | str:
    """`--loss-chunks`: a whole number, or "auto" (the Trainer chooses)."""
    return text if text == "auto" else int(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--model", default="resnet50",
                   choices=("resnet50", "resnet200", "gpt2", "bert", "tiny"))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--image", type=int, default=224, help="image side (the ResNets)")
    p.add_argument("--small", action="store_true", help="toy sizes of the same model (a smoke "
                   "test of the script)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--shares", default="1,0.5,0.25")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--device", default="cuda")
    p.add_argument("--time-limit", type=float, default=120.0)
    p.add_argument("--loss-chunks", type=loss_chunks_arg, default=1,
                   help="blocks of the chunked loss, or auto (the Trainer's default)")
    p.add_argument("--native", action="store_true")
    p.add_argument("--compile", default="", help="activation_memory_budget values to try")
    p.add_argument("--copies", action="store_true", help="the Trainer on torch's allocator, "
                   "its outputs copied into their slots")
    p.add_argument("--region", type=int, help="bytes of the placed allocator's region (a "
                   "budget in bytes); default: the GPU's free memory")
    p.add_argument("--caps-from", type=Path, nargs="+", help="earlier results: their budgets, "
                   "no steps of ours (the native options alone)")
    p.add_argument("--budgets", type=Path, help="the budgets of this file of --budgets-out "
                   "(waited for): with --native the caps, else ours' budget at each share")
    p.add_argument("--budgets-out", help="write the budget of each --budget-shares here once "
                   "the graph exists")
    p.add_argument("--budget-shares", default="0.5,0.333,0.25")
    p.add_argument("--plan-option", action="append", type=plan_option, default=[],
                   metavar="KEY=VALUE", help="a planning option of ours (Trainer(plan_options="
                   "...)), e.g. write_pricing=spread or async_window=60; repeatable")
    p.add_argument("--lock", help="a file locked while this process measures on the GPU")
    p.add_argument("--signal", help="touched once the Trainer exists (kernels profiled)")
    p.add_argument("--after", help="the Trainer plans only once this file exists")
    p.add_argument("--wait-s", type=float, default=900.0, help="the longest wait for --after "
                   "and --budgets")
    p.add_argument("--ready-dir", help="with --parties: a folder where each process says it "
                   "is ready to time; none times before --parties are (or have ended)")
    p.add_argument("--parties", type=int, default=1, help="processes sharing --ready-dir")
    p.add_argument("--no-eager", action="store_true", help="no uncapped eager steps here")
    p.add_argument("--profile-chunks", type=int, default=1, help="also measure the kernels "
                   "of the graph with its loss in this many chunks (the capped processes') "
                   "before planning")
    p.add_argument("--save-plans", action="store_true", help="write each plan of ours beside "
                   "OUT (OUT.SHARE.plan.json)")
    return p


def main(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        return bench(p, args)
    finally:
        mark_ready(args)  # an ended process holds no other up


def bench(p: argparse.ArgumentParser, args) -> int:
    torch.backends.cudnn.benchmark = False
    if args.native and not (args.caps_from or args.budgets):
        p.error("--native needs --caps-from or --budgets: the Trainer's placed allocator leaves "
                "caps without effect in its process, so the native options run in another")
    natives_only = bool(args.caps_from or (args.native and args.budgets))
    if args.device.startswith("cuda"):  # before CUDA starts: one work queue for replays
        use_replay_work_queues()
        if not (args.native or args.copies):
            notes = prepare_cuda(args.device, PLACED_MODE, args.region)
            print("\n".join(notes) or "placed allocator installed", flush=True)
    coordinate_planning(args)
    net, loss_fn, data = model_and_data(args.model, args.batch, args.seq, args.steps, args.small,
                                        args.image, pin=args.device.startswith("cuda"))
    result: dict[str, Any] = {"model": args.model, "batch": args.batch,
                              "precision": args.precision,
                              "args": {k: [str(p) for p in v] if k == "caps_from" and v else
                                       str(v) if isinstance(v, Path) else v
                                       for k, v in vars(args).items()},
                              "device": (torch.cuda.get_device_name()
                                         if args.device.startswith("cuda") else "cpu"),
                              "eager": None, "rows": []}
    write = lambda: write_atomically(args.out, json.dumps(result, indent=1) + "\n")  # noqa: E731

    def run_eager() -> None:
        with gpu_lock(args.lock):
            result["eager"] = eager(copy.deepcopy(net), loss_fn, data, args.device,
                                    args.precision)
        print(f"eager uncapped ({args.precision}) {result['eager']['step_s'] * 1e3:.2f} ms",
              flush=True)
        write()

    # with --ready-dir, the natives' process times its eager steps after its compile, once
    # every process is ready
    eager_later = bool(args.ready_dir and args.native and natives_only and not args.no_eager)
    if not (args.no_eager or eager_later):
        quiet(args)
        run_eager()
    write()
    shares = [] if natives_only else [float(s) for s in args.shares.split(",")]
    for share in shares:
        row: dict[str, Any] = {"share": share}
        result["rows"].append(row)

        def ready(partial, row=row):
            row["ours"] = partial | {"pending": True}
            write()

        try:
            row["ours"] = ours(copy.deepcopy(net), loss_fn, data, share, args, ready)
        except ConfigError as exc:  # an infeasible budget says the smallest feasible one
            row["ours"] = {"error": str(exc), "budget_bytes": None}
            write()
            print(json.dumps({"share": share, "error": str(exc)}), flush=True)
            continue
        if result["eager"] is not None:
            row["loss_max_rel_diff"] = max(
                abs(a - b) / abs(b) for a, b in zip(row["ours"]["losses"],
                                                    result["eager"]["losses"], strict=True))
        write()
        torch.cuda.empty_cache() if args.device.startswith("cuda") else None
        print(json.dumps({"share": share, "ours_s": row["ours"]["step_s"],
                          "predicted_s": row["ours"]["predicted_s"],
                          "describe": row["ours"]["describe"],
                          "loss_max_rel_diff": row.get("loss_max_rel_diff")}), flush=True)
    if args.native:
        fractions = [float(f) for f in args.compile.split(",") if f]
        result["native"] = {}
        natives(args.model, copy.deepcopy(net), loss_fn, data, caps_reader(args), fractions,
                args, result["native"], write, run_eager if eager_later else lambda: None)
        print(json.dumps(result["native"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
