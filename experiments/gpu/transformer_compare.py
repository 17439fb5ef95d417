"""Our all-fast iteration beside native PyTorch on transformers we never tuned for (issue 45
item 3), each model in one process on one GPU, fp32, plain SGD (lr 0.01, no momentum):

- native: the hand-written module, eager (HF BertForMaskedLM with SDPA; the in-code GPT-2 of
  trainer_bench.py with `scaled_dot_product_attention` and a tied head; HF LlamaForCausalLM
  from a LlamaConfig with SDPA), dropout off, `foreach` SGD: the median step of
  `--iterations` (CUDA events, native_compare.measure_step) after warm-up;
- ours: the same module through `autotm_py.Trainer` with no budget (ratio 1:0): captured by
  torch's dynamo ONNX exporter (frontend/capture.py), imported and fused, its training
  derived, run in the Trainer's default GPU mode (an arena at planned addresses, kernels'
  outputs placed, CUDA-graph replay); the median step after the two eager steps and the
  capture;
- autograd: torch.autograd over our kernels of the same imported graph
  (`runtime.eager.measure_autograd`, as native_compare.py runs it);
- back to back: each side's `--iterations` steps again with one wait at the end
  (native_compare.measure_loop), as a training loop runs them: the host's work before a
  step (a replay's uploads) overlaps the step before;
- copies: the outputs ours' first (eager) step copies into their slots, by op
  (`trainer_kernels.slot_copies`; a replay repeats them);
- per op: the CUDA kernels of `--profiled` steps of native and ours, by kind and by name
  (trainer_kernels.profiled), and the top `--top` kernels where ours spends more than native;
  then the same of autograd's steps against ours (`runtime.eager.autograd_step`).

The placed allocator is installed before CUDA starts (as the Trainer's default mode needs), so
the native and autograd steps allocate from its region too. Each model's row also gives the
op counts of the imported forward graph: attention fused to ScaledDotProductAttention, no
Softmax left; RMSNorm -> RMSNormalization, x * sigmoid(x) -> Silu and q * cos +
rotate_half(q) * sin -> RotaryEmbedding, no Neg or Concat left (Llama), GELU, the
bias-free projections as MatMul by a weight. `--small` (CPU, tiny shapes: a smoke test whose
times mean nothing) asserts that fusion and skips the kernel profile.

Models (`--models`, default all three):
    bert   BERT-base (12 x 768, 12 heads, vocab 30522), b16 s512, ~110M parameters
    gpt2   GPT-2 small (12 x 768, 12 heads, vocab 50257, tied head), b8 s1024, ~124M
    llama  Llama-style: hidden 2048, 16 layers, 32 heads, 8 KV heads,
           intermediate 5632, vocab 32000, untied head, b4 s1024: 0.85e9 parameters
           (`--llama-layers 20`: 1.03e9, a fifth more time)
Expected time on one H200: bert ~2 min, gpt2 ~2 min, llama ~4 min. Most of it is the
Trainer's setup, on the host: GPT-2's took ~87 s in experiments/results/trainer/2026-12-02
(capture, import, measuring the kernels no profile has); the 0.85e9-parameter Llama's capture
alone took 4 min on the 2-core development machine (torch 2.13, 16 layers; 28 s at 4 layers:
the export ~55%, copying and checking the weights' bytes ~30%), plus building the model and the
Trainer's forward on the CPU. The three in one call come near the 10-minute limit of one device
command: run `--models bert,gpt2` and `--models llama` as two calls.

Usage (GPU machine, repository root, `source experiments/gpu/setup.sh` with the wheels carried):
    python3 experiments/gpu/transformer_compare.py OUT_DIR [--models bert,gpt2,llama] \
        [--iterations 10] [--profiled 3] [--top 15] [--no-ops] [--llama-layers 16]
    python3 experiments/gpu/transformer_compare.py OUT_DIR --small      # CPU smoke test
Writes OUT_DIR/transformer_compare.json after each model (a run cut short keeps what it
measured) and prints one summary line per model, the fused op counts and the kernel tables.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gpu"))

import native_compare as nc  # noqa: E402
import trainer_bench as tb  # noqa: E402
import trainer_kernels as tk  # noqa: E402

from autotm_py.pipeline import prepare_cuda  # noqa: E402
from autotm_py.runtime import eager  # noqa: E402
from autotm_py.runtime.device import use_replay_work_queues  # noqa: E402
from autotm_py.trainer import Trainer  # noqa: E402
from autotm_py.trainer.loop import GPU_MODE  # noqa: E402

MODELS = ("bert", "gpt2", "llama")
LR = 0.01


class Logits(nn.Module):
    """A transformers model as a module that returns its logits (the Trainer's forward returns
    one tensor); the native steps run the same wrapper."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=ids).logits


def build(name: str, small: bool, llama_layers: int) -> tuple[nn.Module, dict[str, Any]]:
    """The native module (seeded, on the CPU, dropout off) and its shapes."""
    torch.manual_seed(0)
    if name == "gpt2":
        c = dict(vocab=96, dim=32, layers=2, heads=2, seq=128) if small else \
            dict(vocab=50257, dim=768, layers=12, heads=12, seq=1024)
        return tb.GPT2(**c), {"batch": 2 if small else 8, "seq": c["seq"],
                              "vocab": c["vocab"], "layers": c["layers"], "config": c}
    import transformers

    if name == "bert":
        c = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64) if small else {}
        cfg = transformers.BertConfig(**c, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0,
                                      attn_implementation="sdpa")
        net = transformers.BertForMaskedLM(cfg)
        batch, seq = (2, 128) if small else (16, 512)
    else:
        c = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128) if small else \
            dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=llama_layers,
                 num_attention_heads=32, num_key_value_heads=8, intermediate_size=5632)
        cfg = transformers.LlamaConfig(**c, max_position_embeddings=2048,
                                       tie_word_embeddings=False, attention_dropout=0.0,
                                       attn_implementation="sdpa")
        net = transformers.LlamaForCausalLM(cfg)
        batch, seq = (2, 128) if small else (4, 1024)
    net.config.use_cache = False
    attn = getattr(net.config, "_attn_implementation", None)
    if attn != "sdpa":
        raise SystemExit(f"{name}: transformers chose attention {attn!r}, not sdpa")
    return Logits(net), {"batch": batch, "seq": seq, "vocab": cfg.vocab_size,
                         "layers": cfg.num_hidden_layers,
                         "config": json.loads(cfg.to_json_string(use_diff=True))}


def batch_of(shape: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token-style labels (random: the step time does not depend on
    them), on the CPU."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"] + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def native_step(net: nn.Module, device: str, precision: str = "fp32"):
    """One SGD step of `net` on (x, y): what a PyTorch user runs (bf16: the forward and the
    loss under torch.autocast); returns the loss."""
    net = net.to(device).train()
    opt = torch.optim.SGD(net.parameters(), lr=LR, foreach=True)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with tb.autocast(device, precision):
            loss = tb.lm_loss(net(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def forward_ops(graph) -> dict[str, int]:
    """Op counts of the training graph's forward part (the imported, fused forward)."""
    n = graph.meta["training"]["forward_kernels"]
    return dict(Counter(k.op_type for k in graph.kernels[:n]).most_common())


def fusion_check(name: str, ops: dict[str, int], layers: int) -> list[str]:
    """What is not fused as intended (empty: all of it)."""
    want = {"ScaledDotProductAttention": layers}
    if name == "llama":
        want |= {"RMSNormalization": 2 * layers + 1, "Silu": layers,
                 "RotaryEmbedding": 2 * layers}  # q and k of every layer
    else:  # BERT's MLM head has one GELU more
        want["Gelu"] = layers + (name == "bert")
    bad = [f"{op}: {ops.get(op, 0)}, expected {n}" for op, n in want.items()
           if ops.get(op, 0) != n]
    bad += [f"{op} left unfused ({ops[op]})" for op in ("Softmax", "IsNaN", "Sigmoid", "Pow",
                                                         "ReduceMean", "Erf", "Tanh")
            if ops.get(op)]
    if name == "llama":  # rotate_half's negation and concatenation
        bad += [f"{op} left unfused ({ops[op]})" for op in ("Neg", "Concat") if ops.get(op)]
    return bad


def slower(native: dict[str, Any], ours: dict[str, Any], top: int) -> list[dict[str, Any]]:
    """Kernels (by name) where ours spends more time per step than `native` (the native
    model's, or autograd's of our graph: then read "native" as autograd), most first."""
    a = {k["name"]: k for k in native["kernels"]}
    b = {k["name"]: k for k in ours["kernels"]}
    rows = [{"name": n, "kind": tk.kind_of(n),
             "native_ms": a[n]["ms"] if n in a else 0.0, "ours_ms": b[n]["ms"] if n in b else 0.0,
             "native_per_step": a[n]["per_step"] if n in a else 0,
             "ours_per_step": b[n]["per_step"] if n in b else 0}
            for n in a.keys() | b.keys()]
    for r in rows:
        r["diff_ms"] = r["ours_ms"] - r["native_ms"]
    return sorted((r for r in rows if r["diff_ms"] > 0), key=lambda r: -r["diff_ms"])[:top]


def kernel_lines(row: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for other, key in (("native", "slower"), ("autograd", "slower_than_autograd")):
        if key not in row:
            continue
        e, o = row["ops"][other], row["ops"]["ours"]
        lines += tk.side_by_side(f"{row['model']} (profiled steps)", e, o, (other, "ours"))
        lines.append(f"  where ours is slower: +ms, {other} ms (launches), ours ms (launches), "
                     "kind, kernel")
        lines += [f"  {r['diff_ms']:+7.3f} {r['native_ms']:7.3f} ({r['native_per_step']:3.0f}) "
                  f"{r['ours_ms']:7.3f} ({r['ours_per_step']:3.0f})  {r['kind']}: "
                  f"{r['name'][:100]}" for r in row[key]]
    return lines


def free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_model(name: str, args: argparse.Namespace, device: str) -> dict[str, Any]:
    cuda = device.startswith("cuda")
    started = time.perf_counter()
    module, shape = build(name, args.small, args.llama_layers)
    if args.batch:
        shape["batch"] = args.batch
    params = sum(p.numel() for p in module.parameters())
    x, y = batch_of(shape)
    row: dict[str, Any] = {"model": name, "batch": shape["batch"], "seq": shape["seq"],
                           "parameters": params, "config": shape["config"],
                           "device": torch.cuda.get_device_name() if cuda else "cpu",
                           "iterations": args.iterations, "precision": args.precision,
                           "loss_chunks": args.loss_chunks}
    print(f"{name}: {params / 1e6:.1f}M parameters, b{shape['batch']} s{shape['seq']}",
          flush=True)
    ours_module = copy.deepcopy(module)  # the Trainer starts from the same weights

    # ---- native eager
    step = native_step(module, device, args.precision)
    row["native_first_loss"] = float(step(x, y))
    row["native"] = nc.measure_step(lambda: step(x, y), args.iterations, warmup=1,
                                    device=device)
    row["native"]["loop_s"] = nc.measure_loop(lambda: step(x, y), args.iterations, device)
    if cuda and not args.no_ops:
        row["ops"] = {"native": tk.profiled(step, [(x, y)] * args.profiled)}
    step = module = None  # the native model's memory back before ours
    free(device)

    # ---- ours: the Trainer, all fast, its default run mode
    t0 = time.perf_counter()
    trainer = Trainer(ours_module, torch.optim.SGD(ours_module.parameters(), lr=LR),
                      tb.lm_loss, example=(x, y), ratio="1:0", device=device,
                      time_limit_s=120, plans_dir=tempfile.mkdtemp(),
                      precision=args.precision, loss_chunks=args.loss_chunks)
    row["trainer_setup_s"] = time.perf_counter() - t0
    graph = trainer.graph
    row["forward_ops"] = forward_ops(graph)
    row["fusion_problems"] = fusion_check(name, row["forward_ops"], shape["layers"])
    print(f"{name} imported forward: " + ", ".join(f"{op} {n}"
                                                  for op, n in row["forward_ops"].items()))
    print(f"{name} fusion: " + ("as intended" if not row["fusion_problems"] else
                                "; ".join(row["fusion_problems"])), flush=True)
    if args.small:
        assert not row["fusion_problems"], row["fusion_problems"]
    # eager, on the capture's stream: the outputs it copies into their slots, by op (a
    # replay repeats them; its trace names them only as the replay's)
    first: list[float] = []
    row["ours_slot_copies"] = tk.slot_copies(trainer, (x, y), first)
    row["ours_first_loss"] = first[0]
    print(f"{name} ours, outputs copied into their slots: " + (", ".join(
        f"{op} {n}" for op, n in row["ours_slot_copies"].items()) or "none"), flush=True)
    row["ours"] = nc.measure_step(lambda: trainer.step(x, y), args.iterations, warmup=2,
                                  device=device)  # the capture, then replays
    row["ours"]["loop_s"] = nc.measure_loop(lambda: trainer.step(x, y), args.iterations,
                                            device)
    row["ours_replayed"] = bool(getattr(trainer.loop.driver, "replayed", False))
    row["ours_describe"] = trainer.describe()
    row["ours_notes"] = list(trainer.notes)
    row["ours_predicted_s"] = trainer.plan.header.predicted_time_s
    if cuda and not args.no_ops:
        row["ops"]["ours"] = tk.profiled(trainer.step, [(x, y)] * args.profiled)
        row["slower"] = slower(row["ops"]["native"], row["ops"]["ours"], args.top)
    trainer = ours_module = None
    free(device)

    # ---- torch.autograd over our kernels, the same imported graph
    auto = eager.measure_autograd(graph, device=device, iterations=args.iterations, warmup=2)
    row["autograd"] = {"median_s": auto.median_s, "times_s": list(auto.iteration_times_s),
                       "peak_bytes": auto.peak_fast_bytes, "host_median_s": auto.host_median_s}
    step = eager.autograd_step(graph, device=device)
    step()  # warm: the loop and the profiled steps do not allocate the gradients first
    row["autograd"]["loop_s"] = nc.measure_loop(step, args.iterations, device)
    if cuda and not args.no_ops:  # where ours is slower than autograd of the same graph
        row["ops"]["autograd"] = tk.profiled(lambda x, y: step(), [(x, y)] * args.profiled)
        row["slower_than_autograd"] = slower(row["ops"]["autograd"], row["ops"]["ours"],
                                             args.top)
    step = graph = None
    free(device)

    ours_s, native_s, auto_s = (row[k]["median_s"] for k in ("ours", "native", "autograd"))
    row["ours_over_native"] = ours_s / native_s
    row["ours_over_autograd"] = ours_s / auto_s
    # back to back, as a training loop runs (`measure_loop`): the host's work before a replay
    # overlaps the step before
    row["loop_ours_over_autograd"] = row["ours"]["loop_s"] / row["autograd"]["loop_s"]
    row["at_native_speed"] = ours_s <= min(native_s, auto_s)
    row["wall_s"] = time.perf_counter() - started
    return row


def summary(row: dict[str, Any]) -> str:
    ms = {k: row[k]["median_s"] * 1e3 for k in ("native", "ours", "autograd")}
    return (f"{row['model']} b{row['batch']} s{row['seq']} ({row['parameters'] / 1e6:.0f}M): "
            f"native {ms['native']:.2f} ms, ours all-fast {ms['ours']:.2f} ms "
            f"(replayed {row['ours_replayed']}), autograd of our graph {ms['autograd']:.2f} ms; "
            f"ours / native {row['ours_over_native']:.3f}, ours / autograd "
            f"{row['ours_over_autograd']:.3f} (back to back: ours "
            f"{row['ours']['loop_s'] * 1e3:.2f} ms, autograd {row['autograd']['loop_s'] * 1e3:.2f}"
            f" ms, {row['loop_ours_over_autograd']:.3f}); first loss native "
            f"{row['native_first_loss']:.4f}"
            f" ours {row['ours_first_loss']:.4f}; {row['wall_s']:.0f} s")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--iterations", type=int, default=10, help="timed steps per side")
    p.add_argument("--profiled", type=int, default=3, help="steps in each kernel profile")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--no-ops", action="store_true", help="skip the kernel profiles")
    p.add_argument("--llama-layers", type=int, default=16)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: ours in bf16, native under torch.autocast(bf16)")
    p.add_argument("--batch", type=int, default=0, help="batch size (default: the model's)")
    p.add_argument("--loss-chunks", type=int, default=1,
                   help="ours: the output layer and its loss in this many blocks of tokens")
    p.add_argument("--small", action="store_true", help="tiny shapes on the CPU (a smoke "
                   "test: asserts the fusion; its times mean nothing)")
    args = p.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = set(names) - set(MODELS)
    if unknown:
        p.error(f"unknown model(s) {', '.join(sorted(unknown))}; choose from {MODELS}")
    device = "cpu" if args.small else "cuda"
    if not args.small:  # before CUDA starts, as the Trainer's default mode wants
        torch.backends.cudnn.benchmark = False
        use_replay_work_queues()
        print("\n".join(prepare_cuda(device, GPU_MODE, None)) or "placed allocator installed",
              flush=True)
    nc.DEV = device
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for name in names:
        row = run_model(name, args, device)
        rows.append(row)
        (args.out / "transformer_compare.json").write_text(json.dumps(rows, indent=1) + "\n")
        print(summary(row), flush=True)
        if "slower" in row:
            print("\n".join(kernel_lines(row)), flush=True)
    print("at native speed (ours <= native and <= autograd): " + ", ".join(
        f"{r['model']} {'yes' if r['at_native_speed'] else 'no'}" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
