"""GELU: the erf and tanh forms of exporters before opset 20, and their match.

    erf   x * 0.5 * (1 + erf(x / sqrt 2))                               -> Gelu(approximate="none")
    tanh  0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))       -> Gelu(approximate="tanh")

Exporters and hand-written models spell these many ways (the 0.5 first or last, x / sqrt 2 or
x * (1/sqrt 2), x^3 as Pow(x, 3) or x * x * x, the constant inside or distributed over the
sum). Instead of listing spellings, the subgraph from a candidate input x to a candidate
result is expanded into a polynomial in x and in erf(.)/tanh(.) of polynomials (Add, Sub,
Mul, Div by a constant, Pow by a small integer, Erf, Tanh; scalar constants only; every
tensor of x's shape), which must equal exactly one of the two forms above, with each
coefficient equal to the exact one within 1e-6 relative (float32 spellings of sqrt 2,
sqrt(2/pi) and 0.044715 pass; a 0.04 or a 1.414 does not). Intermediate tensors must be
read only inside the pattern.
"""

from __future__ import annotations

import math
from collections import deque

from autotm_py.frontend.fuse_base import Matcher, NewKernel, Rewrite
from autotm_py.ir.graph import Kernel

ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Pow"})
FUNCTIONS = frozenset({"Erf", "Tanh"})
MAX_DEPTH = 10  # kernels between x and the result
MAX_TERMS = 8
REL_TOL = 1e-6
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
FORMS = {  # function -> (Gelu's approximate, the function's argument as a polynomial in x)
    "Erf": ("none", {("x",): 1.0 / math.sqrt(2.0)}),
    "Tanh": ("tanh", {("x",): SQRT_2_OVER_PI, ("x", "x", "x"): 0.044715 * SQRT_2_OVER_PI}),
}

Poly = dict[tuple[str, ...], float]  # monomial (sorted factor names) -> coefficient


class _Expander:
    """Expands tensors into polynomials of the variable `x` (None: not expressible)."""

    def __init__(self, m: Matcher, x: int) -> None:
        self.m, self.x = m, x
        self.shape = m.graph.tensors[x].shape
        self.dtype = m.graph.tensors[x].dtype
        self.kernels: set[int] = set()
        self.functions: list[tuple[str, Poly]] = []
        self._memo: dict[int, Poly | None] = {}

    def poly(self, t: int, depth: int = 0) -> Poly | None:
        if t == self.x:
            return {("x",): 1.0}
        c = self.m.scalar(t)
        if c is not None:
            return {(): c} if math.isfinite(c) else None
        if t not in self._memo:
            self._memo[t] = self._expand(t, depth)
        return self._memo[t]

    def _expand(self, t: int, depth: int) -> Poly | None:
        tensor = self.m.graph.tensors[t]
        k = self.m.producer(t)
        if k is None or depth > MAX_DEPTH or tensor.shape != self.shape or \
                tensor.dtype != self.dtype or k.domain != "" or \
                k.op_type not in ARITHMETIC | FUNCTIONS:
            return None
        args = [self.poly(i, depth + 1) for i in k.inputs]
        if any(a is None for a in args):
            return None
        self.kernels.add(k.id)
        result = _combine(k, args, self.functions)  # type: ignore[arg-type]
        return result if result is not None and len(result) <= MAX_TERMS else None


def _combine(k: Kernel, args: list[Poly], functions: list[tuple[str, Poly]]) -> Poly | None:
    op = k.op_type
    if op in FUNCTIONS:
        functions.append((op, args[0]))
        return {(f"{op}#{len(functions) - 1}",): 1.0}
    a, b = args
    if op == "Add":
        return _add(a, b)
    if op == "Sub":
        return _add(a, {key: -c for key, c in b.items()})
    if op == "Mul":
        return _mul(a, b)
    if op == "Div":
        c = _constant(b)
        return None if c is None or c == 0.0 else {key: v / c for key, v in a.items()}
    n = _constant(b)  # Pow: a small positive integer exponent only
    if n is None or n != int(n) or not 1 <= n <= 4:
        return None
    result = a
    for _ in range(int(n) - 1):
        result = _mul(result, a)
    return result


def _constant(p: Poly) -> float | None:
    if not p:
        return 0.0
    return p[()] if set(p) == {()} else None


def _add(a: Poly, b: Poly) -> Poly:
    out = dict(a)
    for key, c in b.items():
        out[key] = out.get(key, 0.0) + c
    return {key: c for key, c in out.items() if c != 0.0}


def _mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ka, ca in a.items():
        for kb, cb in b.items():
            key = tuple(sorted(ka + kb))
            out[key] = out.get(key, 0.0) + ca * cb
    return {key: c for key, c in out.items() if c != 0.0}


def _close(got: float, want: float) -> bool:
    return abs(got - want) <= REL_TOL * abs(want)


def _same(got: Poly, want: Poly) -> bool:
    return set(got) == set(want) and all(_close(got[k], want[k]) for k in want)


def classify(p: Poly, functions: list[tuple[str, Poly]]) -> str | None:
    """Gelu's `approximate` when p is 0.5 x + 0.5 x f(arg) of one of FORMS, else None."""
    if len(p) != 2 or not _close(p.get(("x",), 0.0), 0.5):
        return None
    (key, coef), = ((k, c) for k, c in p.items() if k != ("x",))
    fnames = [f for f in key if f != "x"]
    if len(key) != 2 or "x" not in key or len(fnames) != 1 or not _close(coef, 0.5):
        return None
    op, arg = functions[int(fnames[0].split("#")[1])]
    approximate, want = FORMS[op]
    return approximate if _same(arg, want) else None


def _candidates_x(m: Matcher, fn: Kernel) -> list[int]:
    """Tensors behind the Erf/Tanh input, nearest first: where x may be."""
    seen, order = set(), []
    queue = deque([(fn.inputs[0], 0)])
    while queue:
        t, depth = queue.popleft()
        if t in seen or m.scalar(t) is not None:
            continue
        seen.add(t)
        order.append(t)
        k = m.producer(t)
        if k is not None and depth < 4 and k.op_type in ARITHMETIC:
            queue.extend((i, depth + 1) for i in k.inputs)
    return order


def _candidate_roots(m: Matcher, fn: Kernel) -> list[int]:
    """Tensors after the Erf/Tanh along sole readers, nearest first: where GELU(x) may be."""
    roots, t = [], fn.outputs[0]
    for _ in range(4):
        user = m.sole_user(t)
        if user is None or user.op_type not in ARITHMETIC or user.domain != "":
            break
        t = user.outputs[0]
        roots.append(t)
    return roots


def match_gelu(m: Matcher, fn: Kernel) -> Rewrite | None:
    if fn.op_type not in FUNCTIONS or fn.domain != "" or not m.is_float(fn.inputs[0]):
        return None
    for root in _candidate_roots(m, fn):
        for x in _candidates_x(m, fn):
            e = _Expander(m, x)
            p = e.poly(root)
            approximate = classify(p, e.functions) if p is not None else None
            if approximate is None or fn.id not in e.kernels or \
                    not m.interior_ok(e.kernels, keep=(root,)):
                continue
            producer = m.graph.tensors[root].producer
            assert producer is not None
            gelu = NewKernel("Gelu", (x,), (root,), {"approximate": approximate},
                             m.kernel_name(sorted(e.kernels), "Gelu"))
            return Rewrite("gelu", frozenset(e.kernels), ((producer, gelu),))
    return None
