"""The location graph of one tensor: its whole tier timeline is one source-to-sink path.

Layers follow the tensor's gadgets (plus an end layer when it survives the iteration). Each
layer has up to four vertices (AutoTM section 1.3, plus recomputation):

- ``F0``: in fast memory, no valid slow copy yet;
- ``F1``: in fast memory and a valid slow copy exists;
- ``S``: in the slow tier only;
- ``X``: absent: dropped from fast memory with no slow copy, regenerated before a later use by
  re-running its producer (or, past its last use, simply dead).

Edges:

| edge                 | meaning                                                | cost            |
|----------------------|--------------------------------------------------------|-----------------|
| SOURCE -> F0_0, S_0  | where it starts (given) or its producer writes it      | none            |
| X_j -> X_j+1         | stays                                                  | none            |
| F0_j -> S_j+1        | write-eviction to the slow tier (at most once)         | write, gadget j |
| F1_j -> S_j+1        | drops the fast copy; the slow copy is still valid      | none            |
| S_j -> F1_j          | read into fast memory at gadget j                      | read, gadget j  |
| S_j -> F1_j (sync)   | a sync read where the gadget's read is async           | sync read       |
| F0_j -> X_j+1        | discard the fast copy (no copy anywhere)               | none            |
| X_j -> X_j+1         | stays absent                                           | none            |
| X_j -> F0_j          | regenerate before gadget j (its producer re-run)       | the producer    |

Tensors are immutable (SSA), so F0 is re-entered only by a regeneration, and X is entered only
from F0: a tensor is written at most once and every later eviction is free, while each read is
paid. The path's last layer is terminal; in GPU mode S at a layer whose kernel reads or writes
the tensor must read, and in both modes X at such a layer must regenerate. A tensor the host
writes before the iteration starts in S only (`starts_slow`); one it reads after, a survivor,
ends in S only (`ends_slow`).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotm_py.planning.gadgets import NONE, TensorGadgets

F0, F1, S, X = 0, 1, 2, 3
NK = 4  # vertex kinds per layer: vertex id = layer * NK + kind
FAST_KINDS = (F0, F1)
KIND_NAMES = ("F0", "F1", "S", "X")
START, STAY, WRITE, DROP, READ = "start", "stay", "write", "drop", "read"
DISCARD, REGEN = "discard", "regen"
SYNC_READ = "sync-read"  # a sync read at a gadget whose READ edge is async (`sync_read`)
READS = (READ, SYNC_READ)
SOURCE = -1


@dataclass(frozen=True, slots=True)
class Edge:
    src: int  # vertex id (layer * NK + kind) or SOURCE
    dst: int
    kind: str
    layer: int  # the gadget whose move this is (READ/WRITE), else the destination layer


@dataclass(frozen=True)
class TensorPaths:
    """Vertices and edges of one tensor's location graph, and its residency expressions.

    `during[j]` lists the edges whose flow says "in fast memory while gadget j runs";
    `after[j]` those that say "still in fast memory after gadget j, until the next one". Both
    are sums of edge flows, exact because a path visits one vertex per layer (two with a read).
    """

    gadgets: TensorGadgets
    edges: tuple[Edge, ...]
    vertices: tuple[int, ...]
    terminal: frozenset[int]
    during: tuple[tuple[int, ...], ...]
    after: tuple[tuple[int, ...], ...]
    end_in: dict[int, tuple[int, ...]]  # end-layer kind -> edges entering it (survivors)
    start: dict[int, int]  # start kind (F0 or S) -> edge index

    @property
    def layers(self) -> int:
        return len(self.gadgets.kernels)

    def regen_edges(self) -> dict[int, int]:
        """Layer -> index of its REGEN edge."""
        return {e.layer: i for i, e in enumerate(self.edges) if e.kind == REGEN}


def build_paths(g: TensorGadgets, *, gpu: bool, carried_end: bool) -> TensorPaths:
    """The location graph of a tensor with gadgets `g`. `carried_end`: the end layer has no F1
    vertex, because the next iteration must start the tensor in exactly one tier."""
    alive = _reachable(g, gpu)
    n = len(g.kernels)
    last = n if g.survives else n - 1
    edges: list[Edge] = []
    start = {}
    for kind in (S,) if g.starts_slow else (F0, S):
        if alive[0][kind]:
            start[kind] = len(edges)
            edges.append(Edge(SOURCE, kind, START, 0))
    for j in range(n):
        if alive[j][S] and alive[j][F1] and g.read[j] != NONE:
            edges.append(Edge(j * NK + S, j * NK + F1, READ, j))
        if alive[j][S] and alive[j][F1] and g.sync_reads(j):
            edges.append(Edge(j * NK + S, j * NK + F1, SYNC_READ, j))
        if alive[j][X] and g.regenerates(j):
            edges.append(Edge(j * NK + X, j * NK + F0, REGEN, j))
        if j + 1 <= last and j + 1 < len(alive):
            edges.extend(_transitions(g, j, alive, gpu))
    if g.survives and carried_end:
        edges = [e for e in edges if e.dst != n * NK + F1]
    if g.survives and g.ends_slow:
        edges = [e for e in edges if e.dst not in (n * NK + F0, n * NK + F1)]
    return _assemble(g, edges, start, last, gpu)


def _reachable(g: TensorGadgets, gpu: bool) -> list[list[bool]]:
    """Which of F0/F1/S/X can be occupied at each layer (end layer included for survivors)."""
    n = len(g.kernels)
    alive = []
    f0, s, f1, x = True, g.may_start_slow, False, False
    for j in range(n):
        must_fast = gpu and g.io[j]
        f1 = f1 or (s and g.reads(j))
        s_here = s and (not must_fast or g.reads(j))
        x_here = x and (not g.io[j] or g.regenerates(j))  # absent at a use: must regenerate
        alive.append([f0, f1, s_here, x_here])
        s = s_here or (f0 and g.write[j] != NONE) or f1
        x = (x_here and not g.io[j]) or (0 <= g.discard_from <= j)
    if g.survives:
        alive.append([f0, f1, s, False])
    return alive


def _transitions(g: TensorGadgets, j: int, alive: list[list[bool]], gpu: bool) -> list[Edge]:
    """Edges from layer j to layer j+1: stays, the write-eviction, the free drop, the discard."""
    nxt = j + 1
    a, b = alive[j], alive[nxt]
    s_stays = not (gpu and g.io[j])  # an S vertex at a GPU IO layer always reads
    out = []
    if a[F0] and b[F0]:
        out.append(Edge(j * NK + F0, nxt * NK + F0, STAY, nxt))
    if a[F1] and b[F1]:
        out.append(Edge(j * NK + F1, nxt * NK + F1, STAY, nxt))
    if a[S] and b[S] and s_stays:
        out.append(Edge(j * NK + S, nxt * NK + S, STAY, nxt))
    if a[X] and b[X] and not g.io[j]:  # an X vertex at a use layer always regenerates
        out.append(Edge(j * NK + X, nxt * NK + X, STAY, nxt))
    if a[F0] and b[S] and g.write[j] != NONE:
        out.append(Edge(j * NK + F0, nxt * NK + S, WRITE, j))
    if a[F1] and b[S]:
        out.append(Edge(j * NK + F1, nxt * NK + S, DROP, j))
    if a[F0] and b[X] and 0 <= g.discard_from <= j:
        out.append(Edge(j * NK + F0, nxt * NK + X, DISCARD, j))
    return out


def _assemble(g: TensorGadgets, edges: list[Edge], start: dict[int, int], last: int,
              gpu: bool) -> TensorPaths:
    n = len(g.kernels)
    vertices = sorted({e.dst for e in edges} | {e.src for e in edges if e.src != SOURCE})
    terminal = {v for v in vertices if v // NK == last}
    if not g.survives and g.io[n - 1]:
        terminal.discard((n - 1) * NK + X)  # must be regenerated before its last use
        if gpu:
            terminal.discard((n - 1) * NK + S)  # must read before its last use
    during: list[list[int]] = [[] for _ in range(n)]
    after: list[list[int]] = [[] for _ in range(n)]
    end_in: dict[int, list[int]] = {}
    for i, e in enumerate(edges):
        layer, kind = divmod(e.dst, NK)
        if layer < n and kind in FAST_KINDS:
            during[layer].append(i)
        if e.kind == STAY and kind in FAST_KINDS:
            after[layer - 1].append(i)
        if layer == n:
            end_in.setdefault(kind, []).append(i)
    return TensorPaths(g, tuple(edges), tuple(vertices), frozenset(terminal),
                       tuple(tuple(x) for x in during), tuple(tuple(x) for x in after),
                       {k: tuple(v) for k, v in end_in.items()}, start)
