"""How many aten ops (device kernel launches, views aside) the hot kernels dispatch: what
issue 15 measured on the H100 as host dispatch. Counted on the CPU with a dispatch mode; the
CUDA dispatch of these ops is one launch each (cuDNN/cuBLAS calls included).

- SGDUpdate: one `add` (W + (-lr) dW), the least a functional update can launch; AdamUpdate
  seven. Batching updates of many weights into one foreach launch is the executor's business.
- ConvGrad: one `convolution_backward` for dX and dW (ConvGradData + ConvGradFilter were two).
- Linear: one `addmm`; LinearGrad: two `mm` and one `sum` (the Add, MatMulGradA, MatMulGradB
  and SumToShape they replace were four kernels more, each a host dispatch).
- Attention in the (B, L, H, E) layout: no copy of Q, K, V, O or of their gradients.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autotm_py.ir.graph import Kernel, freeze_attrs
from autotm_py.kernels import run_kernel

VIEWS = {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "alias",
         "unsqueeze", "squeeze", "slice", "select", "as_strided", "detach", "split",
         "split_with_sizes", "unbind", "new_empty", "empty", "empty_like"}


class Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def launches(self) -> Counter[str]:
        return Counter({op: n for op, n in self.ops.items() if op not in VIEWS})


def dispatched(op: str, args: list[torch.Tensor], n_out: int = 1, **attrs) -> Counter[str]:
    kernel = Kernel(0, op, op, "autotm", freeze_attrs(attrs), tuple(range(len(args))),
                    tuple(range(len(args), len(args) + n_out)), "")
    with torch.no_grad(), Ops() as mode:
        run_kernel(kernel, args)
    return mode.launches


def test_sgd_update_is_one_launch_and_adam_seven():
    w, g = torch.randn(64, 32), torch.randn(64, 32)
    assert dispatched("SGDUpdate", [w, g], lr=0.1) == Counter({"add": 1})
    coef = torch.tensor([0.5, 1e-8])
    adam = dispatched("AdamUpdate", [w, g, torch.zeros_like(w), torch.zeros_like(w), coef], 3,
                      lr=0.1, beta1=0.9, beta2=0.999, epsilon=1e-8)
    assert sum(adam.values()) == 7


def test_conv_grad_is_one_convolution_backward():
    dy, x, w = torch.randn(2, 4, 6, 6), torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    attrs = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 1}
    ops = dispatched("ConvGrad", [dy, x, w], 2, output_mask=(1, 1, 0), **attrs)
    assert ops["convolution_backward"] == 1 and "clone" not in ops and "copy_" not in ops
    with_bias = dispatched("ConvGrad", [dy, x, w], 3, output_mask=(1, 1, 1), **attrs)
    assert with_bias["convolution_backward"] == 1 and with_bias["sum"] == 1


def test_linear_is_one_addmm_and_its_gradient_three_launches():
    x, w, b = torch.randn(2, 5, 8), torch.randn(8, 6), torch.randn(6)
    assert dispatched("Linear", [x, w, b], transB=0) == Counter({"addmm": 1})
    dy = torch.randn(2, 5, 6)
    grad = dispatched("LinearGrad", [dy, x, w], 3, transB=0, output_mask=(1, 1, 1),
                      bias_shape=(6,))
    assert grad == Counter({"mm": 2, "sum": 1})


def test_attention_in_the_heads_last_layout_copies_nothing_big():
    q, k, v = (torch.randn(2, 7, 3, 8) for _ in range(3))  # (B, L, H, E)
    attrs = {"scale": 0.3, "is_causal": 1, "layout": "blhe"}
    with torch.no_grad(), Ops() as fwd_mode:
        kernel = Kernel(0, "sdpa", "ScaledDotProductAttention", "autotm", freeze_attrs(attrs),
                        (0, 1, 2), (3, 4), "")
        out, lse = run_kernel(kernel, [q, k, v])
    grad = Kernel(1, "sdpa/grad", "ScaledDotProductAttentionGrad", "autotm",
                  freeze_attrs({**attrs, "output_mask": (1, 1, 1)}), (0, 1, 2, 3, 4, 5),
                  (6, 7, 8), "")
    with torch.no_grad(), Ops() as bwd_mode:
        grads = run_kernel(grad, [torch.randn_like(out), q, k, v, out, lse])
    assert out.shape == q.shape and all(g.shape == q.shape for g in grads)
    assert bwd_mode.ops["clone"] == 0
    # the CPU kernel writes its logsumexp (B, L, H)-major: one (B, H, L) copy of it, 1/E of O
    assert fwd_mode.ops["clone"] == 1
