"""The softmax cross-entropy's gradient at GPT-2 small's size (b16 s1024: 16384 rows of 50257
classes) three ways, timed side by side on one GPU (issue 46; docs/results.md):
  torch   our torch ops (exp, scatter, scale: what the CPU runs, `util.softmax_grad_rows`);
  fused   the one-pass Triton kernel (`kernels.loss_grad`), what CUDA runs now;
  native  what autocast's F.cross_entropy backward runs: nll_loss's gradient (a zero fill and a
          scatter), log_softmax's fused backward in fp32 (autocast runs the loss in fp32) and,
          for bf16 logits, the cast of that gradient back to bf16.
For fp32 log-probabilities and a bf16 gradient (bf16 training) and fp32 both (fp32 training).
Medians of 20 timed calls after 3 warm-ups, CUDA events; prints one JSON line a case.
Usage (GPU machine): python3 experiments/gpu/loss_grad_probe.py [--rows 16384 --classes 50257]
"""

from __future__ import annotations

import argparse
import json

import torch
from native_compare import measure_step

from autotm_py.kernels.loss_grad import fused_softmax_grad
from autotm_py.kernels.util import softmax_grad_rows


def _time(fn) -> float:
    """Median milliseconds of 20 calls after 3 (CUDA events)."""
    return measure_step(fn, 20, warmup=3)["median_s"] * 1e3


def _cases(log_prob: torch.Tensor, labels: torch.Tensor, out_dtype: torch.dtype) -> dict:
    rows = log_prob.shape[0]
    scale = 1.0 / rows
    out = torch.empty(log_prob.shape, dtype=out_dtype, device="cuda")
    column = torch.full((rows, 1), scale, device="cuda")
    into = None if out_dtype == torch.float32 else out  # fp32: in place, as the kernel does

    def ours_torch() -> None:
        softmax_grad_rows(log_prob.exp(), labels, column, into)

    def native() -> None:
        grad = torch.ops.aten.nll_loss_backward(torch.ones((), device="cuda"), log_prob,
                                                labels, None, 1, -100,
                                                torch.tensor(float(rows), device="cuda"))
        # autocast runs the loss in fp32; the bf16 logits' gradient is a cast of fp32's
        torch.ops.aten._log_softmax_backward_data(grad, log_prob, 1,
                                                  torch.float32).to(out_dtype)

    def fused() -> None:
        fused_softmax_grad(log_prob, labels, scale, out)

    return {"torch": ours_torch, "native": native, "fused": fused}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--classes", type=int, default=50257)
    args = parser.parse_args()
    log_prob = torch.log_softmax(torch.randn(args.rows, args.classes, device="cuda"), 1)
    labels = torch.randint(0, args.classes, (args.rows,), device="cuda")
    for out_dtype in (torch.bfloat16, torch.float32):
        cases = _cases(log_prob, labels, out_dtype)
        print(json.dumps({"rows": args.rows, "classes": args.classes, "out": str(out_dtype),
                          **{k: round(_time(f), 4) for k, f in cases.items()}}), flush=True)


if __name__ == "__main__":
    main()
