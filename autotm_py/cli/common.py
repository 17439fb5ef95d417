"""Options and helpers shared by several commands."""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from autotm_py import api
from autotm_py.config import MAX_FOOTPRINT_BYTES, MAX_HEADROOM
from autotm_py.errors import ConfigError, MissingDependencyError
from autotm_py.fileio import write_problem
from autotm_py.ir import LOSSES
from autotm_py.options import (
    AUTO_PRECISION,
    OPTIMIZER_PLACES,
    OPTIMIZERS,
    PRECISION_CHOICES,
    SCRATCH_MODES,
    ModelOptions,
    RunMode,
    default_run_mode,
)
from autotm_py.plan import Plan
from autotm_py.units import format_bytes

F = TypeVar("F", bound=Callable[..., Any])

# Model options a command leaves unset (None) take the defaults of `options.ModelOptions`, or,
# for a command that reads a plan (simulate, run, report --model), the plan's
# (`PlanHeader.model`).
FROM_PLAN = ("Not given: the plan's, for commands that read a plan (simulate, run, report "
             "--model).")
# The model flags' parameters, and the `ModelOptions` field each one sets.
MODEL_FLAGS = {"batch": "batch", "dims": "dims", "training": "training",
               "optimizer": "optimizer", "loss": "loss", "loss_chunks": "loss_chunks",
               "channels_last": "channels_last", "no_fuse": "fuse", "precision": "precision",
               "optimizer_on": "host_updates", "host_share": "host_share"}


@dataclass(frozen=True)
class ModelArgs:
    """MODEL and its options as the command line gave them, built once per command: the
    options given (`given`, field names) and the defaults for the others."""

    model: str | None
    options: ModelOptions
    given: frozenset[str]

    def for_plan(self, plan: Plan | None) -> ModelOptions:
        """The options with those not given taken from `plan`'s header (its model options)."""
        return self.options.filled_from(plan.header.model if plan is not None else None,
                                        self.given)


def _model_args(model: str | None, flags: dict[str, Any]) -> ModelArgs:
    given = frozenset(MODEL_FLAGS[name] for name, value in flags.items()
                      if value not in (None, ()))
    options = ModelOptions(batch=flags["batch"], dims=parse_dims(flags["dims"]),
                           training=bool(flags["training"]), optimizer=flags["optimizer"],
                           fuse=not flags["no_fuse"], loss=flags["loss"],
                           loss_chunks=flags["loss_chunks"] or 1,
                           channels_last=bool(flags["channels_last"]),
                           precision=flags["precision"] or AUTO_PRECISION,
                           host_updates=flags["optimizer_on"] in ("host", "split"),
                           host_share=_host_share(flags["optimizer_on"], flags["host_share"]))
    return ModelArgs(model, options, given)


def _host_share(optimizer_on: str | None, host_share: float | None) -> float | None:
    """--host-share, which --optimizer-on split needs and nothing else takes."""
    if (optimizer_on == "split") != (host_share is not None):
        raise click.UsageError("--optimizer-on split takes --host-share F (the share of the "
                               "parameters the host updates, e.g. 0.7), and --host-share only "
                               "goes with it")
    return host_share


def _model_flags(argument: bool, optional: bool = False) -> list[Callable[[F], F]]:
    model = click.argument("model", required=not optional) if argument else click.option(
        "--model", default=None,
        help="Re-simulate the plan on this model (ONNX file or zoo name) for a time axis.")
    return [
        model,
        click.option("--batch", "-b", type=int, default=None,
                     help="Bind the first dimension of every input (the batch size). --batch "
                          "and --dim go together: given neither, a command that reads a plan "
                          "takes both from it."),
        click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
                     help="Bind a symbolic dimension (repeatable), e.g. --dim seq=128."),
        click.option("--training", is_flag=True, default=None,
                     help="One training iteration (forward, loss, backward, optimizer update) "
                          f"instead of inference. {FROM_PLAN}"),
        click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=None,
                     help=f"Weight update used with --training [default: sgd]. {FROM_PLAN}"),
        click.option(
            "--loss", type=click.Choice(LOSSES), default=None,
            help="Loss that --training appends when the model has none: auto (from the "
                 "output's shape: N x C classifiers and N x C x H x W per-pixel classes on "
                 "axis 1, N x T x V sequence models on the last axis), ce-axis1, ce-last "
                 "(softmax cross-entropy over that axis) or mse (mean squared error) [default: "
                 f"auto]. {FROM_PLAN} See docs/training.md."),
        click.option(
            "--loss-chunks", type=click.IntRange(min=1), default=None, metavar="N",
            help="With --training: a language model's output layer and its softmax "
                 "cross-entropy as one kernel that goes through the tokens in N blocks, so the "
                 "logits (tokens x vocabulary) never exist whole: what lets BERT-base or GPT-2 "
                 "small train in a quarter of their memory. 1 keeps the plain loss [default: "
                 f"1]. {FROM_PLAN} See docs/training.md."),
        click.option(
            "--channels-last/--no-channels-last", default=None,
            help="Store the convolutions' images N, H, W, C (torch's channels_last) instead of "
                 "N, C, H, W: cuDNN's fastest convolutions on tensor cores, with smaller "
                 "workspaces. Same bytes, so the same plans; its own kernel profiles (`autotm "
                 "profile --channels-last`). Models without convolutions are unchanged. Not "
                 "given: optimize, bench and inspect in GPU mode store a CNN channels-last "
                 "where the profiles that price it have its channels-last kernels, else N, C, "
                 f"H, W; profile: N, C, H, W. {FROM_PLAN} See docs/layout.md."),
        click.option(
            "--no-fuse", is_flag=True, default=None,
            help="Keep the graph unfused, as the file has it (by default scaled dot-product "
                 "attention, GELU, Linear layers and convolution + ReLU pairs become one "
                 f"kernel each; docs/fusion.md). {FROM_PLAN}"),
        *_precision_flags(),
    ]


def _precision_flags() -> list[Callable[[F], F]]:
    """--precision and --optimizer-on: what the iteration computes in, and where."""
    return [
        click.option(
            "--precision", type=click.Choice(PRECISION_CHOICES), default=None,
            help="fp32, or bf16 as torch.autocast(bfloat16) runs it: matrix products, "
                 "convolutions and attention in bf16 through bf16 copies of their inputs; "
                 "softmax, normalization statistics, sums and the loss in fp32; fp32 master "
                 "weights and optimizer state. auto: the device's default, bf16 on a GPU "
                 "and fp32 on the CPU [default: auto]. "
                 f"{FROM_PLAN} See docs/precision.md."),
        click.option(
            "--optimizer-on", type=click.Choice(OPTIMIZER_PLACES), default=None,
            help="With --training: where the optimizer updates run. gpu: on the GPU, on its "
                 "weights, gradients and optimizer state, moved in and out as the plan says; "
                 "host: on the host's cores (a vectorised AdamW or SGD), as gradients arrive, "
                 "the GPU streaming only the weights its kernels read in and their gradients "
                 "out: for models whose optimizer state does not fit the budget; split: the "
                 "host those of the first gradients the backward pass makes, the GPU the last "
                 "ones' (--host-share) [default: gpu]. "
                 f"{FROM_PLAN} See docs/training-loop.md."),
        click.option(
            "--host-share", type=click.FloatRange(0, 1, min_open=True, max_open=True),
            default=None, metavar="F",
            help="With --optimizer-on split: the share of the parameters whose updates the "
                 "host runs (the GPU runs those of the last gradients). The Trainer's "
                 "optimizer_on='split' finds one itself."),
    ]


def model_options(func: F | None = None, *, argument: bool = True,
                  optional: bool = False) -> Any:
    """MODEL (an argument, optional with `optional` for a command that reads a plan, which
    records its model; or with `argument=False` an optional --model) and --batch, --dim,
    --training, --optimizer, --loss, --loss-chunks, --channels-last, --no-fuse, --precision,
    given to the command as one `ModelArgs` in its `model` parameter."""

    def wrap(command: F) -> F:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            flags = {name: kwargs.pop(name) for name in MODEL_FLAGS}
            kwargs["model"] = _model_args(kwargs.pop("model"), flags)
            return command(*args, **kwargs)

        for deco in reversed(_model_flags(argument, optional)):
            wrapper = deco(wrapper)
        return wrapper  # type: ignore[return-value]

    return wrap if func is None else wrap(func)


@dataclass(frozen=True)
class RunModeArgs:
    """--arena, --placed, --scratch and --replay as the command line gave them (None: not
    given), resolved against a default run mode: the device's (`options.default_run_mode`) for
    commands that plan, the plan's for `run`."""

    arena: bool | None = None
    placed: bool | None = None
    scratch: str | None = None
    replay: bool | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.arena, self.placed, self.scratch, self.replay))

    def over(self, base: RunMode) -> RunMode:
        """`base` with the flags given instead of its values."""
        return RunMode(arena=base.arena if self.arena is None else self.arena,
                       placed=base.placed if self.placed is None else self.placed,
                       scratch=base.scratch if self.scratch is None else self.scratch,
                       replay=base.replay if self.replay is None else self.replay)

    def for_device(self, device: str) -> RunMode:
        """The run mode a command that plans for `device` uses: the device's default with the
        flags given; --arena and --replay asked for host mode are a one-line error."""
        if not str(device).startswith("cuda") and (self.arena or self.replay):
            flag = "--arena" if self.arena else "--replay"
            raise ConfigError(f"{flag} is for the GPU mode (plans at planned GPU addresses, "
                              "replayed as CUDA graphs): add --device cuda, or drop it")
        return self.over(default_run_mode(device))


def run_mode_options(*, scratch: bool, of_plan: bool = False) -> Callable[[F], F]:
    """--arena/--no-arena, --placed/--no-placed, --scratch (where `scratch`: commands that
    plan) and --replay/--no-replay (alias --graph), given to the command as one `RunModeArgs`
    in its `mode` parameter: how a plan runs, and is priced for. Not given: on a GPU all of
    them (`options.default_run_mode`), in host mode none; `of_plan` (`run`): the plan's."""
    default = "the plan's run mode (header `run`), without the replay off CUDA" if of_plan \
        else "on with --device cuda, off with --device cpu"
    flags = [
        click.option(
            "--arena/--no-arena", default=None,
            help="GPU: every fast-memory tensor at a planned offset in one arena. optimize "
                 "packs it into the budget (re-solving tighter where it does not fit), so the "
                 "plan needs no --headroom; run serves it (a plan without one is packed "
                 f"first and may need more than its budget). [default: {default}]"),
        click.option(
            "--placed/--no-placed", default=None,
            help="With --arena on CUDA: kernels allocate their outputs at their planned slots "
                 "(a C allocator compiled at first use); --no-placed copies them there (plan "
                 f"and run alike: a plan for one runs best the same way). [default: {default}]"),
        click.option(
            "--replay/--no-replay", "--graph", "replay", default=None,
            help="CUDA: capture the steady-state iteration once as a CUDA graph and replay it "
                 "(optimize prices it so: kernels at their device times, no host dispatch). "
                 "With an arena it replays there, and under a cap its capture may hold up to "
                 "256 MiB more, once (reported); without one it replays with static inputs on "
                 "torch's allocator and needs --headroom, as an eager plan does. A kernel that "
                 "cannot be captured makes the run eager, with a note naming it. --graph is "
                 f"its older name. [default: {default}]"),
    ]
    if scratch:
        flags.append(click.option(
            "--scratch", type=click.Choice(SCRATCH_MODES), default=None,
            help="With --arena and --placed: where kernels' workspaces and the outputs they "
                 "allocate beside their slots live. windows: a window inside the arena for "
                 "each kernel with 1 MiB of scratch or more, live only while it runs; region: "
                 "one region beside the arena, as large as the largest kernel's, for the whole "
                 "iteration; auto: windows with --arena and --placed, else the region "
                 "[default: auto]."))

    def wrap(command: F) -> F:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs["mode"] = RunModeArgs(arena=kwargs.pop("arena"), placed=kwargs.pop("placed"),
                                         scratch=kwargs.pop("scratch", None),
                                         replay=kwargs.pop("replay"))
            return command(*args, **kwargs)

        for deco in reversed(flags):
            wrapper = deco(wrapper)
        return wrapper  # type: ignore[return-value]

    return wrap


headroom_option = click.option(
    "--headroom", type=click.FloatRange(0, MAX_HEADROOM, max_open=True), default=0.0,
    show_default=True,
    help="Share of the budget the plan leaves free for the allocator's fragmentation (the ILP "
         "counts live bytes; a real heap needs more). Try 0.1 when `autotm run` reports "
         "allocator retries or runs out of memory under the cap.")
gpu_option = click.option(
    "--gpu", default=None, metavar="NAME",
    help="GPU mode: price with the profiles of this GPU (its name, or a part of one that "
         "names one GPU with shipped or cached profiles: h100, h200), to plan here for the GPU "
         "that will run the plan [default: this machine's GPU, else the shipped H100 "
         "profiles]. The plan records it; simulate and report price the plan the same.")
reserve_option = click.option(
    "--reserve", default=None, metavar="BYTES",
    help="Fast memory the runtime keeps for itself whatever the plan, taken out of the budget "
         "before the plan's tensors [default: the memory system's runtime_reserve_bytes: "
         "68MiB for h100-pcie5 (torch's cuBLAS workspaces), 0 in host mode]. --reserve 0 "
         "plans the tensors alone (docs/memory-systems.md).")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print machine-readable JSON instead of tables.")


def budget_parts(budget: int, reserve: int, plannable: int | None, scratch: int = 0) -> str:
    """'68.00 MiB runtime reserve + 7.85 MiB headroom + 81.95 MiB for the plan's tensors';
    `scratch` (arena mode: the scratch region and bytes held back for the packing) is named
    between the headroom and the tensors."""
    tensors = max(plannable or 0, 0)
    headroom = max(budget - reserve - scratch - tensors, 0)
    region = f"{format_bytes(scratch)} arena scratch + " if scratch else ""
    text = (f"{format_bytes(reserve)} runtime reserve + {format_bytes(headroom)} headroom + "
            f"{region}{format_bytes(tensors)} for the plan's tensors")
    if reserve > budget:
        text += " (the reserve alone exceeds the budget)"
    return text


def fast_peak_line(peak: int, budget: int | None, reserve: int, plannable: int | None) -> str:
    """The fast-tier peak of a plan's tensors against what they may use and the budget."""
    if budget is None:
        return f"fast peak  {format_bytes(peak)}"
    if reserve == 0 and plannable == budget:
        return f"fast peak  {format_bytes(peak)} of the {format_bytes(budget)} budget"
    return (f"fast peak  {format_bytes(peak)} of the {format_bytes(plannable or 0)} for tensors "
            f"({format_bytes(peak + reserve)} with the reserve, budget {format_bytes(budget)})")


def parse_dims(values: Sequence[str] | None) -> dict[str, int]:
    """['batch=32', 'seq=128'] -> {'batch': 32, 'seq': 128}; a bad item is a ConfigError."""
    dims: dict[str, int] = {}
    for item in values or ():
        name, sep, value = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            number = int(value)
            if number <= 0:
                raise ValueError
        except ValueError:
            raise ConfigError(f"--dim {item!r}: expected NAME=VALUE with a positive integer, e.g. "
                              "--dim batch=32") from None
        dims[name.strip()] = number
    return dims


def load_priced(args: ModelArgs, device: str, *, gpu: str | None = None,
                profiles_dir: str | None = None) -> tuple[Any, Any]:
    """MODEL's graph (in `device`'s default precision unless --precision is given) and its
    costs on `device`, for a command that plans (`priced`)."""
    return priced(args, load_model_from_cli(args, device=device), device, gpu=gpu,
                  profiles_dir=profiles_dir)


def priced(args: ModelArgs, graph: Any, device: str, *, gpu: str | None = None,
           profiles_dir: str | None = None) -> tuple[Any, Any]:
    """`graph` (MODEL's) and its costs on `device`: in GPU mode, unless --channels-last or
    --no-channels-last is given, in the layout GPU plans default to (`api.default_layout`:
    channels-last where the profiles have the model's kernels so)."""
    costs = api.load_costs(graph, device=device, profiles_dir=profiles_dir, gpu=gpu)
    if device == "cuda" and "channels_last" not in args.given:
        graph, costs = api.default_layout(graph, costs, profiles_dir=profiles_dir, gpu=gpu)
    return graph, costs


def load_model_from_cli(args: ModelArgs, plan: Plan | None = None, *,
                        device: str | None = None) -> Any:
    """The graph that MODEL (an ONNX file or a zoo name) and the model options describe.

    MODEL not given: the model `plan` records (`plan_source`). Options left unset take their
    defaults, or with `plan` the values recorded in its header
    (`PlanHeader.model`; --batch and --dim together: given neither, both come from the plan),
    so that `simulate`, `run` and `report --model` rebuild the graph the plan was made for.
    --precision auto (not given, and no plan's) is `device`'s (default: the plan's device;
    fp32 for a plan that records no model options, made before precisions, or none).
    With `plan`, the graph is checked against it (`Plan.validate`: a mismatch names the
    options that differ)."""
    model = args.model if args.model is not None else plan_source(plan)
    device = device or (plan.header.device if plan is not None and plan.header.model
                        else "cpu")
    graph = api.load_model(model, args.for_plan(plan).on(device))
    check_footprint(graph)
    dropped = (graph.meta.get("training") or {}).get("dropped_output")
    if dropped and plan is None:  # said once, where the graph is made for a new plan
        warn(f"training on the logits: the model's final {dropped['op']} "
             f"{dropped['name']!r} is left out of the training graph (docs/training.md)")
    if plan is not None:  # the order and split it was made for (`optimize`'s defaults)
        graph = api.planned_graph(graph, plan)
        plan.validate(graph)
    return graph


def plan_source(plan: Plan | None) -> str:
    """The model `plan` was made for (`PlanHeader.source`), where MODEL is not given."""
    if plan is None:
        raise ConfigError("no model given: name an ONNX file or a zoo model")
    source = plan.header.source
    if source is None:
        raise ConfigError("the plan does not record its model (made before plans did, or from "
                          "a graph built in Python): name it, e.g. `... MODEL --plan PLAN`")
    if os.sep in source and not os.path.exists(source):
        raise ConfigError(f"the plan was made for {source}, which is not there any more: name "
                          "the model file, e.g. `... MODEL --plan PLAN`")
    return source


def check_footprint(graph: Any) -> None:
    """Refuse a model whose unconstrained peak exceeds any machine's memory: a typo in --batch
    or --dim (e.g. --dim batch=100000000) would otherwise be planned without a word."""
    peak = int(graph.peak_live_bytes)
    if peak > MAX_FOOTPRINT_BYTES:
        dims = " ".join(f"{k}={v}" for k, v in (graph.meta.get("dims") or {}).items())
        raise ConfigError(f"{graph.name}: one iteration needs {format_bytes(peak)} at its peak "
                          f"({dims or 'the dims of the file'}), more than "
                          f"{format_bytes(MAX_FOOTPRINT_BYTES)}, the most memory one machine "
                          "has; check --batch and --dim")


def check_writable(path: str | None, flag: str, *, directory: bool = False) -> None:
    """Refuse an output path that cannot be written, before any long work starts."""
    if path is None:
        return
    why = write_problem(path, directory=directory)
    if why is not None:
        raise ConfigError(f"{flag} {path}: cannot write there ({why}); give a path in a "
                          "writable folder")


def warn(message: str) -> None:
    """One line on stderr, beside the command's output."""
    click.echo(f"warning: {message}", err=True)


def require(module: str, needed_by: str) -> None:
    """Stop at once, in one line naming the extra to install, when `module` is missing (before
    a model is loaded or a plan read, not after)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != module:
            raise
        raise MissingDependencyError(module, needed_by) from None


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
