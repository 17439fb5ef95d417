"""The fused attention kernels on CUDA (device machine; marked gpu): the memory-efficient
forward with logsumexp and its backward against autograd in float64, and a fused training
graph trained on CUDA like on the CPU, with the plain and the chunked loss (--loss-chunks);
RMSNormalization, Silu and RotaryEmbedding (the corpus Llama) likewise."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotm_py.frontend.fuse import fuse_graph
from autotm_py.frontend.onnx import import_onnx
from autotm_py.ir.rules.fused import SDPA, SDPA_GRAD
from autotm_py.ir.training import derive_training
from autotm_py.runtime.reference import train_steps
from tests.test_training_models import tiny_decoder
from tests.test_training_ops import CASES, assert_close, compare_training, op_graph


def _attention_reference(q, k, v, mask, causal, scale):
    s = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["none", "additive", "bool", "padding"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("rank", "seq", "head"), [(4, 77, 64), (3, 40, 16)])
@pytest.mark.parametrize("layout", [None, "blhe"])
def test_attention_kernels_on_cuda_match_autograd(mask, causal, rank, seq, head, layout):
    """The CUDA pair (memory-efficient forward with logsumexp, its backward) against autograd
    of the math form in float64; the efficient kernel itself must accept these shapes (no
    silent fallback to the math form). With layout "blhe" the operands, the output and the
    gradients are (B, L, H, E), and the kernels return them contiguous (no copy)."""
    from autotm_py.ir.graph import Kernel, freeze_attrs
    from autotm_py.kernels import KERNELS, run_kernel
    from autotm_py.kernels import fused as kernels_fused

    if layout and rank == 3:
        pytest.skip("the (B, L, H, E) layout has heads: rank 4 only")
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(0)
    lead = (2, 3) if rank == 4 else (6,)
    q, k, v = (torch.randn(*lead, seq, head, generator=gen) for _ in range(3))
    m = {"none": None, "additive": torch.randn(seq, seq, generator=gen),
         "bool": torch.rand(seq, seq, generator=gen) < 0.7,
         "padding": torch.randn(*((2, 1, 1, seq) if rank == 4 else (6, 1, seq)),
                                generator=gen)}[mask]
    if mask == "bool":
        m[:, 0] = True
    cuda = [t.cuda() for t in (q, k, v)] + ([m.cuda()] if m is not None else [])

    def kernel(op: str, n_in: int, n_out: int, **attrs) -> Kernel:
        return Kernel(0, op, op, "autotm", freeze_attrs(attrs), tuple(range(n_in)),
                      tuple(range(n_out)), "")

    attrs = {"scale": 0.3, "is_causal": int(causal), **({"layout": layout} if layout else {})}

    def io(t: torch.Tensor) -> torch.Tensor:  # (B, H, L, E) <-> the kernels' layout
        return t.transpose(1, 2).contiguous() if layout else t

    given = [io(t) for t in cuda[:3]] + cuda[3:]
    (plain,) = run_kernel(kernel(SDPA, len(cuda), 1, **attrs), given)
    out, lse = KERNELS[SDPA](kernel(SDPA, len(cuda), 2, **attrs), given)
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = _attention_reference(*leaves, None if m is None else (m if m.dtype == torch.bool
                                                               else m.double()), causal, 0.3)
    dout = torch.randn(ref.shape, generator=gen)
    ref.backward(dout.double())
    grads = KERNELS[SDPA_GRAD](kernel(SDPA_GRAD, 6 + (m is not None), 3, output_mask=(1, 1, 1),
                                      **attrs), [io(dout.cuda()), *given[:3], out, lse,
                                                 *given[3:]])
    if layout:
        assert all(t.is_contiguous() for t in (out, *grads))  # written in that layout
    for got, want in zip([plain, out, *grads], [ref, ref, *(t.grad for t in leaves)],
                         strict=True):
        assert_close(io(got).cpu().double(), want.detach(), "cuda attention", rtol=1e-5)
    q4, k4, v4, m4 = kernels_fused._operands(cuda)
    torch.ops.aten._scaled_dot_product_efficient_attention(
        q4, k4, v4, kernels_fused._efficient_bias(m4, q4, k4), True, 0.0, causal, scale=0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cudnn", "flash"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", [None, "blhe"])
def test_half_attention_backends_on_cuda_match_autograd(backend, causal, layout, monkeypatch):
    """bf16 attention without a mask on cuDNN's and flash attention's kernel pairs
    (`kernels.fused._cuda_backend`): output and gradients against autograd of the math form in
    float64 on the same bf16 values, within twice the error of torch's own bf16 autograd of
    F.scaled_dot_product_attention (+1e-3 of the largest element); with layout "blhe" written
    in that layout."""
    from autotm_py.ir.graph import Kernel, freeze_attrs
    from autotm_py.kernels import KERNELS
    from autotm_py.kernels import fused as kernels_fused

    monkeypatch.setenv(kernels_fused.SDPA_BACKEND_ENV, backend)
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(2, 4, 200, 64, generator=gen).to(torch.bfloat16)
                     for _ in range(4))
    attrs = {"scale": 0.125, "is_causal": int(causal), **({"layout": layout} if layout else {})}

    def kernel(op: str, n_in: int, n_out: int, **more) -> Kernel:
        return Kernel(0, op, op, "autotm", freeze_attrs({**attrs, **more}),
                      tuple(range(n_in)), tuple(range(n_out)), "")

    def io(t: torch.Tensor) -> torch.Tensor:  # (B, H, L, E) <-> the kernels' layout
        return t.transpose(1, 2).contiguous() if layout else t

    given = [io(t.cuda()) for t in (q, k, v)]
    assert kernels_fused._cuda_backend(*(t.cuda() for t in (q, k, v)), None) == backend
    out, lse = KERNELS[SDPA](kernel(SDPA, 3, 2), given)
    grads = KERNELS[SDPA_GRAD](kernel(SDPA_GRAD, 6, 3, output_mask=(1, 1, 1)),
                               [io(dout.cuda()), *given, out, lse])
    if layout:
        assert all(t.is_contiguous() for t in (out, *grads))

    def autograd(dtype: torch.dtype, device: str) -> list[torch.Tensor]:
        leaves = [t.to(device, dtype).requires_grad_(True) for t in (q, k, v)]
        ref = _attention_reference(*leaves, None, causal, 0.125)
        ref.backward(dout.to(device, dtype))
        return [ref.detach().double().cpu()] + [t.grad.double().cpu() for t in leaves]

    exact = autograd(torch.float64, "cpu")
    leaves = [t.cuda().requires_grad_(True) for t in (q, k, v)]
    native = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal,
                                                              scale=0.125)
    native.backward(dout.cuda())
    torch_bf16 = [native.detach().double().cpu()] + [t.grad.double().cpu() for t in leaves]
    for name, got, theirs, want in zip(("out", "dq", "dk", "dv"),
                                       [io(out), *(io(g) for g in grads)], torch_bf16, exact,
                                       strict=True):
        peak = want.abs().max()
        ours_err = float((got.double().cpu() - want).abs().max() / peak)
        torch_err = float((theirs - want).abs().max() / peak)
        assert ours_err <= 2 * torch_err + 1e-3, (name, ours_err, torch_err)


@pytest.mark.gpu
def test_fused_tiny_decoder_trains_on_cuda_like_on_cpu():
    torch.backends.cuda.matmul.allow_tf32 = False
    graph = derive_training(fuse_graph(tiny_decoder()))
    loss = graph.meta["training"]["loss"]
    cpu = train_steps(graph, steps=3, seed=2)
    cuda = train_steps(graph, steps=3, seed=2, device="cuda")
    for a, b in zip(cpu, cuda, strict=True):
        for tid in graph.outputs:
            assert_close(b[tid].cpu(), a[tid], graph.name_of(tid), rtol=1e-4)
        assert float(a[loss]) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [1024, 2001])
@pytest.mark.parametrize("chunks", [1, 16])
def test_the_chunked_loss_trains_on_cuda_like_on_cpu(chunks, vocab):
    """--loss-chunks on CUDA: a decoder with 1024 classes, or 2001 (rows of 8004 bytes: padded
    with zero classes to 2016 on CUDA, not on the CPU), trains like on the CPU (and like the
    plain loss for chunks 1), and two CUDA runs are bitwise equal."""
    torch.backends.cuda.matmul.allow_tf32 = False
    graph = derive_training(fuse_graph(tiny_decoder(batch=4, seq=33, vocab=vocab, d=32)),
                            loss_chunks=chunks)
    assert any(k.op_type == "LinearCrossEntropy" for k in graph.kernels) == (chunks > 1)
    cpu = train_steps(graph, steps=3, seed=2)
    cuda = train_steps(graph, steps=3, seed=2, device="cuda")
    again = train_steps(graph, steps=3, seed=2, device="cuda")
    for a, b, c in zip(cpu, cuda, again, strict=True):
        for tid in graph.outputs:
            assert_close(b[tid].cpu(), a[tid], graph.name_of(tid), rtol=1e-4)
            assert torch.equal(b[tid], c[tid]), graph.name_of(tid)


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(("cin", "cout", "side"), [(3, 64, 224), (64, 64, 56), (512, 512, 14)])
def test_conv_relu_is_one_cudnn_call_bitwise_the_pair(channels_last, cin, cout, side,
                                                      monkeypatch):
    """ConvRelu on CUDA calls cuDNN's fused convolution + bias + ReLU once, and its output is
    the unfused Conv's then Relu's bit for bit (VGG19's shapes, both layouts)."""
    from autotm_py.ir.graph import Kernel, freeze_attrs
    from autotm_py.ir.rules.fused import CONV_RELU
    from autotm_py.kernels import run_kernel

    calls = []
    fused_call = torch.cudnn_convolution_relu
    monkeypatch.setattr(torch, "cudnn_convolution_relu",
                        lambda *a: calls.append(1) or fused_call(*a))
    attrs = freeze_attrs({"kernel_shape": (3, 3), "pads": (1, 1, 1, 1), "strides": (1, 1),
                          "dilations": (1, 1), "group": 1})
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(8, cin, side, side, device="cuda", generator=gen).contiguous(memory_format=fmt)
    w = (torch.randn(cout, cin, 3, 3, device="cuda", generator=gen) * 0.05
         ).contiguous(memory_format=fmt)
    b = torch.randn(cout, device="cuda", generator=gen)
    out = (0,) if channels_last else ()

    def kernel(op, n_in, domain=""):
        return Kernel(id=0, name=op, op_type=op, domain=domain,
                      attrs=attrs if op != "Relu" else (), inputs=tuple(range(n_in)),
                      outputs=(n_in,), signature="", channels_last=out)

    (z,) = run_kernel(kernel("Conv", 3), [x, w, b])
    (want,) = run_kernel(kernel("Relu", 1), [z])
    (got,) = run_kernel(kernel(CONV_RELU, 3, "autotm"), [x, w, b])
    assert calls == [1]
    assert got.is_contiguous(memory_format=fmt) and torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [c for c in CASES if c.op in ("RMSNormalization", "Silu")],
                         ids=lambda c: f"{c.op}-{c.id}")
def test_rms_norm_and_silu_on_cuda_match_autograd(case):
    graph, fixed = op_graph(case)
    compare_training(graph, fixed=fixed, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_kernels_on_cuda_are_the_rotation_and_its_transpose(dtype):
    """RotaryEmbedding and its gradient on CUDA (broadcast (1, 1, S, D) tables) against the
    float64 composite on the CPU, each also written into its slot bitwise."""
    from autotm_py.ir.graph import Kernel, freeze_attrs
    from autotm_py.kernels import run_kernel, run_kernel_into

    gen = torch.Generator().manual_seed(0)
    x, dy = (torch.randn(2, 4, 33, 64, generator=gen, dtype=torch.float64) for _ in range(2))
    cos, sin = (torch.randn(1, 1, 33, 64, generator=gen, dtype=torch.float64) for _ in range(2))
    xr = x.clone().requires_grad_(True)
    want = xr * cos + torch.cat((-xr[..., 32:], xr[..., :32]), -1) * sin
    (dx,) = torch.autograd.grad(want, xr, dy)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else \
        {"rtol": 2e-2, "atol": 5e-2}
    for op, a, ref in (("RotaryEmbedding", x, want.detach()), ("RotaryEmbeddingGrad", dy, dx)):
        kernel = Kernel(0, op, op, "autotm", freeze_attrs({}), (0, 1, 2), (3,), "")
        args = [t.to("cuda", dtype) for t in (a, cos, sin)]
        (got,) = run_kernel(kernel, args)
        torch.testing.assert_close(got.double().cpu(), ref, **tol)
        out = torch.full_like(got, float("nan"))
        assert run_kernel_into(kernel, args, [out]) and torch.equal(out, got)


@pytest.mark.gpu
def test_the_fused_llama_trains_on_cuda_like_on_cpu():
    torch.backends.cuda.matmul.allow_tf32 = False
    path = Path(__file__).resolve().parent.parent / "models" / "corpus" / "llama_gqa.onnx"
    graph = derive_training(import_onnx(path))
    assert {"RMSNormalization", "RMSNormGrad", "Silu", "SiluGrad", "RotaryEmbedding",
            "RotaryEmbeddingGrad"} <= {k.op_type for k in graph.kernels}
    cpu = train_steps(graph, steps=3, seed=2)
    cuda = train_steps(graph, steps=3, seed=2, device="cuda")
    for a, b in zip(cpu, cuda, strict=True):
        for tid in graph.outputs:
            assert_close(b[tid].cpu(), a[tid], graph.name_of(tid), rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", [(1, 1), (1, 0), (0, 1)])
def test_rms_norm_grad_on_cuda_is_aten_fused_backward(dtype, mask, monkeypatch):
    """On CUDA RMSNormGrad runs aten's fused backward (not the written-out composite), and it
    gives the composite's gradients: float32 within 1e-5, bfloat16 within its rounding."""
    from autotm_py.ir.graph import Kernel, freeze_attrs
    from autotm_py.kernels import decoder as kernels_decoder
    from autotm_py.kernels import run_kernel

    gen = torch.Generator().manual_seed(0)
    x, dy = (torch.randn(3, 37, 256, generator=gen).to("cuda", dtype) for _ in range(2))
    w = (torch.rand(256, generator=gen) + 0.5).to("cuda", dtype)
    norm = Kernel(id=0, name="n", op_type="RMSNormalization", domain="autotm",
                  attrs=freeze_attrs({"axis": 2, "epsilon": 1e-6}), inputs=(0, 1),
                  outputs=(2, 3), signature="")
    _, rstd = run_kernel(norm, [x, w])
    grad = Kernel(id=1, name="g", op_type="RMSNormGrad", domain="autotm",
                  attrs=freeze_attrs({"axis": 2, "output_mask": mask}), inputs=(0, 1, 2, 3),
                  outputs=tuple(range(4, 4 + sum(mask))), signature="")
    calls = []
    fused = kernels_decoder._fused_rms_norm_grad
    monkeypatch.setattr(kernels_decoder, "_fused_rms_norm_grad",
                        lambda *a: calls.append(1) or fused(*a))
    got = run_kernel(grad, [dy, x, rstd, w])
    assert calls == [1]
    monkeypatch.setattr(kernels_decoder, "_fused_rms_norm_grad", lambda *a: None)
    want = run_kernel(grad, [dy, x, rstd, w])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for g, r in zip(got, want, strict=True):
        assert g.dtype == r.dtype and g.shape == r.shape
        torch.testing.assert_close(g.float(), r.float(), rtol=tol,
                                   atol=tol * float(r.abs().max()))
