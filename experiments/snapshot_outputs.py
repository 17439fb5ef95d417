"""Snapshot what the CLI writes for a fixed set of models and options, to show that a change
of structure changes no plan, prediction or report.

    python experiments/snapshot_outputs.py OUT_DIR            # writes OUT_DIR/manifest.json
    python experiments/snapshot_outputs.py OUT_DIR --compare OLD_DIR/manifest.json
    python experiments/snapshot_outputs.py OUT_DIR --hash-only   # hash an earlier run again

Every command runs through the installed `autotm` CLI (CPU only, shipped profiles). Fields
that measure this machine (solver build/solve seconds, wall times) are dropped from JSON
outputs before hashing; everything else must be byte-for-byte equal.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
# Unfused, as the first snapshots were made before the fusion pass existed.
GPT = [str(FIX / "tiny_gpt_opset17.onnx"), "-b", "2", "--dim", "seq=16", "--training",
       "--no-fuse"]
TIMING_KEYS = {"build_s", "solve_s", "seconds", "elapsed_s", "wall_s", "solve_seconds",
               "build_seconds", "host_s", "date"}
SOLVER_SECONDS = re.compile(r"build [0-9.]+ s, solve [0-9.]+ s")

# (name, model args, plan args)
CASES = [
    ("r50-sync", ["resnet50", "-b", "8", "--training"], ["--ratio", "1:4"]),
    ("r50-static", ["resnet50", "-b", "8", "--training"], ["--ratio", "1:2", "--strategy",
                                                           "static"]),
    ("r50-async-pin", ["resnet50", "-b", "4", "--training"],
     ["--ratio", "1:2", "--strategy", "async", "--solver", "highs", "--pin-weights"]),
    ("gpt-async", GPT,
     ["--ratio", "1:2", "--strategy", "async"]),
    ("gpt-host-async", GPT,
     ["--ratio", "1:2", "--strategy", "async", "--device", "cpu"]),
    ("cnn-host-static", [str(FIX / "tiny_cnn_opset13.onnx"), "-b", "4", "--training"],
     ["--ratio", "1:3", "--strategy", "static", "--device", "cpu"]),
    ("cnn-head", [str(FIX / "tiny_cnn_opset13.onnx"), "-b", "4", "--training"],
     ["--ratio", "1:3", "--headroom", "0.1"]),
    ("inc-sync", ["inception_v4", "-b", "2", "--training"], ["--ratio", "1:2"]),
    ("bert-infer", ["bert_base", "-b", "1", "--dim", "seq=64", "--no-fuse"], ["--ratio", "1:2"]),
]
BENCH = ["bench", "--models", f"{FIX / 'tiny_cnn_opset13.onnx'},resnet50", "--batch", "4",
         "--ratios", "1:4,1:1", "--strategies", "static,sync", "--training", "--device",
         "cuda", "--no-progress"]


def autotm(*args: str, out: Path | None = None) -> str:
    proc = subprocess.run(["autotm", *args], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode not in (0, 3):
        sys.exit(f"autotm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    if out is not None:
        out.write_text(proc.stdout)
    return proc.stdout


IGNORED: set[str] = set()  # --ignore: keys a change is known to add or alter


def normalize(obj):
    if isinstance(obj, dict):
        return {k: normalize(v) for k, v in obj.items()
                if k not in TIMING_KEYS and k not in IGNORED}
    if isinstance(obj, list):
        return [normalize(v) for v in obj]
    return obj


def digest(path: Path, out: Path) -> str:
    data = path.read_bytes()
    if path.suffix in (".json", ".csv", ".txt", ".md"):
        # paths under the output folder and solver seconds differ from run to run
        text = SOLVER_SECONDS.sub("build - s, solve - s", data.decode())
        data = text.replace(str(out), "OUT").encode()
    if path.suffix == ".json":
        with contextlib.suppress(json.JSONDecodeError):
            data = json.dumps(normalize(json.loads(data)), sort_keys=True).encode()
    elif path.suffix == ".csv":
        rows = [{k: v for k, v in row.items() if k not in TIMING_KEYS and k not in IGNORED}
                for row in csv.DictReader(io.StringIO(data.decode()))]
        data = json.dumps(rows, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def run_cases(out: Path) -> None:
    for name, model, plan_args in CASES:
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        plan = d / "plan.json"
        autotm("inspect", *model, "--json", out=d / "inspect.json")
        autotm("optimize", *model, *plan_args, "-o", str(plan), "--json", out=d / "optimize.json")
        autotm("optimize", *model, *plan_args, "-o", str(d / "plan2.json"), out=d / "summary.txt")
        if not plan.exists():
            continue
        autotm("simulate", *model, "--plan", str(plan), "-o", str(d / "timeline.json"),
               "--json", out=d / "simulate.json")
        autotm("report", str(plan), "-o", str(d / "report"), "--timeline",
               str(d / "timeline.json"), "--trace", str(d / "trace.json"), "--format", "png",
               "--json", out=d / "report_stdout.json")
    autotm(*BENCH, "-o", str(out / "bench" / "bench.csv"), "--json", out=out / "bench.json")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--compare", type=Path)
    parser.add_argument("--hash-only", action="store_true", help="hash an earlier run's files")
    parser.add_argument("--ignore", action="append", default=[],
                        help="a JSON key to leave out of the hashes (repeatable)")
    args = parser.parse_args()
    IGNORED.update(args.ignore)
    if not args.hash_only:
        run_cases(args.out)
    manifest = {str(p.relative_to(args.out)): digest(p, args.out)
                for p in sorted(args.out.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(manifest)} files hashed into {args.out / 'manifest.json'}")
    if args.compare:
        old = json.loads(args.compare.read_text())
        diff = sorted(k for k in old.keys() | manifest.keys() if old.get(k) != manifest.get(k))
        for k in diff:
            print(f"differs: {k}")
        print("identical" if not diff else f"{len(diff)} files differ")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
