"""SiLU (swish), the gate of SwiGLU MLPs, as one `Silu` kernel.

    S = Sigmoid(X)          (S read by nothing else, and no graph output)
    Y = Mul(X, S) | Mul(S, X)

becomes `Silu(X) -> Y`. torch exports `F.silu` this way before opset 24 (which has no SiLU
op; Swish came with opset 24). The pair was two kernel launches, and its backward kept X and S
and ran SigmoidGrad and two MulGrads; the fused op keeps X only and runs one `SiluGrad`. A
Llama MLP `down(silu(gate(x)) * up(x))` becomes Silu + Mul.
"""

from __future__ import annotations

from autotm_py.frontend.fuse_base import Matcher, NewKernel, Rewrite
from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.base import BACKWARD_DOMAIN
from autotm_py.ir.rules.fused import SILU


def match_silu(m: Matcher, sig: Kernel) -> Rewrite | None:
    if sig.op_type != "Sigmoid" or sig.domain != "" or not m.is_float(sig.inputs[0]):
        return None
    x, s = sig.inputs[0], sig.outputs[0]
    mul = m.sole_user(s)
    if mul is None or mul.op_type != "Mul" or mul.domain != "" or \
            sorted(mul.inputs) != sorted((x, s)):
        return None
    removed = (sig.id, mul.id)
    kernel = NewKernel(SILU, (x,), (mul.outputs[0],), {}, m.kernel_name(removed, SILU),
                       domain=BACKWARD_DOMAIN)
    return Rewrite("silu", frozenset(removed), ((mul.id, kernel),))
