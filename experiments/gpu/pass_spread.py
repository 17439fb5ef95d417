"""Two-GPU passes against one-GPU passes, with the one-GPU passes' own spread beside them.

Reads repeated `autotm bench --execute` documents of the same plans (execute_two_gpus.sh with
REPEAT=N writes one_1.json, two_1.json, one_2.json, ...) and prints, for every distinct measured
time, the values of each pass, the one-GPU spread (max / min over the one-GPU passes) and the
two-GPU median over the one-GPU median, flagging a time whose two-GPU values all lie outside the
one-GPU range by more than `--tolerance`. The summary compares the typical size of the
two-GPU effect with the typical run-to-run change between one-GPU passes: if the first is no
larger, running cells on two GPUs at once changes the results by no more than noise does.

    python3 experiments/gpu/pass_spread.py DIR [--tolerance 0.02]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from pathlib import Path

from autotm_py.bench import key_of


def load(path: Path) -> dict:
    return {key_of(r): r for r in json.loads(path.read_text())["rows"]}


def measured_times(passes: dict[str, dict]) -> list[tuple[str, dict[str, float]]]:
    """(label, {pass: seconds}) for every measured time present in every pass, each distinct
    series once (a model's own runs repeat on every row of the model)."""
    first = next(iter(passes.values()))
    out, seen = [], set()
    for key in sorted(first):
        for col in sorted(c for c in first[key] if c.startswith("measured_") and c.endswith("_s")):
            values = {name: rows.get(key, {}).get(col) for name, rows in passes.items()}
            if not all(values.values()):
                continue
            series = tuple(round(v, 7) for v in values.values())
            if series in seen:
                continue
            seen.add(series)
            label = f"{key[6]} {key[7]} {col[len('measured_'):-2] or 'plan'}"
            out.append((label, values))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--tolerance", type=float, default=0.02)
    args = ap.parse_args()
    names = sorted((p.stem for p in args.dir.glob("*_[0-9]*.json")),
                   key=lambda n: (n.split("_")[0] != "one", int(n.split("_")[1])))
    passes = {n: load(args.dir / f"{n}.json") for n in names}
    ones = [n for n in names if n.startswith("one_")]
    twos = [n for n in names if n.startswith("two_")]
    if len(ones) < 2 or not twos:
        raise SystemExit(f"{args.dir}: needs two or more one-GPU passes and a two-GPU pass")
    print(f"{'time':<30}" + "".join(f"{n:>9}" for n in names) + "  one spread  two/one")
    effect, noise, apart = [], [], []
    for label, v in measured_times(passes):
        one = [v[n] for n in ones]
        two = [v[n] for n in twos]
        lo, hi = min(one) * (1 - args.tolerance), max(one) * (1 + args.tolerance)
        outside = all(t < lo or t > hi for t in two)
        ratio = statistics.median(two) / statistics.median(one)
        effect.append(abs(math.log(ratio)))
        noise.extend(abs(math.log(b / a)) for a, b in itertools.pairwise(one))
        if outside:
            apart.append(label)
        print(f"{label:<30}" + "".join(f"{1e3 * v[n]:9.1f}" for n in names)
              + f"  {max(one) / min(one):10.3f}  {ratio:7.3f}{'  outside' if outside else ''}")
    typical = math.expm1(statistics.median(effect)), math.expm1(statistics.fmean(effect))
    between = math.expm1(statistics.median(noise)), math.expm1(statistics.fmean(noise))
    print(f"{len(effect)} times (ms above). Median |two/one - 1| {typical[0]:.3f} (mean "
          f"{typical[1]:.3f}); between one-GPU passes {between[0]:.3f} (mean {between[1]:.3f}). "
          f"Outside the one-GPU range by over {100 * args.tolerance:g}%: {len(apart)}"
          + (f" ({', '.join(apart)})" if apart else ""))


if __name__ == "__main__":
    main()
