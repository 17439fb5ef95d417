"""The Plan: one versioned JSON document, a header and an ordered list of small records.

Records (executed in order by `interpreter.PlanInterpreter` subclasses):

- ``Compute(kernel, placement)``: run a kernel. `placement` gives the tier of each IO slot
  (inputs then outputs, as in `Kernel.io`); every input must be resident there, and each output
  is created there. In GPU mode every slot is ``fast``.
- ``Move(tensor, to, mode, overlaps)``: copy a tensor into tier `to` from the other tier, where it
  must be resident. Afterwards it is resident in both tiers; an eviction is a Move to ``slow``
  followed by a Free of the fast copy. ``mode="sync"`` blocks compute until done.
  ``mode="async"`` starts the copy on its direction's copy stream when kernel `overlaps` starts
  (the record stands before that Compute) and runs beside it; the next reader of the copy waits
  for it. Fast memory for a copy to ``fast`` is taken when the copy is issued.
- ``Free(tensor, tier)``: drop that tier's copy. After an async Move of the same tensor, the
  memory is released only when the copy has finished.
- ``Recompute(kernel, outputs, before)``: re-run forward kernel `kernel` on the compute stream
  to regenerate `outputs` (some of its outputs, absent from both tiers since a Free dropped
  them) in fast memory, right before kernel `before` (the next Compute). Every input must be in
  fast memory; outputs not listed are made and dropped at once (a multi-output kernel re-creates
  them all). Only kernels whose outputs are reproducible bit for bit are re-run
  (`NON_REPRODUCIBLE_OPS`).
- ``Fill(tensor, value)``: make a fast copy of a tensor whose every element is `value` (a fill
  kernel on the compute stream, before the next Compute), where a profile found the tensor
  all zero or one constant (`autotm profile --values`, docs/values.md); it need not be in any
  tier, so such a tensor is dropped instead of written out and filled instead of read back.

Tensors without a producer (inputs, weights, optimizer state, constants) start where
`initial` says. Carried tensors (training: W -> W') must end the iteration where their
first version starts, so the next iteration can run the same plan.

`Plan.arena` (optional, `ArenaLayout`): where every fast-memory buffer lives in one arena of
fast memory (GPU mode; `autotm_py.arena` packs it). A buffer is one fast copy of a tensor, from
the record that creates it (the initial placement, a Move to fast, the Compute that produces
it) to the Free that drops it; each Compute's scratch (workspace and outputs that the kernel
cannot write in place) lives in the scratch region at the top of the arena while it runs.
A plan without an arena runs on torch's caching allocator.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from autotm_py.errors import PlanError
from autotm_py.fileio import atomic_write_bytes
from autotm_py.ir.rerun import rerun_kernel
from autotm_py.options import ModelOptions, RunMode

GZIP_MAGIC = b"\x1f\x8b"

if TYPE_CHECKING:
    from autotm_py.costs import KernelCosts
    from autotm_py.ir.graph import TensorGraph

# 3: the header's run mode is one typed record (`run`, an `options.RunMode`) instead of the
# `graph` flag and the `arena`/`placed`/`scratch` keys of `config`
FORMAT_VERSION = 3
# versions 1 and 2 are read and given the typed fields from what they recorded
READABLE_VERSIONS = (1, 2, 3)
TIER_CODES = {"fast": "F", "slow": "S"}
CODE_TIERS = {v: k for k, v in TIER_CODES.items()}
MoveMode = Literal["sync", "async"]


@dataclass(frozen=True, slots=True)
class Compute:
    kernel: int
    placement: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Move:
    tensor: int
    to: str
    mode: MoveMode = "sync"
    overlaps: int | None = None


@dataclass(frozen=True, slots=True)
class Free:
    tensor: int
    tier: str


@dataclass(frozen=True, slots=True)
class Recompute:
    kernel: int
    outputs: tuple[int, ...]  # the outputs it regenerates (kept in fast memory)
    before: int  # the kernel whose step it belongs to: the next Compute record


@dataclass(frozen=True, slots=True)
class Fill:
    tensor: int
    value: float  # every element's value (0.0: an all-zero tensor)


Record = Compute | Move | Free | Recompute | Fill

# Ops whose outputs a re-run cannot reproduce bit for bit (random draws without a seed the
# plan could replay). Plans never re-run them. Dropout in training mode is among them: our own
# kernel seeds its generator from the kernel id, but another executor of the plan (Julia, a
# framework) need not, so the plan does not rely on it.
NON_REPRODUCIBLE_OPS = frozenset({
    "Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
    "Bernoulli", "Multinomial",
})

INITIAL = -1  # ArenaBuffer.record of a given tensor's initial fast copy
SCRATCH = -1  # ArenaBuffer.tensor of a Compute's scratch


@dataclass(frozen=True, slots=True)
class ArenaBuffer:
    """One fast-memory buffer at a planned offset. `record`: the index of the record that
    creates it (`INITIAL` for a given tensor's initial fast copy); `tensor`: whose copy it is
    (`SCRATCH`: the scratch of the Compute at `record`)."""

    record: int
    tensor: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ArenaLayout:
    """Planned offsets of a plan's fast-memory buffers in one arena of `nbytes`.

    Buffers at [0, scratch_offset) hold tensors; [scratch_offset, nbytes) is the scratch region
    where kernels allocate their workspaces and the outputs they cannot write in place (torch's
    allocator serves it at run time). A compute's scratch buffer below `scratch_offset` is its
    *window* (`autotm optimize --scratch windows`): the placed allocator serves its kernel's
    scratch there, among the tensors, while the kernel runs. `alignment`: every offset is a
    multiple of it."""

    nbytes: int
    scratch_offset: int
    alignment: int
    buffers: tuple[ArenaBuffer, ...]

    def offsets(self) -> dict[tuple[int, int], int]:
        """(record, tensor) -> offset of every tensor buffer (scratch buffers left out)."""
        return {(b.record, b.tensor): b.offset for b in self.buffers if b.tensor != SCRATCH}

    @property
    def scratch_bytes(self) -> int:
        return self.nbytes - self.scratch_offset

    def windows(self) -> dict[int, ArenaBuffer]:
        """record -> its scratch window: a scratch buffer among the tensors, below the region
        (plans with scratch windows; docs/plan-format.md)."""
        return {b.record: b for b in self.buffers
                if b.tensor == SCRATCH and b.nbytes and b.offset < self.scratch_offset}

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.nbytes, "scratch_offset": self.scratch_offset,
                "alignment": self.alignment,
                "buffers": [[b.record, b.tensor, b.offset, b.nbytes] for b in self.buffers]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArenaLayout:
        return cls(int(data["bytes"]), int(data["scratch_offset"]), int(data["alignment"]),
                   tuple(ArenaBuffer(*(int(x) for x in row)) for row in data["buffers"]))


@dataclass(frozen=True)
class SolverStats:
    """How the plan was found. Zeros for plans that need no solver (baselines)."""

    solver: str = "none"
    status: str = "none"  # optimal | time_limit | interrupted | none (no solver ran)
    objective_s: float | None = None
    gap: float | None = None
    variables: int = 0
    constraints: int = 0
    build_s: float = 0.0
    solve_s: float = 0.0
    time_limit_s: float | None = None
    hit_time_limit: bool = False


@dataclass(frozen=True)
class CostsIdentity:
    """The kernel costs a plan was solved with: their digest (`KernelCosts.digest`, a hash of
    every kernel's time, device time, workspace and estimated flag) and counts to say what they
    were. `simulate`, `run` and `report` compare it with the costs they load today."""

    digest: str
    kernels: int = 0
    estimated: int = 0  # roofline estimates: kernels no profile had
    scaled: int = 0  # scaled from a profile measured at another batch
    total_s: float = 0.0  # sum of the kernel times (the all-fast compute time)

    @classmethod
    def of(cls, costs: KernelCosts) -> CostsIdentity:
        return cls(costs.digest, len(costs.times_s), costs.n_estimated, costs.n_scaled,
                   float(costs.total_s))


@dataclass(frozen=True)
class PlanHeader:
    model_hash: str
    model_name: str
    strategy: str
    budget_bytes: int | None
    memory_system: Mapping[str, Any]
    predicted_time_s: float | None = None
    solver: SolverStats = field(default_factory=SolverStats)
    graph_summary: Mapping[str, Any] = field(default_factory=dict)
    counts: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    format_version: int = FORMAT_VERSION
    # Typed fields (format 2). device: whose profiles priced the plan ("cuda": GPU mode, "cpu":
    # host mode); pin_weights and headroom as planned; model: how the graph was loaded (None
    # for a version-1 plan, which did not record it).
    device: str = "cuda"
    pin_weights: bool = False
    headroom: float = 0.0
    model: ModelOptions | None = None
    # how the plan runs and was priced for (format 3; read from `graph` and `config` before),
    # with its scratch mode in effect (`RunMode.resolved`)
    run: RunMode = field(default_factory=RunMode)
    # the kernel costs it was solved with (None: not recorded, e.g. a plan written before)
    costs: CostsIdentity | None = None
    # GPU mode: the GPU whose profiles priced it (`optimize --gpu`, else the planning machine's
    # GPU or the reference H100); simulate and report price it the same. None: a CPU-mode plan,
    # costs not from profiles, or a plan written before it existed (priced for this machine).
    gpu: str | None = None
    # the model it was made for, as `load_graph` takes it: the ONNX file's absolute path or the
    # zoo model's name (simulate, run and report load it when MODEL is not given). None: a
    # graph built otherwise (the Trainer's capture), or a plan written before it existed.
    source: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "run", self.run.resolved())

    @property
    def reserve_bytes(self) -> int:
        """Fast memory the runtime keeps for itself, out of `budget_bytes` (the memory
        system's `runtime_reserve_bytes`, as planned)."""
        return int(self.memory_system.get("runtime_reserve_bytes") or 0)

    @property
    def headroom_bytes(self) -> int:
        """The share of `budget_bytes` left free for fragmentation, in bytes."""
        return 0 if self.budget_bytes is None else int(self.budget_bytes * self.headroom)


@dataclass(frozen=True)
class Plan:
    """A header, where each given tensor starts, and the ordered records of one iteration."""

    header: PlanHeader
    initial: Mapping[int, tuple[str, ...]]
    records: tuple[Record, ...]
    names: Mapping[str, Any] = field(default_factory=dict)  # tensor/kernel tables for readers
    arena: ArenaLayout | None = None  # planned offsets of the fast-memory buffers

    # ---- queries -------------------------------------------------------------------------
    def computes(self) -> Iterable[Compute]:
        return (r for r in self.records if isinstance(r, Compute))

    def moves(self) -> Iterable[Move]:
        return (r for r in self.records if isinstance(r, Move))

    def recomputes(self) -> Iterable[Recompute]:
        return (r for r in self.records if isinstance(r, Recompute))

    def with_header(self, **changes: Any) -> Plan:
        return replace(self, header=replace(self.header, **changes))

    def with_arena(self, arena: ArenaLayout | None) -> Plan:
        return replace(self, arena=arena)

    # ---- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        header = asdict(self.header)
        out = {
            "format": "autotm-plan",
            "format_version": self.header.format_version,
            "header": header,
            "initial": {str(t): "".join(TIER_CODES[x] for x in tiers)
                        for t, tiers in sorted(self.initial.items())},
            "records": [_record_to_json(r) for r in self.records],
            "names": dict(self.names),
        }
        if self.arena is not None:
            out["arena"] = self.arena.to_dict()
        return out

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, separators=(",", ":") if indent is None
                          else None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, origin: str = "plan") -> Plan:
        if not isinstance(data, Mapping) or data.get("format") != "autotm-plan":
            raise PlanError(f"{origin}: not an autotm plan (missing \"format\": \"autotm-plan\"); "
                            "write plans with `autotm optimize -o plan.json`")
        version = data.get("format_version")
        if version not in READABLE_VERSIONS:
            raise PlanError(f"{origin}: plan format version {version} is not supported (this "
                            f"autotm reads versions {', '.join(map(str, READABLE_VERSIONS))}); "
                            "re-run `autotm optimize`")
        try:
            header = _header_from_json(dict(data["header"]), version)
            initial = {int(t): tuple(CODE_TIERS[c] for c in code)
                       for t, code in data["initial"].items()}
            records = tuple(_record_from_json(r) for r in data["records"])
            arena = None if data.get("arena") is None else ArenaLayout.from_dict(data["arena"])
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"{origin}: malformed plan ({type(exc).__name__}: {exc})") from None
        return cls(header, initial, records, dict(data.get("names", {})), arena)

    @classmethod
    def from_json(cls, text: str, *, origin: str = "plan") -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"{origin}: not valid JSON ({exc}); was the file truncated?") from None
        return cls.from_dict(data, origin=origin)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the plan as JSON; a name ending in .gz is gzip-compressed (plans of large
        models are megabytes of JSON and compress about tenfold)."""
        data = self.to_json().encode()
        if str(path).endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        return atomic_write_bytes(path, data)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read a plan written by `save`, compressed or not."""
        p = Path(path)
        try:
            data = p.read_bytes()
            if data[:2] == GZIP_MAGIC:
                data = gzip.decompress(data)
            text = data.decode()
        except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise PlanError(f"cannot read plan {p}: {why}") from None
        return cls.from_json(text, origin=str(p))

    # ---- checks --------------------------------------------------------------------------
    def validate(self, graph: TensorGraph) -> Plan:
        """Check that the plan belongs to `graph` and is well formed (not its memory rules:
        that is the simulator's strict mode). Raise `PlanError` naming the first problem."""
        if self.header.model_hash != graph.model_hash:
            raise PlanError(self._mismatch(graph))
        n_k, n_t = len(graph.kernels), len(graph.tensors)
        seen: set[int] = set()
        for i, rec in enumerate(self.records):
            _check_record(rec, i, graph, n_k, n_t)
            if isinstance(rec, Recompute):
                _check_recompute(rec, i, graph, seen)
            elif isinstance(rec, Compute):
                if rec.kernel in seen:
                    raise PlanError(f"record #{i}: kernel #{rec.kernel} is computed twice")
                seen.add(rec.kernel)
        if len(seen) != n_k:
            missing = sorted(set(range(n_k)) - seen)[:5]
            raise PlanError(f"plan computes {len(seen)} of {n_k} kernels; missing e.g. {missing}")
        if self.arena is not None:
            _check_arena(self.arena, self.records, n_t)
        return self

    def _mismatch(self, graph: TensorGraph) -> str:
        """Why the plan does not belong to `graph`: the model options that differ, in words,
        where the plan records them; else the names and hashes."""
        h = self.header
        differ = h.model.differences(ModelOptions.of_graph(graph)) if h.model else []
        if differ:
            return (f"plan was made for {h.model_name!r} with other model options: "
                    f"{'; '.join(differ)}; leave those options out to use the plan's, or "
                    "re-run `autotm optimize` with them")
        same = " (the same model options: another file or version of the model?)" \
            if h.model is not None and h.model_name == graph.name else ""
        return (f"plan was made for model {h.model_name!r} (hash {h.model_hash}), not for "
                f"{graph.name!r} (hash {graph.model_hash}){same}; re-run `autotm optimize` "
                "with the same model, --batch, --dim, --training, --loss and --no-fuse")

    def check_complete(self, n_kernels: int | None = None) -> Plan:
        """Check, without the graph, that the plan computes every kernel once and holds as many
        records as its header counts: a truncated or hand-cut file is a `PlanError`."""
        n = n_kernels if n_kernels is not None else self.header.counts.get("kernels")
        if n is None and self.names.get("kernels"):
            n = len(self.names["kernels"])
        computed = [r.kernel for r in self.records if isinstance(r, Compute)]
        expected = self.header.counts.get("records")
        problem = ""
        if n is not None and (len(computed) != int(n) or len(set(computed)) != len(computed)):
            problem = f"it computes {len(set(computed))} distinct of the {int(n)} kernels"
        elif expected is not None and int(expected) != len(self.records):
            problem = (f"it holds {len(self.records)} of the {int(expected)} records its "
                       "header counts")
        if problem:
            raise PlanError(f"plan of {self.header.model_name!r} is incomplete: {problem} (a "
                            "truncated or edited file?); write it again with `autotm optimize -o`")
        return self


def costs_drift(header: PlanHeader, digest: str, predicted_now_s: float | None = None,
                gpu_now: str = "") -> str | None:
    """One line when the costs of today (`digest`) are not those the plan was solved with,
    saying how far its prediction moved (`predicted_now_s`: the plan simulated on today's
    costs); None when they are the same or the plan did not record its costs. `gpu_now`: the
    GPU whose profiles priced it today, named when it is not the plan's (`autotm run` on
    another GPU than the plan was priced for)."""
    then = header.costs
    if then is None or not digest or then.digest == digest:
        return None
    moved = ""
    before = header.predicted_time_s
    if predicted_now_s is not None and before:
        moved = (f": its predicted iteration moved from {before * 1e3:.3f} ms to "
                 f"{predicted_now_s * 1e3:.3f} ms ({predicted_now_s / before - 1:+.1%})")
    if header.gpu and gpu_now and header.gpu != gpu_now:
        return (f"the plan was priced for the {header.gpu} and runs on the {gpu_now}{moved}; "
                f"re-plan with `autotm optimize --gpu '{gpu_now}'` to plan for this GPU")
    return (f"today's kernel costs differ from those the plan was solved with (costs "
            f"{then.digest} then, {digest} now; the profiles changed){moved}; re-plan with "
            "`autotm optimize` to plan for today's costs")


def _check_recompute(rec: Recompute, i: int, graph: TensorGraph, seen: set[int]) -> None:
    kernel = rerun_kernel(graph.kernels[rec.kernel])
    if rec.kernel not in seen:
        raise PlanError(f"record #{i}: recompute of kernel #{rec.kernel} before it first ran")
    if kernel.op_type in NON_REPRODUCIBLE_OPS:
        raise PlanError(f"record #{i}: kernel #{rec.kernel} ({kernel.op_type}) cannot be "
                        "recomputed: its outputs are random, a re-run would not reproduce them")
    if not rec.outputs:
        raise PlanError(f"record #{i}: recompute of kernel #{rec.kernel} regenerates nothing")
    stray = [t for t in rec.outputs if t not in kernel.outputs]
    if stray:
        raise PlanError(f"record #{i}: tensor #{stray[0]} is not an output of kernel "
                        f"#{rec.kernel}'s re-run ({kernel.op_type}: {list(kernel.outputs)})")
    if rec.before in seen:
        raise PlanError(f"record #{i}: recompute before kernel #{rec.before}, which already ran")


def _header_from_json(h: dict[str, Any], version: int) -> PlanHeader:
    h["solver"] = SolverStats(**h.get("solver", {}))
    h["notes"] = tuple(h.get("notes", ()))
    if version == 1:  # the typed fields lived in the untyped config
        config = h.get("config") or {}
        mode = (h.get("memory_system") or {}).get("mode")
        h["device"] = str(config.get("device") or ("cuda" if mode == "gpu" else "cpu"))
        h["pin_weights"] = bool(config.get("pin_weights", False))
        h["headroom"] = float(config.get("headroom") or 0.0)
    elif h.get("model") is not None:
        h["model"] = ModelOptions(**h["model"])
    h["run"] = RunMode.from_dict(h["run"]) if version >= 3 else _old_run_mode(h)
    h["format_version"] = FORMAT_VERSION
    if h.get("costs") is not None:
        h["costs"] = CostsIdentity(**h["costs"])
    return PlanHeader(**h)


def _old_run_mode(h: dict[str, Any]) -> RunMode:
    """The run mode of a version 1 or 2 header: its `graph` flag and the `arena`, `placed`
    and `scratch` its config recorded (absent: a plan for torch's allocator, run eagerly)."""
    config = h.get("config") or {}
    arena, placed = bool(config.get("arena", False)), bool(config.get("placed", False))
    scratch = config.get("scratch") or "region"
    return RunMode(arena=arena, placed=placed,
                   scratch=scratch if arena and placed else "region",
                   replay=bool(h.pop("graph", False)))


def _check_record(rec: Record, i: int, graph: TensorGraph, n_k: int, n_t: int) -> None:
    if isinstance(rec, Recompute):
        if not (0 <= rec.kernel < n_k and 0 <= rec.before < n_k):
            raise PlanError(f"record #{i}: recompute of kernel #{rec.kernel} before kernel "
                            f"#{rec.before}: no such kernel")
        bad = [t for t in rec.outputs if not 0 <= t < n_t]
        if bad:
            raise PlanError(f"record #{i}: tensor #{bad[0]} does not exist")
        return
    if isinstance(rec, Compute):
        if not 0 <= rec.kernel < n_k:
            raise PlanError(f"record #{i}: kernel #{rec.kernel} does not exist")
        if len(rec.placement) != len(graph.kernels[rec.kernel].io):
            raise PlanError(f"record #{i}: placement of kernel #{rec.kernel} has "
                            f"{len(rec.placement)} slots, the kernel has "
                            f"{len(graph.kernels[rec.kernel].io)} inputs+outputs")
        tiers: Sequence[str] = rec.placement
    elif isinstance(rec, Move):
        tiers = (rec.to,)
        if rec.mode not in ("sync", "async"):
            raise PlanError(f"record #{i}: move mode {rec.mode!r} is not sync or async")
        if rec.mode == "async" and rec.overlaps is None:
            raise PlanError(f"record #{i}: async move of tensor #{rec.tensor} overlaps no kernel")
    else:  # Free, or Fill (a fast copy)
        tiers = (getattr(rec, "tier", "fast"),)
    tensor = getattr(rec, "tensor", None)
    if tensor is not None and not 0 <= tensor < n_t:
        raise PlanError(f"record #{i}: tensor #{tensor} does not exist")
    bad = [t for t in tiers if t not in TIER_CODES]
    if bad:
        raise PlanError(f"record #{i}: unknown tier {bad[0]!r} (tiers: fast, slow)")


def _check_arena(arena: ArenaLayout, records: Sequence[Record], n_t: int) -> None:
    """Each buffer names a record that creates it and lies inside the arena (whether live
    buffers overlap is the verifier's: the strict simulator)."""
    if not 0 <= arena.scratch_offset <= arena.nbytes or arena.alignment < 1:
        raise PlanError(f"arena: scratch offset {arena.scratch_offset} outside the arena of "
                        f"{arena.nbytes} bytes (or alignment {arena.alignment} < 1)")
    for b in arena.buffers:
        where = f"arena buffer (record {b.record}, tensor {b.tensor})"
        if not INITIAL <= b.record < len(records) or (b.record == INITIAL and b.tensor < 0):
            raise PlanError(f"{where}: no such record")
        if b.tensor != SCRATCH and not 0 <= b.tensor < n_t:
            raise PlanError(f"{where}: tensor #{b.tensor} does not exist")
        if b.tensor == SCRATCH and not isinstance(records[b.record], Compute | Recompute):
            raise PlanError(f"{where}: scratch belongs to a compute or recompute record")
        if b.offset < 0 or b.nbytes < 0 or b.offset + b.nbytes > arena.nbytes:
            raise PlanError(f"{where}: [{b.offset}, {b.offset + b.nbytes}) is outside the "
                            f"arena of {arena.nbytes} bytes")
        if b.tensor != SCRATCH and b.offset + b.nbytes > arena.scratch_offset:
            raise PlanError(f"{where}: reaches {b.offset + b.nbytes}, but the scratch region "
                            f"starts at {arena.scratch_offset} and holds scratch only")
        if b.offset % arena.alignment:
            raise PlanError(f"{where}: offset {b.offset} is not a multiple of the alignment "
                            f"{arena.alignment}")


def _record_to_json(rec: Record) -> dict[str, Any]:
    if isinstance(rec, Compute):
        return {"op": "compute", "kernel": rec.kernel,
                "placement": "".join(TIER_CODES[t] for t in rec.placement)}
    if isinstance(rec, Move):
        out: dict[str, Any] = {"op": "move", "tensor": rec.tensor, "to": rec.to, "mode": rec.mode}
        if rec.overlaps is not None:
            out["overlaps"] = rec.overlaps
        return out
    if isinstance(rec, Recompute):
        return {"op": "recompute", "kernel": rec.kernel, "outputs": list(rec.outputs),
                "before": rec.before}
    if isinstance(rec, Fill):
        return {"op": "fill", "tensor": rec.tensor, "value": rec.value}
    return {"op": "free", "tensor": rec.tensor, "tier": rec.tier}


def _record_from_json(data: Mapping[str, Any]) -> Record:
    op = data["op"]
    if op == "compute":
        return Compute(int(data["kernel"]), tuple(CODE_TIERS[c] for c in data["placement"]))
    if op == "move":
        overlaps = data.get("overlaps")
        return Move(int(data["tensor"]), str(data["to"]), data.get("mode", "sync"),
                    None if overlaps is None else int(overlaps))
    if op == "free":
        return Free(int(data["tensor"]), str(data["tier"]))
    if op == "recompute":
        return Recompute(int(data["kernel"]), tuple(int(t) for t in data["outputs"]),
                         int(data["before"]))
    if op == "fill":
        return Fill(int(data["tensor"]), float(data["value"]))
    raise ValueError(f"unknown record op {op!r}")


def names_table(graph: TensorGraph) -> dict[str, Any]:
    """Tensor and kernel tables stored in a plan so readers (plots, Julia) need no graph."""
    return {
        "tensors": [[t.id, t.name, t.nbytes, t.role.value] for t in graph.tensors],
        "kernels": [[k.id, k.name, k.op_type] for k in graph.kernels],
        # [inputs, outputs] tensor ids per kernel: lets reports rebuild residency without a graph
        "kernel_io": [[list(k.inputs), list(k.outputs)] for k in graph.kernels],
    }
