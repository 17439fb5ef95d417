"""Per-op training rules and the table of the op types the training graph contains.

`RULES[op_type]` says how a forward op trains (see `base.Rule`). `TRAINING_OPS` lists every op
of ours (domain "autotm") that `derive_training` may emit, with its inputs, outputs and
meaning: it is the list the executor (`kernels/__init__.py`) implements.
"""

from __future__ import annotations

from autotm_py.ir.rules import elementwise, fused, losses, nn, recurrent, shape
from autotm_py.ir.rules.base import BACKWARD_DOMAIN, KernelDraft, Rule, Tape, TensorDraft

RULES: dict[str, Rule] = {**elementwise.RULES, **nn.RULES, **shape.RULES, **fused.RULES,
                          **losses.RULES, **recurrent.RULES}

# op type -> "inputs -> outputs: meaning"  (attributes are documented in docs/training.md)
TRAINING_OPS: dict[str, str] = {
    # loss
    "SoftmaxCrossEntropy": "logits, labels -> loss, log_prob: mean softmax cross-entropy "
                           "over the class axis `axis` (the loss that derive_training adds; "
                           "bf16 or fp16 logits: loss and log_prob in float32)",
    "SoftmaxCrossEntropyGrad": "log_prob, labels[, weights] -> dlogits (d loss = 1; in "
                               "dtype `to` where given: bf16 logits' fp32 log_prob)",
    "MeanSquaredError": "prediction, target -> loss: mean of (prediction - target)^2 "
                        "(--loss mse)",
    "MeanSquaredErrorGrad": "prediction, target -> dprediction = 2 (prediction - target) / "
                            "numel (d loss = 1)",
    # accumulation, broadcasting
    "GradAccumulate": "g0, g1, ... -> g: sum of partial gradients of one tensor",
    "SumToShape": "dY -> dX: scale * dY summed over broadcast axes down to `shape`",
    # convolution, matrix products
    "ConvGrad": "dY, X, W -> dX, dW[, dB] (one convolution backward for both; output_mask "
                "says whether dB is there)",
    "ConvGradData": "dY, W -> dX",
    "ConvGradFilter": "dY, X -> dW",
    "ConvGradBias": "dY -> dB: dY summed over all axes but 1",
    "ConvTransposeGrad": "dY, X, W -> dX, dW[, dB] (as ConvGrad)",
    "ConvTransposeGradData": "dY, W -> dX",
    "ConvTransposeGradFilter": "dY, X -> dW",
    "GemmGradA": "dY, B -> dA",
    "GemmGradB": "dY, A -> dB",
    "MatMulGradA": "dY, B -> dA (summed over broadcast batch axes)",
    "MatMulGradB": "dY, A -> dB (summed over broadcast batch axes)",
    # elementwise
    "MulGrad": "dY, other -> dX = sum_to(dY * other)",
    "DivGradA": "dY, B -> dA = sum_to(dY / B)",
    "DivGradB": "dY, A, B -> dB = sum_to(-dY * A / B^2)",
    "PowGradBase": "dZ, X, Y -> dX = sum_to(dZ * Y * X^(Y-1))",
    "PowGradExponent": "dZ, X, Z -> dY = sum_to(dZ * Z * log X)",
    "MaxMinGrad": "dY, A, B -> d(slot): dY where that operand wins (ties split in half)",
    "WhereGrad": "dY, condition -> dX (slot 1) or dY (slot 2), zeros elsewhere",
    "ReluGrad": "dY, Y -> dX",
    "LeakyReluGrad": "dY, X -> dX",
    "SigmoidGrad": "dY, Y -> dX",
    "TanhGrad": "dY, Y -> dX",
    "ErfGrad": "dY, X -> dX",
    "GeluGrad": "dY, X -> dX",
    "SqrtGrad": "dY, Y -> dX",
    "ReciprocalGrad": "dY, Y -> dX",
    "ExpGrad": "dY, Y -> dX",
    "LogGrad": "dY, X -> dX",
    "AbsGrad": "dY, X -> dX",
    "ClipGrad": "dY, X -> dX (zero outside [min, max])",
    "CastGrad": "dY -> dX cast back to the input dtype",
    "DropoutGrad": "dY, mask -> dX = dY * mask / (1 - ratio)",
    # normalization, softmax, pooling
    "BatchNormGrad": "dY, X, scale, saved_mean, saved_invstd -> dX, dscale, dB (masked)",
    "LayerNormGrad": "dY, X, Scale, Mean, InvStdDev -> dX, dScale, dB (masked)",
    "LRNGrad": "dY, X, Y -> dX",
    "SoftmaxGrad": "dY, Y -> dX",
    "LogSoftmaxGrad": "dY, Y -> dX",
    "MaxPoolGrad": "dY, X -> dX (argmax recomputed from X)",
    "AveragePoolGrad": "dY -> dX",
    "GlobalAveragePoolGrad": "dY -> dX",
    "GlobalMaxPoolGrad": "dY, X, Y -> dX (ties share the gradient)",
    # reductions and data movement
    "ReduceSumGrad": "dY -> dX (broadcast back)",
    "ReduceMeanGrad": "dY -> dX (broadcast back, divided by the count)",
    "ReshapeGrad": "dY -> dX reshaped to `shape` (Reshape, Flatten, Squeeze, Unsqueeze)",
    "TransposeGrad": "dY -> dX (inverse permutation)",
    "ConcatGrad": "dY -> dX_i for the kept inputs",
    "SplitGrad": "dY_i (present outputs) -> dX; absent outputs count as zeros",
    "SliceGrad": "dY -> dX (zeros outside the slice)",
    "GatherGrad": "dY, indices -> dX (scatter-add)",
    "TileGrad": "dY -> dX (sum over the repeats)",
    "PadGrad": "dY -> dX (crop, or fold reflected/edge borders back)",
    "ResizeGrad": "dY -> dX (transpose of the interpolation)",
    "TriluGrad": "dY -> dX (the same triangle of dY)",
    # recurrent layers (ir/rules/recurrent.py)
    **recurrent.RECURRENT_TRAINING_OPS,
    # optimizers (ir/optim.py); [lr]: the learning rate as a float32 scalar input, last, in
    # place of the `lr` attribute (Optimizer.lr_input)
    "SGDUpdate": "W, dW[, buf][, lr] -> W'[, buf']: W' = W - lr * dW, after `weight_decay` "
                 "(dW + wd W) and `momentum` (buf' = momentum buf + dW; `nesterov`), in "
                 "torch.optim.SGD's order",
    "AdamStep": "step[, lr] -> step' = step + 1, coef (the step's two bias-correction "
                "constants)",
    "AdamUpdate": "W, dW, m, v, coef[, lr] -> W', m', v' (bias-corrected Adam; "
                  "`weight_decay`: L2, or with `decoupled_weight_decay` AdamW's W (1 - lr wd), "
                  "the one form that reads lr)",
    # fused ops (frontend/fuse.py): the forward op of ours and its gradient
    **fused.FUSED_OPS,
    **fused.FUSED_TRAINING_OPS,
}

__all__ = ["BACKWARD_DOMAIN", "RULES", "TRAINING_OPS", "KernelDraft", "Rule", "Tape",
           "TensorDraft"]
