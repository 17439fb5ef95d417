"""The zoo's entries: default dims (and why), published parameter counts and their sources.

Default dims are the batch sizes of the paper's main (conventional CPU) experiments; the other
sizes the paper ran are listed in `other_dims`. Models the paper did not run (ResNet-50,
BERT-base, GPT-2 small) get the sizes their own papers or common practice use (docs/zoo.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import onnx

from autotm_py.frontend.zoo import densenet, dlrm, inception, resnet, transformer, vgg


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model. `published_params` is None where no published count exists."""

    name: str
    description: str
    default_dims: Mapping[str, int]
    published_params: int | None
    params_source: str
    builder: Callable[..., onnx.ModelProto] = field(repr=False)
    other_dims: str = ""  # other sizes the paper ran (documentation only)
    max_seq: int | None = None  # positions the model has embeddings for

    @property
    def is_sequence(self) -> bool:
        return "seq" in self.default_dims


ENTRIES: tuple[ZooEntry, ...] = (
    ZooEntry(
        "vgg19", "VGG19: 16 3x3 convs + 3 Linear, 224x224", {"batch": 2048}, 143_667_240,
        "torchvision vgg19 (exact); Simonyan & Zisserman 2015 say 144M", vgg.vgg19,
        other_dims="GPU runs: batch 64, 128; AutoTM's pipeline test: 16"),
    ZooEntry(
        "vgg416", "AutoTM's VGG416: 413 3x3 convs + 3 Linear, 224x224", {"batch": 320}, None,
        "none published; closed form in tests/test_zoo.py", vgg.vgg416,
        other_dims="320 is its only size in the paper (the 2LM comparison)"),
    ZooEntry(
        "resnet50", "ResNet-50: bottlenecks [3, 4, 6, 3], 224x224", {"batch": 256}, 25_557_032,
        "torchvision resnet50 (exact)", resnet.resnet50,
        other_dims="not in the paper; 256 is He et al.'s ImageNet mini-batch"),
    ZooEntry(
        "resnet200", "ResNet-200: bottlenecks [3, 24, 36, 3], 224x224", {"batch": 512},
        64_700_000, "timm resnet200d model card: 64.7M (rounded; the 'd' stem adds ~0.03M)",
        resnet.resnet200, other_dims="GPU runs: batch 32, 64, 128; 2LM comparison: 2560"),
    ZooEntry(
        "inception_v4", "Inception-v4: stem, 4A, RA, 7B, RB, 3C, 299x299", {"batch": 1024},
        42_700_000, "timm inception_v4 model card: 42.7M (rounded)", inception.inception_v4,
        other_dims="GPU runs: batch 64, 128, 256; 2LM comparison: 6144"),
    ZooEntry(
        "densenet264", "DenseNet-264 (BC, k=32): blocks (6, 12, 64, 48), 224x224",
        {"batch": 512}, None,
        "none in Huang et al. (often quoted as 33.3M); closed form in tests/test_zoo.py",
        densenet.densenet264, other_dims="GPU runs: batch 32, 64, 128; 2LM comparison: 3072"),
    ZooEntry(
        "transformer", "Transformer enc-dec: N=8, d=512, h=8, shared 20000-token vocab",
        {"batch": 512, "seq": 150}, None,
        "none published for this size (Vaswani et al.'s base, N=6 and 37000 tokens: 65M); "
        "closed form in tests/test_zoo.py", transformer.transformer,
        other_dims="AutoTM's conventional_transformer() size, defined but never run"),
    ZooEntry(
        "dlrm", "DLRM, Criteo Kaggle config: 26 tables x 16, dot interaction",
        {"batch": 128}, None, "none published; closed form in tests/test_zoo.py", dlrm.dlrm,
        other_dims="AutoTM's kaggle_dlrm batch (never run in the paper)"),
    ZooEntry(
        "bert_base", "BERT-base with the masked-LM head", {"batch": 32, "seq": 512},
        110_000_000, "Devlin et al. 2019: 110M; exact: transformers BertModel 109,482,240 "
        "with pooler (ours: no pooler, MLM head instead)", transformer.bert_base, max_seq=512,
        other_dims="not in the paper; seq 512 is BERT's long pre-training phase"),
    ZooEntry(
        "gpt2_small", "GPT-2 small: 12 layers, d=768, tied LM head", {"batch": 16, "seq": 1024},
        124_439_808, "transformers GPT2LMHeadModel 'gpt2' (exact, tied embeddings; the GPT-2 "
        "paper's table says 117M)", transformer.gpt2_small, max_seq=1024,
        other_dims="not in the paper; seq 1024 is GPT-2's context"),
)
