"""Which aten `out=` variants write into the given buffers on this GPU, and which allocate and
copy? (An arena run copies every output that torch allocates into its slot: docs/gpu.md,
"Scratch"; the copies cost ResNet-200 b32 12.7 GB of HBM traffic per iteration.)

For each candidate, at a ResNet-like shape: the bytes the caching allocator handed out during
the call beyond what was allocated before it (`max_memory_allocated` over the baseline: an
allocate-and-copy wrapper needs at least its outputs' bytes), whether the outputs kept their
addresses, bitwise equality with the functional kernel that the executor runs today, and the
median time of both (CUDA events). Writes OUT/out_variant_probe.json.

`--stress N` then calls each way of reaching cuDNN's batch-norm `out=` kernel N times with fresh
buffers, each in a process of its own, and records whether the process survived: on torch
2.11 `torch.ops.aten.cudnn_batch_norm.out` wrote correctly when timed but corrupted the heap
in longer runs (the kernel rebinds its `reserve` output to a new tensor).

    python3 experiments/gpu/out_variant_probe.py OUT [--shape 32,256,56,56] [--repeats 20]
        [--stress 3000]
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from graph_copy_probe import median_event_ms

A = torch.ops.aten


def extra_bytes(fn: Callable[[], object]) -> int:
    """Bytes allocated during `fn` above what was allocated before it (its transient peak)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - base)


def probe(name: str, functional: Callable[[], tuple[torch.Tensor, ...]],
          into: Callable[[], object], outs: list[torch.Tensor], repeats: int) -> dict:
    ptrs = [o.data_ptr() for o in outs]
    row: dict[str, object] = {"op": name, "out_bytes": sum(o.nbytes for o in outs)}
    try:
        row["extra_bytes_out"] = extra_bytes(into)
        row["kept_addresses"] = [o.data_ptr() for o in outs] == ptrs
        want = functional()
        row["bitwise_equal"] = all(torch.equal(o, w) for o, w in zip(outs, want, strict=False))
        row["extra_bytes_functional"] = extra_bytes(functional)
        row["ms_out"] = median_event_ms(into, repeats)
        row["ms_functional"] = median_event_ms(functional, repeats)
    except Exception as exc:  # a probe reports what failed and goes on
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    print(json.dumps(row), flush=True)
    return row


def bn_out_ways() -> dict[str, Callable[..., object]]:
    """Ways of calling cuDNN's batch-norm out= kernel: (x, scale, bias, mean, var, momentum,
    eps, (y, save_mean, save_invstd, reserve))."""
    def ops(x, s, b, m, v, mom, eps, o):
        return A.cudnn_batch_norm.out(x, s, b, m, v, True, mom, eps, out0=o[0], out1=o[1],
                                      out2=o[2], out3=o[3])

    def binding(x, s, b, m, v, mom, eps, o):
        return torch.cudnn_batch_norm(x, s, b, m, v, True, mom, eps, out=o)

    def with_update(x, s, b, m, v, mom, eps, o):
        return A._batch_norm_with_update.out(x, s, b, m, v, mom, eps, out=o[0],
                                             save_mean=o[1], save_invstd=o[2], reserve=o[3])

    return {"torch.ops.aten.cudnn_batch_norm.out": ops,
            "torch.cudnn_batch_norm(out=)": binding,
            "torch.ops.aten._batch_norm_with_update.out": with_update}


def stress_one(way: str, n: int, shape: list[int]) -> None:
    """Call `way` n times with fresh buffers, checking each result against the functional
    kernel every 100 calls; exit 0 if the process survives."""
    dev = torch.device("cuda")
    c = shape[1]
    call = bn_out_ways()[way]
    for i in range(n):
        x = torch.randn(*shape, device=dev)
        scale, bias = torch.rand(c, device=dev) + 0.5, torch.randn(c, device=dev)
        mean, var = torch.zeros(c, device=dev), torch.ones(c, device=dev)
        outs = (torch.empty_like(x), torch.empty(c, device=dev), torch.empty(c, device=dev),
                torch.empty(0, dtype=torch.uint8, device=dev))
        call(x, scale, bias, mean, var, 0.1, 1e-5, outs)
        if i % 100 == 0:
            want = A._batch_norm_with_update_functional(x, scale, bias, torch.zeros(c, device=dev),
                                                        torch.ones(c, device=dev), 0.1, 1e-5)
            assert torch.equal(outs[0], want[0]) and torch.equal(mean, want[4]), (way, i)
        del outs, x
        if i % 50 == 0:
            gc.collect()
    torch.cuda.synchronize()


def stress(n: int, shape: list[int]) -> list[dict]:
    rows = []
    for way in bn_out_ways():
        proc = subprocess.run([sys.executable, __file__, "-", "--stress-one", way, "--stress",
                               str(n), "--shape", ",".join(map(str, shape))],
                              capture_output=True, text=True, timeout=600)
        row = {"way": way, "calls": n, "returncode": proc.returncode,
               "stderr_tail": proc.stderr[-400:]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", default="32,256,56,56")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--stress", type=int, default=0)
    parser.add_argument("--stress-one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stress_one:
        stress_one(args.stress_one, args.stress, [int(v) for v in args.shape.split(",")])
        return
    torch.manual_seed(0)
    dev = torch.device("cuda")
    n, c, h, w = (int(v) for v in args.shape.split(","))
    x = torch.randn(n, c, h, w, device=dev)
    dy = torch.randn_like(x)
    scale, bias = torch.rand(c, device=dev) + 0.5, torch.randn(c, device=dev)
    mean, var = torch.zeros(c, device=dev), torch.ones(c, device=dev)
    eps, momentum = 1e-5, 0.1
    rows = []

    # training batch norm, the cuDNN pair autograd runs (kernels/batch_norm.py)
    def bn_functional() -> tuple[torch.Tensor, ...]:
        y, sm, si, _r, nm, nv = A._batch_norm_with_update_functional(x, scale, bias, mean, var,
                                                                      momentum, eps)
        return y, sm, si, nm, nv

    y, sm, si = torch.empty_like(x), torch.empty(c, device=dev), torch.empty(c, device=dev)
    nm, nv = torch.empty_like(mean), torch.empty_like(var)
    reserve = torch.empty(0, dtype=torch.uint8, device=dev)

    def bn_into() -> None:
        nm.copy_(mean)
        nv.copy_(var)
        A.cudnn_batch_norm.out(x, scale, bias, nm, nv, True, momentum, eps,
                               out0=y, out1=sm, out2=si, out3=reserve)

    rows.append(probe("cudnn_batch_norm.out", bn_functional, bn_into, [y, sm, si, nm, nv],
                      args.repeats))
    _, save_mean, save_invstd, *_ = bn_functional()

    def bnb_functional() -> tuple[torch.Tensor, ...]:
        return A.batch_norm_backward(dy, x, scale, None, None, save_mean, save_invstd, True,
                                     eps, [True, True, True], reserve)

    dx, dscale, dbias = torch.empty_like(x), torch.empty(c, device=dev), torch.empty(c, device=dev)

    def bnb_cudnn_into() -> None:
        A.cudnn_batch_norm_backward.out(x, dy, scale, None, None, save_mean, save_invstd, eps,
                                        reserve, out0=dx, out1=dscale, out2=dbias)

    def bnb_native_into() -> None:
        A.native_batch_norm_backward.out(dy, x, scale, None, None, save_mean, save_invstd,
                                         True, eps, [True, True, True], out0=dx, out1=dscale,
                                         out2=dbias)

    rows.append(probe("cudnn_batch_norm_backward.out", bnb_functional, bnb_cudnn_into,
                      [dx, dscale, dbias], args.repeats))
    rows.append(probe("native_batch_norm_backward.out (against cuDNN's)", bnb_functional,
                      bnb_native_into, [dx, dscale, dbias], args.repeats))

    # convolution gradient: a 3x3, stride 1, pad 1 convolution of x
    wt = torch.randn(c, c, 3, 3, device=dev) * 0.02
    cargs = ([0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])

    def cg_functional() -> tuple[torch.Tensor, ...]:
        gx, gw, _ = A.convolution_backward(dy, x, wt, *cargs)
        return gx, gw

    gx, gw, gb = torch.empty_like(x), torch.empty_like(wt), torch.empty(0, device=dev)

    def cg_into() -> None:
        A.convolution_backward.out(dy, x, wt, *cargs, out0=gx, out1=gw, out2=gb)

    rows.append(probe("convolution_backward.out", cg_functional, cg_into, [gx, gw],
                      args.repeats))

    def ct_functional() -> tuple[torch.Tensor, ...]:
        return (A.convolution_backward(dy, x, wt, *cargs[:-1], [True, False, False])[0],)

    def ct_into() -> None:
        A.cudnn_convolution_transpose.out(dy, wt, [1, 1], [0, 0], [1, 1], [1, 1], 1,
                                          torch.backends.cudnn.benchmark, False,
                                          torch.backends.cudnn.allow_tf32, out=gx)

    rows.append(probe("cudnn_convolution_transpose.out (dX)", ct_functional, ct_into, [gx],
                      args.repeats))
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "shape": [n, c, h, w], "rows": rows}
    if args.stress:
        report["stress"] = stress(args.stress, [n, c, h, w])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "out_variant_probe.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
