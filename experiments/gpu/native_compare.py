"""What a PyTorch user runs today, beside our executor, on the same GPU in the same process.

For each model (same shapes, fp32, SGD, one training iteration):
- native eager: torchvision ResNet-200 / DenseNet-264 / VGG19 / ResNet-50, HF BertForMaskedLM /
  GPT2LMHeadModel (SDPA attention), built from config with random weights, and the corpus
  U-Net (`unet_small`: the torch module models/corpus/make_corpus.py exports, per-pixel
  cross-entropy as our `--loss auto` gives it) and LSTM classifier (`lstm_classifier`, token
  ids in, cross-entropy on its classes), whose exported files our side loads (written into
  OUT_DIR/corpus at the benchmark scale if absent);
- native activation checkpointing under a cap of budget + 64 MiB (expandable segments), at the
  fewest segments that fit: `checkpoint_sequential` over the CNN's blocks, HF
  `gradient_checkpointing_enable()` for the transformers, `torch.utils.checkpoint` around each
  of the U-Net's five double convolutions and around the LSTM classifier's `nn.LSTM`;
- ours: the all-fast plan through the executor (the graph as imported, fused by default), the
  same plan replayed as a CUDA graph (`--replay --no-cap`: static inputs, kernels' outputs from
  the graph's pool) and at planned addresses replayed (`--replay --arena`), our kernels under torch
  autograd, and our graph with checkpointed segments under the same cap
  (`runtime.eager.fit_checkpointing`);
- with `--compile F1,F2`: torch.compile of the native model with
  `torch._functorch.config.activation_memory_budget` at the first of these fractions that fits
  the same cap (each try compiles anew: minutes for ResNet-200);
- per aten op: self CUDA time of one iteration under the torch profiler, native vs executor.

`--channels-last`: the CNNs' images and weights stored N, H, W, C on both sides (the native
model `.to(memory_format=torch.channels_last)` with channels-last inputs, as PyTorch's
performance guide advises; our graph loaded with `channels_last=True`, docs/layout.md).

    python3 experiments/gpu/native_compare.py OUT_DIR [--models resnet200,bert_base]
        [--shares 0.5,0.25] [--iterations 10] [--no-fuse] [--small] [--no-ops]
        [--compile 0.5,0.2] [--no-native-checkpoint] [--no-ours] [--channels-last]

Writes OUT_DIR/native_compare.json (rows and op tables) and prints a summary. `--small` runs
tiny shapes (a smoke test of the script itself; its times mean nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# The native models and `measure_native` need only torch (and torchvision / transformers):
# experiments/gpu/recompute_check.py imports them on a machine without PuLP, so the planner's
# modules (api, pipeline) are imported inside the functions that use them.
from autotm_py.runtime import eager  # noqa: E402
from autotm_py.runtime.device import apply_cap, configure_cuda, release_cap  # noqa: E402

# model -> (batch, dims) as in experiments/gpu/configs.sh; --small shrinks them
SHAPES = {"resnet200": (32, {}), "densenet264": (32, {}), "inception_v4": (64, {}),
          "vgg19": (64, {}), "resnet50": (32, {}),
          "bert_base": (16, {"seq": 512}), "gpt2_small": (8, {"seq": 1024})}
SHAPES["unet_small"] = (32, {})
SHAPES["lstm_classifier"] = (64, {})
SMALL = {"resnet200": (2, {}), "densenet264": (2, {}), "inception_v4": (2, {}), "vgg19": (2, {}),
         "resnet50": (2, {}), "unet_small": (2, {}), "lstm_classifier": (4, {}),
         "bert_base": (2, {"seq": 64}), "gpt2_small": (2, {"seq": 64})}
SEGMENTS = (2, 3, 4, 6, 8, 12, 16, 24, 33, 48)
# torchvision models: native checkpointing with checkpoint_sequential
CNNS = ("resnet200", "densenet264", "vgg19", "resnet50")
SLACK = 64 << 20
DEV = "cuda:0"
# corpus models (models/corpus/make_corpus.py): the torch module is the native model, the
# exported file ours; the checkpointed blocks are the module's children of these names
CORPUS = {"unet_small": ("enc1", "enc2", "mid", "dec2", "dec1"), "lstm_classifier": ("lstm",)}
SCALE = "gpu"  # the corpus's scale: --small exports and builds them small
CHANNELS_LAST = False  # --channels-last: the CNNs stored N, H, W, C on both sides


# ---- native models -------------------------------------------------------------------------
def native_model(name: str, batch: int, dims: dict[str, int]):
    """(module, make_batch, loss_of(module, batch)) for a native PyTorch user's model."""
    if name in CORPUS:
        return corpus_model(name, batch)
    if name in CNNS:
        import torchvision

        if name == "resnet200":
            from torchvision.models.resnet import Bottleneck
            net = torchvision.models.ResNet(Bottleneck, [3, 24, 36, 3])
        elif name == "vgg19":
            net = torchvision.models.vgg19()
        elif name == "resnet50":
            net = torchvision.models.resnet50()
        else:
            net = torchvision.models.DenseNet(growth_rate=32, block_config=(6, 12, 64, 48),
                                              num_init_features=64)

        layout = torch.channels_last if CHANNELS_LAST else torch.contiguous_format
        net = net.to(memory_format=layout)

        def make():
            return (torch.randn(batch, 3, 224, 224, device=DEV).contiguous(memory_format=layout),
                    torch.randint(0, 1000, (batch,), device=DEV))

        def loss(m, b):
            return torch.nn.functional.cross_entropy(m(b[0]), b[1])
        return net, make, loss
    import transformers

    seq = dims["seq"]
    if name == "bert_base":
        cfg = transformers.BertConfig(attn_implementation="sdpa")
        net = transformers.BertForMaskedLM(cfg)
    else:
        cfg = transformers.GPT2Config(n_positions=max(1024, seq), attn_implementation="sdpa")
        net = transformers.GPT2LMHeadModel(cfg)
    net.config.use_cache = False

    def make():
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=DEV)
        return ids, ids

    def loss(m, b):
        return m(input_ids=b[0], labels=b[1]).loss
    return net, make, loss


def _make_corpus():
    sys.path.insert(0, str(ROOT / "models" / "corpus"))
    import make_corpus
    return make_corpus


def corpus_model(name: str, batch: int):
    """The corpus model's torch module at SCALE, its input shape with the batch replaced, and
    the loss our training graph appends (cross-entropy over the class axis, per position)."""
    make_corpus = _make_corpus()
    spec = next(s for s in make_corpus.SPECS if s.name == name)
    torch.manual_seed(0)
    net = spec.build(SCALE)
    ((shape, dtype, high),) = spec.inputs(SCALE).values()

    def inputs(count: int, device=DEV):
        if dtype.is_floating_point:
            return torch.randn(count, *shape[1:], device=device)
        return torch.randint(0, high, (count, *shape[1:]), device=device)  # token ids
    with torch.no_grad():  # the output's classes and positions, for the labels
        _, classes, *positions = net(inputs(1, "cpu")).shape

    def make():
        return inputs(batch), torch.randint(0, classes, (batch, *positions), device=DEV)

    def loss(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])
    return net, make, loss


def corpus_file(name: str, folder: Path) -> Path:
    """The corpus model exported at SCALE into `folder` (once), for our side to load."""
    path = folder / f"{name}.onnx"
    if not path.exists():
        _make_corpus().main(["--out", str(folder), "--scale", SCALE, "--only", name])
    return path


class Checkpointed(torch.nn.Module):
    """A block run under torch.utils.checkpoint: its inside recomputed in backward."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        return checkpoint(self.block, x, use_reentrant=False)


def checkpoint_children(net, names) -> None:
    for child in names:
        setattr(net, child, Checkpointed(getattr(net, child)))


def cnn_sequential(net) -> torch.nn.Sequential:
    """The torchvision CNN as a flat sequence of blocks, for checkpoint_sequential."""
    if hasattr(net, "layer1"):
        blocks = [net.conv1, net.bn1, net.relu, net.maxpool]
        for layer in (net.layer1, net.layer2, net.layer3, net.layer4):
            blocks += list(layer)
        return torch.nn.Sequential(*blocks, net.avgpool, torch.nn.Flatten(), net.fc)
    blocks = list(net.features)  # VGG's layers, DenseNet's blocks: checkpointable pieces
    if isinstance(net.classifier, torch.nn.Sequential):  # VGG
        return torch.nn.Sequential(*blocks, net.avgpool, torch.nn.Flatten(), *net.classifier)
    return torch.nn.Sequential(*blocks, torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), net.classifier)


def _alloc_retries() -> int:
    """torch's allocator retries so far (none under the placed allocator, which keeps no
    torch statistics)."""
    from autotm_py.runtime import placed

    if placed.active() is not None:
        return 0
    return torch.cuda.memory_stats().get("num_alloc_retries", 0)


def measure_step(step: Callable[[], Any], iterations: int, warmup: int = 2,
                 device: str | None = None) -> dict[str, Any]:
    """`step` run `iterations` times after `warmup`: the median and each run's seconds (CUDA
    events), the allocated and reserved peaks (torch's allocator's, or the placed allocator's
    in a process that installed it: `runtime.device.peaks`), and the allocator's retries
    during the runs. On the CPU (`device` "cpu": a script's smoke test) wall seconds and no
    memory figures."""
    from autotm_py.runtime.device import peaks, reset_peaks

    device = device or DEV
    if not device.startswith("cuda"):
        for _ in range(warmup):
            step()
        times = []
        for _ in range(iterations):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        return {"median_s": statistics.median(times), "times_s": times, "peak_bytes": None,
                "reserved_peak_bytes": None, "alloc_retries": 0}
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    reset_peaks(device)
    retries = _alloc_retries()
    times = []
    for _ in range(iterations):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    allocated, reserved = peaks(device)
    return {"median_s": statistics.median(times), "times_s": times,
            "peak_bytes": int(allocated), "reserved_peak_bytes": int(reserved),
            "alloc_retries": _alloc_retries() - retries}


def measure_loop(step: Callable[[], Any], iterations: int, device: str | None = None
                 ) -> float:
    """Seconds per step of `iterations` steps run back to back, as a training loop runs them:
    one pair of CUDA events around them all and one wait at the end, so that the host's work
    before a step overlaps the GPU's work of the step before (`measure_step` waits after each
    step, and the host's work before a step then counts in full: a replay's uploads, a
    compiled graph's guards). Wall seconds on the CPU."""
    device = device or DEV
    if not device.startswith("cuda"):
        started = time.perf_counter()
        for _ in range(iterations):
            step()
        return (time.perf_counter() - started) / iterations
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iterations):
        step()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / 1e3 / iterations


def timed(step: Callable[[], None], iterations: int, warmup: int = 2) -> tuple[float, int]:
    """Median seconds of `step` (CUDA events) and the peak allocated bytes over the runs."""
    measured = measure_step(step, iterations, warmup)
    return measured["median_s"], measured["peak_bytes"]


def native_step(name, net, make, loss, segments: int | None):
    opt = torch.optim.SGD(net.parameters(), lr=0.01, foreach=True)
    batch = make()
    seq = cnn_sequential(net) if segments and name in CNNS else None
    if segments and name in CORPUS:
        checkpoint_children(net, CORPUS[name])
    elif segments and seq is None:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def step():
        opt.zero_grad(set_to_none=True)
        if seq is not None:
            from torch.utils.checkpoint import checkpoint_sequential
            logits = checkpoint_sequential(seq, segments, batch[0], use_reentrant=False)
            value = torch.nn.functional.cross_entropy(logits, batch[1])
        else:
            value = loss(net, batch)
        value.backward()
        opt.step()
    return step


def segment_counts(name: str, budget: int | None) -> tuple[int | None, ...]:
    """None: eager. A CNN tries the segment counts its block sequence allows; a transformer
    has one checkpointed form (HF checkpoints every layer), so has a corpus model (each of
    its blocks checkpointed)."""
    if budget is None:
        return (None,)
    if name in CNNS:
        blocks = len(cnn_sequential(native_model(name, 1, {})[0]))
        return tuple(s for s in SEGMENTS if s <= blocks)
    return (1,)


NO_NATIVE = {"inception_v4"}  # torchvision has Inception-v3 only: our runs alone


def out_of_place_relus(net):
    """torchvision's VGG19 has ReLU(inplace=True) right after a segment boundary of
    `checkpoint_sequential`, which overwrites the saved segment input ("modified by an inplace
    operation" in backward); a user checkpointing it turns inplace off, as we do here."""
    for module in net.modules():
        if isinstance(module, torch.nn.ReLU):
            module.inplace = False


def measure_native(name, batch, dims, iterations, budget=None):
    """Eager (budget None) or the fewest-segment checkpointed run that fits the budget."""
    if name in NO_NATIVE:
        return {"median_s": None, "note": "no native model"}
    counts = segment_counts(name, budget)
    missed = []
    for segments in counts:
        net, make, loss = native_model(name, batch, dims)
        net = net.to(DEV).train()
        if budget is not None and name == "vgg19":
            out_of_place_relus(net)
        torch.cuda.empty_cache()
        cap = apply_cap(budget, DEV, budget is not None, SLACK)
        try:
            measured = measure_step(native_step(name, net, make, loss, segments), iterations)
            row = {"median_s": measured["median_s"], "peak_bytes": measured["peak_bytes"],
                   "reserved_peak_bytes": measured["reserved_peak_bytes"],
                   "segments": segments, "cap": cap}
            if missed:
                row["out_of_memory_at"] = missed
            return row
        except torch.OutOfMemoryError:
            missed.append(segments)
        finally:
            if cap is not None:
                release_cap(DEV)
            del net
            torch.cuda.empty_cache()
    return {"median_s": None, "out_of_memory_at": missed}


def compiled_step(net, make, loss):
    """One SGD step of torch.compile(net) (compiled at the first call)."""
    net = net.to(DEV).train()
    compiled = torch.compile(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, foreach=True)
    data = make()

    def step():
        opt.zero_grad(set_to_none=True)
        loss(compiled, data).backward()
        opt.step()
    return step


def measure_compiled(name, batch, dims, iterations, budget, fractions):
    """torch.compile of the native model with `activation_memory_budget` (the partitioner's
    knapsack over saved activations), under the same cap as the checkpointed runs: the first
    fraction in `fractions` whose run fits. Each try compiles anew (minutes for a big CNN)."""
    import torch._dynamo
    import torch._functorch.config as functorch_config

    tried = []
    for fraction in fractions:
        torch._dynamo.reset()
        functorch_config.activation_memory_budget = fraction
        step = compiled_step(*native_model(name, batch, dims))
        torch.cuda.empty_cache()
        cap = apply_cap(budget, DEV, True, SLACK)
        try:
            started = time.perf_counter()
            step()
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - started
            t, peak = timed(step, iterations)
            return {"median_s": t, "peak_bytes": peak, "activation_memory_budget": fraction,
                    "compile_s": compile_s, "cap": cap, "out_of_memory_at": tried}
        except torch.OutOfMemoryError:
            tried.append(fraction)
        finally:
            release_cap(DEV)
            functorch_config.activation_memory_budget = 1.0
            del step
            torch.cuda.empty_cache()
    return {"median_s": None, "out_of_memory_at": tried}


# ---- ours ----------------------------------------------------------------------------------
def measure_ours(graph, iterations, budgets):
    from autotm_py import api, pipeline
    from autotm_py.options import RunMode

    plan = pipeline.all_fast_plan(graph)
    run = api.execute(graph, plan, device=DEV, iterations=iterations, warmup=2, capped=False)
    auto = eager.measure_autograd(graph, device=DEV, iterations=iterations, warmup=2)
    # its iteration replayed as one CUDA graph (issue 14): uncapped, with static inputs (no
    # output copied into a slot), and at planned addresses in an arena (outputs of kernels
    # that cannot write in place copied into their slots) to show what those copies cost
    replay = api.execute(graph, plan, device=DEV, iterations=iterations, warmup=2,
                         mode=RunMode(replay=True), capped=False)
    placed = api.execute(graph, plan, device=DEV, iterations=iterations, warmup=2,
                         mode=RunMode(arena=True, placed=False, replay=True), capped=False)
    out = {"executor_all_fast_s": run.median_s, "executor_peak_bytes": run.peak_fast_bytes,
           "executor_host_s": run.host_median_s, "autograd_s": auto.median_s,
           "autograd_peak_bytes": auto.peak_fast_bytes,
           "graph_s": replay.median_s if replay.replayed else None,
           "graph_peak_bytes": replay.peak_fast_bytes, "graph_notes": list(replay.notes),
           # a replay allocates nothing: the graph's memory is what the allocator holds
           # while it replays (its private pool, the static inputs), and held while capturing
           "graph_reserved_bytes": replay.reserved_peak_bytes,
           "graph_capture_reserved_bytes": replay.capture_reserved_bytes,
           "graph_arena_s": placed.median_s if placed.replayed else None,
           "graph_arena_copied": placed.copied_outputs,
           "checkpoint": {}}
    for share, budget in budgets.items():
        fit = eager.fit_checkpointing(graph, budget, device=DEV, iterations=iterations)
        out["checkpoint"][share] = None if fit is None else {
            "median_s": fit.median_s, "peak_bytes": fit.peak_fast_bytes,
            "segments": int(fit.strategy.rsplit("-", 1)[1]), "notes": list(fit.notes)}
    return out


# ---- per-op profile ------------------------------------------------------------------------
def op_table(step: Callable[[], None]) -> dict[str, float]:
    """Self CUDA seconds per aten op over one iteration (after a warm-up)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for ev in prof.key_averages():
        total = getattr(ev, "self_device_time_total", None)
        total = ev.self_cuda_time_total if total is None else total
        if total and ev.key.startswith("aten::"):
            out[ev.key] = out.get(ev.key, 0.0) + total / 1e6
    return out


def profile_ops(name, batch, dims, graph) -> dict[str, dict[str, float]]:
    from autotm_py import pipeline

    net, make, loss = native_model(name, batch, dims)
    net = net.to(DEV).train()
    native = op_table(native_step(name, net, make, loss, None))
    del net
    torch.cuda.empty_cache()
    from autotm_py.runtime.execute import new_executor

    _, executor, _ = new_executor(graph, pipeline.all_fast_plan(graph), DEV)

    def ours():
        executor.prepare()
        executor.run()
    mine = op_table(ours)
    torch.cuda.empty_cache()
    keys = sorted(native.keys() | mine.keys(),
                  key=lambda k: -max(native.get(k, 0.0), mine.get(k, 0.0)))
    return {k: {"native_s": native.get(k, 0.0), "ours_s": mine.get(k, 0.0)} for k in keys}


def main() -> int:
    from autotm_py import api, pipeline
    from autotm_py.config import PlanConfig
    from autotm_py.units import parse_ratio

    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", default="resnet200,densenet264,bert_base,gpt2_small")
    parser.add_argument("--shares", default="0.5,0.25", help="budgets: shares of our peak")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--no-fuse", action="store_true")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--no-ops", action="store_true", help="skip the per-op profile")
    parser.add_argument("--compile", default="", metavar="FRACTIONS",
                        help="also torch.compile the native model under each budget's cap "
                             "with these activation_memory_budget values, first that fits "
                             "(e.g. 0.5,0.2; minutes of compiling each)")
    parser.add_argument("--no-native-checkpoint", action="store_true")
    parser.add_argument("--channels-last", action="store_true",
                        help="the CNNs' images and weights stored N, H, W, C, native and ours")
    parser.add_argument("--no-ours", action="store_true",
                        help="skip our executor's runs (e.g. torch.compile beside plans "
                             "replayed by replay_busy.py in the same call)")
    args = parser.parse_args()
    global CHANNELS_LAST, SCALE
    CHANNELS_LAST = args.channels_last
    SCALE = "small" if args.small else "gpu"
    configure_cuda(deterministic=False)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        batch, dims = (SMALL if args.small else SHAPES)[name]
        started = time.perf_counter()
        source = str(corpus_file(name, args.out / "corpus")) if name in CORPUS else name
        graph = api.load_model(source, batch=batch, dims=dims, training=True,
                               fuse=not args.no_fuse, channels_last=args.channels_last)
        budgets = {}
        for share in filter(None, args.shares.split(",")):  # --shares "": no budgets
            frac = float(share)
            ratio = parse_ratio(f"{frac}:{1 - frac}")
            budgets[share] = pipeline.machine_for(
                graph, PlanConfig(ratio=ratio), api.load_costs(graph)).user_budget
        row = {"model": name, "batch": batch, "dims": dims, "fused": not args.no_fuse,
               "channels_last": args.channels_last,
               "budgets": budgets, "device": torch.cuda.get_device_name(0),
               "native_eager": measure_native(name, batch, dims, args.iterations),
               "native_checkpoint": {} if args.no_native_checkpoint else
               {s: measure_native(name, batch, dims, args.iterations, b)
                for s, b in budgets.items()},
               "ours": None if args.no_ours else measure_ours(graph, args.iterations, budgets)}
        if args.compile:
            fractions = [float(f) for f in args.compile.split(",")]
            row["native_compiled"] = {s: measure_compiled(name, batch, dims, args.iterations,
                                                          b, fractions)
                                      for s, b in budgets.items()}
        if not args.no_ops:
            row["ops"] = profile_ops(name, batch, dims, graph)
        row["wall_s"] = time.perf_counter() - started
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "ops"}), flush=True)
        (args.out / "native_compare.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
