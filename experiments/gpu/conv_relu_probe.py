"""Does cuDNN's fused convolution + bias + ReLU (`torch.cudnn_convolution_relu`) pay in fp32?

VGG19's convolutions are each followed by a ReLU: our executor runs the convolution (aten adds
the bias in a second pass) and the ReLU as kernels of their own, three passes over every
activation, where torch.compile fuses the bias and the ReLU. For each of VGG19 b64's sixteen
convolution shapes, in both layouts, this times (CUDA events, medians of 20 after 5 warm-ups):

- `split`: aten's convolution with its bias, then `relu`: what we run today;
- `fused`: `torch.cudnn_convolution_relu` (one cuDNN call, bias and ReLU in its epilogue);
- `backward`: `threshold_backward` then `convolution_backward` (the input, filter and bias
  gradients): the backward either way, for scale;

and the largest difference between `split` and `fused`. Then one SGD step of torchvision's
VGG19 (eager, uncapped), as is and with each Conv2d + ReLU pair run through the fused forward
(an autograd function whose backward is the `backward` above).

    python3 experiments/gpu/conv_relu_probe.py OUT.json [--layouts nchw,nhwc] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import native_compare as nc

A = torch.ops.aten
DEV = "cuda:0"
# VGG19's convolutions at 224 x 224: (in channels, out channels, side)
VGG19_CONVS = ([(3, 64, 224), (64, 64, 224), (64, 128, 112), (128, 128, 112), (128, 256, 56)]
               + [(256, 256, 56)] * 3 + [(256, 512, 28)] + [(512, 512, 28)] * 3
               + [(512, 512, 14)] * 4)


def median_ms(fn, iterations: int = 20, warmup: int = 5) -> float:
    return nc.measure_step(fn, iterations, warmup)["median_s"] * 1e3


def layer_row(batch: int, cin: int, cout: int, side: int, channels_last: bool) -> dict:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(batch, cin, side, side, device=DEV).contiguous(memory_format=fmt)
    w = (torch.randn(cout, cin, 3, 3, device=DEV) * 0.05).contiguous(memory_format=fmt)
    b = torch.randn(cout, device=DEV) * 0.1
    geo = ([1, 1], [1, 1], [1, 1])

    def split():
        return torch.relu(A.convolution(x, w, b, geo[0], geo[1], geo[2], False, [0, 0], 1))

    def fused():
        return torch.cudnn_convolution_relu(x, w, b, geo[0], geo[1], geo[2], 1)

    y = split()
    dy = torch.randn_like(y)

    def backward():
        dz = A.threshold_backward(dy, y, 0)
        return A.convolution_backward(dz, x, w, [cout], geo[0], geo[1], geo[2], False,
                                      [0, 0], 1, [True, True, True])

    row = {"cin": cin, "cout": cout, "side": side, "channels_last": channels_last}
    try:
        yf = fused()
        row["max_abs_diff"] = float((yf - y).abs().max())
        row["bitwise_equal"] = bool(torch.equal(yf, y))
        row["fused_ms"] = median_ms(fused)
    except RuntimeError as e:
        row["fused_error"] = str(e).splitlines()[0][:200]
    row["split_ms"] = median_ms(split)
    row["backward_ms"] = median_ms(backward)
    return row


class FusedConvRelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, stride, padding):
        y = torch.cudnn_convolution_relu(x, w, b, stride, padding, [1, 1], 1)
        ctx.save_for_backward(x, w, y)
        ctx.geo = (list(stride), list(padding))
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, y = ctx.saved_tensors
        stride, padding = ctx.geo
        dz = A.threshold_backward(dy, y, 0)
        dx, dw, db = A.convolution_backward(dz, x, w, [w.shape[0]], stride, padding, [1, 1],
                                            False, [0, 0], 1, [True, True, True])
        return dx, dw, db, None, None


class ConvRelu(torch.nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv = conv

    def forward(self, x):
        c = self.conv
        return FusedConvRelu.apply(x, c.weight, c.bias, list(c.stride), list(c.padding))


def fuse_vgg(net):
    layers, mods = [], list(net.features)
    i = 0
    while i < len(mods):
        if isinstance(mods[i], torch.nn.Conv2d) and i + 1 < len(mods) and \
                isinstance(mods[i + 1], torch.nn.ReLU):
            layers.append(ConvRelu(mods[i]))
            i += 2
        else:
            layers.append(mods[i])
            i += 1
    net.features = torch.nn.Sequential(*layers)
    return net


def vgg_step_ms(batch: int, channels_last: bool, fused: bool) -> float:
    import torchvision
    torch.manual_seed(0)
    net = torchvision.models.vgg19().to(DEV).train()
    if fused:
        net = fuse_vgg(net)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = net.to(memory_format=fmt)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    images = torch.randn(batch, 3, 224, 224, device=DEV).contiguous(memory_format=fmt)
    labels = torch.randint(0, 1000, (batch,), device=DEV)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(images), labels).backward()
        opt.step()
    return median_ms(step, iterations=10, warmup=3)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--layouts", default="nchw,nhwc")
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "layers": [], "vgg19_step_ms": {}}
    for layout in args.layouts.split(","):
        cl = layout == "nhwc"
        for cin, cout, side in VGG19_CONVS:
            row = layer_row(args.batch, cin, cout, side, cl)
            result["layers"].append(row)
            print(json.dumps(row), flush=True)
        rows = [r for r in result["layers"] if r["channels_last"] == cl]
        sums = {key: sum(r.get(key, 0.0) for r in rows)
                for key in ("split_ms", "fused_ms", "backward_ms")}
        result[f"sums_{layout}"] = sums
        print(layout, "sums", json.dumps(sums), flush=True)
        for fused in (False, True):
            t = vgg_step_ms(args.batch, cl, fused)
            torch.cuda.empty_cache()  # the step's model and optimizer are gone with it
            result["vgg19_step_ms"][f"{layout}_{'fused' if fused else 'split'}"] = t
            print(layout, "vgg19 step", "fused" if fused else "split", f"{t:.2f} ms", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
