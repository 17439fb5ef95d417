"""Train a character-level transformer on the project's own documentation through
`autotm_py.Trainer`, at a budget that forces the plan to move or recompute tensors, and the
same steps in plain PyTorch on a copy of the same module: the two loss curves agree.

    python examples/char_lm.py [--steps N] [--ratio F:S] [--every K] [--plans DIR]

The corpus is `docs/*.md` (sorted, concatenated): offline, no tokenizer, no download. Exits
non-zero if the loss does not fall (final < 0.8x first) or the curves differ anywhere by more
than a relative 1e-3.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from autotm_py import Trainer

DOCS = Path(__file__).resolve().parent.parent / "docs"
SEQ, BATCH, DIM, HEADS, LAYERS = 64, 16, 64, 4, 2
RTOL = 1e-3


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        # no qkv bias: the keys' bias has no gradient (shifting every key leaves the softmax
        # as it is), only rounding noise, which Adam's normalized step makes a random walk
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM, bias=False), nn.Linear(DIM, DIM)
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.reshape(b, t, HEADS, c // HEADS).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(c, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class CharLM(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, DIM), nn.Embedding(SEQ, DIM)
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return self.head(self.ln(self.blocks(self.emb(tokens) + pos)))


def lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def corpus() -> tuple[torch.Tensor, int]:
    """The docs as one tensor of character ids, and the vocabulary's size."""
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md")))
    chars = sorted(set(text))
    index = {ch: i for i, ch in enumerate(chars)}
    return torch.tensor([index[ch] for ch in text], dtype=torch.int64), len(chars)


def make_batches(ids: torch.Tensor, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` batches of random windows (seeded): inputs and the next characters."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        start = torch.randint(0, len(ids) - SEQ - 1, (BATCH, 1), generator=gen)
        window = ids[start + torch.arange(SEQ + 1)]
        out.append((window[:, :-1].contiguous(), window[:, 1:].contiguous()))
    return out


def adamw(model: nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)


def plain_pytorch(model: nn.Module, batches) -> list[float]:
    """The reference: autograd and torch's own AdamW, step by step."""
    opt = adamw(model)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def through_trainer(model: nn.Module, batches, ratio: str, plans_dir: str):
    """The same steps through a Trainer whose plan keeps `ratio` (fast:slow) of the peak in
    fast memory; the first batch is the example that fixes the plan's shapes."""
    trainer = Trainer(model, adamw(model), lm_loss, example=batches[0], ratio=ratio,
                      device="cpu", plans_dir=plans_dir)
    losses = [float(trainer.step(x, y)) for x, y in batches]
    trainer.sync()
    return losses, trainer


def check(ours: list[float], torch_: list[float]) -> list[str]:
    """What is wrong with the two curves (nothing: an empty list)."""
    problems = []
    if not ours[-1] < 0.8 * ours[0]:
        problems.append(f"the loss did not fall: first {ours[0]:.4f}, last {ours[-1]:.4f}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, torch_, strict=True))
    if worst > RTOL:
        problems.append(f"the curves differ by a relative {worst:.2e} (> {RTOL})")
    print(f"largest relative difference of the two curves: {worst:.2e}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ratio", default="1:2", help="fast:slow (1:2: a third of the peak)")
    parser.add_argument("--plans", default=None, help="plan cache (default: a temp dir)")
    parser.add_argument("--every", type=int, default=10, help="print every k steps")
    args = parser.parse_args(argv)
    ids, vocab = corpus()
    batches = make_batches(ids, args.steps)
    torch.manual_seed(0)
    model = CharLM(vocab)
    reference = copy.deepcopy(model)  # the same initial weights for plain PyTorch
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ours, trainer = through_trainer(model, batches, args.ratio, args.plans or tmp)
    mid = time.perf_counter()
    theirs = plain_pytorch(reference, batches)
    end = time.perf_counter()
    print(f"{len(ids)} characters, vocabulary {vocab}; {trainer.describe()}")
    print(" step  Trainer    PyTorch")
    for i in sorted({*range(0, args.steps, args.every), args.steps - 1}):
        print(f"{i + 1:5d}  {ours[i]:.6f}   {theirs[i]:.6f}")
    print(f"Trainer {mid - start:.1f} s (plan included), plain PyTorch {end - mid:.1f} s")
    problems = check(ours, theirs)
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
