"""Offsets for the buffers of a plan in one arena (`arena.pack` calls `tightest_packing`).

Items (a buffer, or the two pieces of a steady pair: `arena.Lifetimes`) are placed largest
first, each at the lowest offset where it overlaps no placed item live at the same time (greedy
by size, as offline tensor allocators do). Where that leaves holes (the arena above the live
peak, which no packing can beat), best fit on the skyline is tried (`skyline`: the lowest
stretch of what is placed gets the item that fits its time with the largest size x
sqrt(lifetime)), then tries drawn at random, every other one an order around largest-first and
a skyline with its weights perturbed, with a fixed seed and a number of tries that shrinks with
the square of the buffer count (`random_orders`); the tightest packing is kept. A plan with a
few huge buffers packs far tighter with the random orders (VGG19 b64's plans at 86 and 90%:
greedy 14.1% and 13.5% over the live peak, the search 2.1% and 0.1%); one with thousands of
long-lived small buffers with the skyline (a 3.3B decoder's Adam plan: greedy 1.2% over, the
skyline at the peak; Inception-v4 b64's at 33%: 0.6-1.0% and at the peak). Greedy tries equal
sizes earliest first, then longest first (`greedy_by_size`), and the fit loop passes its limit:
the search stops at the first packing within it.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from autotm_py.arena import Lifetimes


# Random packing orders tried beside greedy by size: about this many buffer pairs compared in
# all (a packing compares each buffer with those placed before it), at most MAX_RANDOM_ORDERS
# orders: 1024 for VGG19's 250 buffers (3.3-3.6 s on the 2-core development VM),
# 2 for ResNet-200's 5000.
RANDOM_ORDER_PAIRS = 64_000_000
MAX_RANDOM_ORDERS = 1024
# each try scales every item's size by a factor drawn from this range before sorting
ORDER_NOISE = (0.5, 1.5)
# every other try is a `skyline` packing, its lifetime exponent drawn from these and each
# item's weight scaled by a factor drawn from this range
SKYLINE_EXPONENTS = (0.25, 0.5, 0.75, 1.0)
SKYLINE_NOISE = (0.7, 1.3)


def tightest_packing(life: Lifetimes, limit: int | None = None) -> list[int]:
    """The offsets of the tightest packing found: greedy by size (`greedy_by_size`), then best
    fit on the skyline (`skyline`), then, while the packing is above the live peak, tries
    drawn at random (`_random_packing`; module docstring). `limit`: stop at the first
    packing whose extent is within it (never below the live peak): where greedy fits, the fit
    loop no longer waits for the others (29 tries, 3 s, on the ResNet-50 b32 quick start's
    1485 buffers). Deterministic: the seed is fixed and the number of tries depends on the
    buffer count only."""
    goal = life.live_peak() if limit is None else max(limit, life.live_peak())
    items = _items(life)
    best = greedy_by_size(life, goal)
    best_extent = extent(life, best)
    rng = random.Random(0)
    for attempt in range(1 + random_orders(len(life.spans))):
        if best_extent <= goal:
            break
        offsets = skyline(life) if attempt == 0 else \
            _random_packing(life, items, rng, noisy_skyline=attempt % 2 == 1)
        tried = extent(life, offsets)
        if tried < best_extent:
            best, best_extent = offsets, tried
    return best


def _random_packing(life: Lifetimes, items: list[tuple[int, ...]], rng: random.Random,
                    noisy_skyline: bool) -> list[int]:
    """One try of the search (`items`: `_items(life)`): greedy over an order drawn around
    largest-first, or
    `skyline` with a lifetime exponent drawn from SKYLINE_EXPONENTS and each item's weight
    scaled by a factor from SKYLINE_NOISE."""
    if noisy_skyline:
        exponent = rng.choice(SKYLINE_EXPONENTS)
        return skyline(life, exponent, lambda n: [rng.uniform(*SKYLINE_NOISE) for _ in range(n)])
    order = sorted(items, key=lambda it: -life.spans[it[0]].nbytes * rng.uniform(*ORDER_NOISE))
    return _place(life, order, tightest=rng.random() < 0.5)


def skyline(life: Lifetimes, exponent: float = 0.5,
            noise: Callable[[int], Sequence[float]] | None = None) -> list[int]:
    """Best fit on the skyline (Sekiyama et al., "Profile-guided memory optimization for deep
    neural networks", 2018): the skyline is the top of what is placed at each half-step.
    Repeatedly take its lowest stretch (the first run of half-steps at its lowest height) and
    put there the unplaced item whose lifetime lies within that run, the one of largest
    size x lifetime ** `exponent` (0.5: long-lived small buffers go low early, where greedy by
    size leaves them to the top; `noise(n)`: factors for the items' weights, the random
    search's); where none fits, raise the run to its lower neighbour (those bytes stay
    unused). Time is circular, so that a steady pair whose two pieces wrap the iteration's
    boundary is one arc. Where greedy by size left 1.2-4% above the live peak (a 28-layer
    3.3B decoder's bf16 Adam plan at 24 GiB, 4912 buffers; a 6-layer one's at 8 GiB), this
    packs at the peak (2026-12-04)."""
    items = _items(life)
    arcs = _arcs(life, items)
    if not arcs:
        return []
    period = life.end + 2  # half-steps -2 .. end - 1
    starts, lengths, sizes = (np.array(column, np.int64) for column in zip(*arcs, strict=True))
    weight = sizes * lengths.astype(np.float64) ** exponent
    if noise is not None:
        weight *= np.array(noise(len(arcs)))
    height = np.zeros(period, np.int64)
    left = np.ones(len(arcs), dtype=bool)
    offsets = [0] * len(life.spans)
    while left.any():
        low = int(np.argmin(height))
        base = int(height[low])
        run, length, neighbours = _run_around(height, low)
        fits = left & ((starts - run) % period + lengths <= length) if neighbours else left
        if not fits.any():
            height[(run + np.arange(length)) % period] = min(neighbours)
            continue
        k = int(np.argmax(np.where(fits, weight, -1.0)))
        left[k] = False
        height[(starts[k] + np.arange(lengths[k])) % period] = base + sizes[k]
        for i in items[k]:
            offsets[i] = base
    return offsets


def _arcs(life: Lifetimes, items: list[tuple[int, ...]]) -> list[tuple[int, int, int]]:
    """(first half-step + 2, length, bytes) of each of `items` (`_items`) on the circular time of
    `skyline`: a steady pair's two pieces are one arc when they wrap the boundary (the tail,
    to the end, then the head, from the start), else the span from its first start to its
    last end."""
    period = life.end + 2
    arcs = []
    for item in items:
        spans = [life.spans[i] for i in item]
        if len(spans) == 2 and spans[1].start >= spans[0].end:
            head, tail = spans
            arcs.append((tail.start + 2, period - (tail.start + 2) + head.end + 2, head.nbytes))
        else:
            first = min(s.start for s in spans)
            arcs.append((first + 2, max(s.end for s in spans) - first, spans[0].nbytes))
    return arcs


def _run_around(height: np.ndarray, at: int) -> tuple[int, int, tuple[int, ...]]:
    """The circular run of half-steps at `height[at]` that holds `at`: (its first, its length,
    the heights just before and after it; none where the run is the whole circle)."""
    period = len(height)
    other = np.flatnonzero(height != height[at])
    if not len(other):
        return 0, period, ()
    after = int(np.searchsorted(other, at))
    before, next_other = int(other[after - 1]), int(other[after % len(other)])
    first = (before + 1) % period
    length = (next_other - first) % period or period
    return first, length, (int(height[before]), int(height[next_other]))


def greedy_by_size(life: Lifetimes, goal: int = 0) -> list[int]:
    """Largest first, each item in the lowest gap or in the tightest (the lowest is usually
    tighter; where it is not, the other saves a re-solve: Inception-v4 b64 at 33%, 2509
    against 2592 MiB), equal sizes earliest first, then longest first: the tightest of these,
    or the first within `goal`. Equal sizes are common (a network's repeated layers), and
    their order decides where the small long-lived buffers land: longest first packed
    ResNet-50 b32's fp32 plan at 1:3 at its live peak, earliest first 18.9 MB (0.35%) above
    it, beyond what the fit loop's budget left (2026-12-03)."""
    best: list[int] | None = None
    for order in (largest_first(life), largest_first(life, longest=True)):
        for tightest in (False, True):
            offsets = _place(life, order, tightest)
            if best is None or extent(life, offsets) < extent(life, best):
                best = offsets
            if extent(life, best) <= goal:
                return best
    assert best is not None
    return best


def largest_first(life: Lifetimes, longest: bool = False) -> list[tuple[int, ...]]:
    """The items to place, largest first (the earlier first among equals; `longest`: the
    longer-lived first, then the earlier)."""
    def key(it: tuple[int, ...]) -> tuple[int, int, int]:
        start = _start(life, it)
        length = max(life.spans[i].end for i in it) - start if longest else 0
        return -life.spans[it[0]].nbytes, -length, start

    return sorted(_items(life), key=key)


def random_orders(buffers: int) -> int:
    """How many random packing orders to try for this many buffers."""
    return min(MAX_RANDOM_ORDERS, RANDOM_ORDER_PAIRS // max(buffers * buffers, 1))


def extent(life: Lifetimes, offsets: list[int]) -> int:
    """The arena bytes a packing takes: the top of its highest buffer."""
    return max((offsets[i] + s.nbytes for i, s in enumerate(life.spans)), default=0)


def _items(life: Lifetimes) -> list[tuple[int, ...]]:
    """What is placed: each steady group (its spans share one offset), and each other span."""
    grouped = {i for group in life.groups for i in group}
    return [*life.groups, *((i,) for i in range(len(life.spans)) if i not in grouped)]


def _start(life: Lifetimes, item: tuple[int, ...]) -> int:
    return min(life.spans[i].start for i in item)


def _place(life: Lifetimes, items: Sequence[tuple[int, ...]], tightest: bool = False
           ) -> list[int]:
    """Each item in the given order at the lowest offset where it overlaps no item placed
    before it that is live at the same time (`tightest`: in the smallest such gap between
    them, else above them all). Largest first, equal sizes in time order, is the greedy by
    size: for same-sized buffers, lowest-offset-first in order of start is the optimal
    colouring of an interval graph."""
    spans = life.spans
    n = len(spans)
    starts, ends = np.empty(n, np.int64), np.empty(n, np.int64)
    lows, highs = np.empty(n, np.int64), np.empty(n, np.int64)
    placed = 0
    offsets = [0] * n
    for item in items:
        size = spans[item[0]].nbytes
        busy = np.zeros(placed, dtype=bool)
        for i in item:
            busy |= (starts[:placed] < spans[i].end) & (ends[:placed] > spans[i].start)
        offset = _lowest_gap(lows[:placed][busy], highs[:placed][busy], size, tightest)
        for i in item:
            offsets[i] = offset
            starts[placed], ends[placed] = spans[i].start, spans[i].end
            lows[placed], highs[placed] = offset, offset + size
            placed += 1
    return offsets


def _lowest_gap(lows: np.ndarray, highs: np.ndarray, size: int, tightest: bool = False) -> int:
    """The lowest offset where [offset, offset + size) meets none of the [low, high) ranges;
    `tightest`: the start of the smallest gap between them that holds it, if any. Vectorized:
    sorted by low, the gap before range k starts at the highest top of the ranges before it."""
    if not len(lows):
        return 0
    order = np.argsort(lows, kind="stable")
    lows = lows[order]
    tops = np.maximum.accumulate(highs[order])
    starts = np.concatenate(([0], tops[:-1]))
    gaps = lows - starts
    fits = np.flatnonzero(gaps >= size)
    if not len(fits):
        return int(tops[-1])
    if not tightest:
        return int(starts[fits[0]])
    return int(starts[fits[np.argmin(gaps[fits])]])
