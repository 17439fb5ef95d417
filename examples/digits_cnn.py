"""Train a small CNN on scikit-learn's handwritten digits through `autotm_py.Trainer`, with the
fast memory tier holding a third of one training iteration's peak (`ratio="1:2"`).

    python examples/digits_cnn.py [--epochs N] [--plans DIR]

The digits ship inside scikit-learn (1797 images of 8x8 pixels, 10 classes): no download.
Exits non-zero if the test accuracy is below 95%.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from autotm_py import Trainer

BATCH = 64
MIN_ACCURACY = 0.95


class DigitsCNN(nn.Module):
    """Five conv/BatchNorm/ReLU stages and a linear classifier. The convolutions have no bias:
    the BatchNorm after each would cancel it (its gradient is only rounding noise)."""

    def __init__(self) -> None:
        super().__init__()

        def stage(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU())

        # five stages, three at full 8x8 resolution: activations, not weights, dominate the
        # iteration's memory, and no single kernel needs more than a third of its peak (with
        # two stages the widest convolution's gradient alone needed almost half)
        self.features = nn.Sequential(stage(1, 16), stage(16, 16), stage(16, 16),
                                      nn.MaxPool2d(2), stage(16, 32), stage(32, 32),
                                      nn.MaxPool2d(2))
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).flatten(1))


def load_data(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """A fixed, stratified 75/25 split of the digits, pixels scaled to [0, 1]."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=seed,
                                              stratify=y)
    return x_tr, y_tr, x_te, y_te


def epoch_batches(x: torch.Tensor, y: torch.Tensor, gen: torch.Generator):
    """Shuffled full batches: the plan is for one batch shape, so the last partial batch is
    dropped (as `DataLoader(..., drop_last=True)` would)."""
    order = torch.randperm(len(x), generator=gen)
    for i in range(len(x) // BATCH):
        idx = order[i * BATCH:(i + 1) * BATCH]
        yield x[idx], y[idx]


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()  # BatchNorm with the running statistics the Trainer kept up to date
    return float((model(x).argmax(1) == y).float().mean())


def train(epochs: int, plans_dir: str) -> tuple[float, Trainer]:
    """Train through the Trainer; return the test accuracy (after `sync`) and the Trainer."""
    torch.manual_seed(0)
    x_tr, y_tr, x_te, y_te = load_data()
    model = DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    # the example fixes the batch shape the plan is for (its values are not trained on)
    first = (x_tr[:BATCH], y_tr[:BATCH])
    trainer = Trainer(model, opt, F.cross_entropy, example=first, ratio="1:2", device="cpu",
                      plans_dir=plans_dir)
    gen = torch.Generator().manual_seed(0)
    for epoch in range(epochs):
        losses = []
        for x, y in epoch_batches(x_tr, y_tr, gen):
            losses.append(float(trainer.step(x, y)))
        print(f"epoch {epoch + 1}: mean train loss {sum(losses) / len(losses):.4f}")
    trainer.sync()  # parameters and BatchNorm statistics back into `model`
    return accuracy(model, x_te, y_te), trainer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--plans", default=None, help="plan cache (default: a temp dir)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        acc, trainer = train(args.epochs, args.plans or tmp)
    print(trainer.describe())
    print(f"test accuracy {acc:.4f} after {args.epochs} epochs "
          f"({time.perf_counter() - start:.1f} s)")
    if acc < MIN_ACCURACY:
        print(f"FAIL: test accuracy below {MIN_ACCURACY}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
