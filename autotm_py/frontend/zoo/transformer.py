"""Sequence models: the encoder-decoder Transformer, BERT-base and GPT-2 small.

Inputs are int64 token ids of shape (batch, seq), both dims symbolic; the output is logits
(batch, seq, vocab) over the last axis. No dropout and no padding mask (every position is a
real token): the graphs are deterministic, and the memory and time of one iteration do not
depend on either.
"""

from __future__ import annotations

import numpy as np
import onnx

from autotm_py.frontend.zoo.attention import (
    attention,
    causal_mask,
    embedding,
    feed_forward,
    fused_attention,
    gelu,
    layer_norm,
    linear,
    positions,
    seq_square,
    tied_logits,
)
from autotm_py.frontend.zoo.layers import INT64, NetBuilder


def _ids(b: NetBuilder, name: str) -> str:
    return b.add_input(name, INT64, ["batch", "seq"])


# ---- Transformer (Vaswani et al. 2017), AutoTM's size -----------------------------------------
TRANSFORMER = {"layers": 8, "d": 512, "dff": 2048, "heads": 8, "vocab": 20000}
SINUSOID_ROWS = 1024  # positions covered by the constant sinusoid table


def sinusoid_table(rows: int, d: int) -> np.ndarray:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same) (section 3.5)."""
    pos = np.arange(rows, dtype=np.float64)[:, None]
    angle = pos / np.power(10000.0, np.arange(0, d, 2, dtype=np.float64) / d)[None, :]
    table = np.empty((rows, d), dtype=np.float32)
    table[:, 0::2], table[:, 1::2] = np.sin(angle), np.cos(angle)
    return table


def _embed_scaled(b: NetBuilder, ids: str, table: str, pe: str, d: int) -> str:
    """sqrt(d) * E[ids] + PE[positions] (the embedding table is shared by both sides)."""
    tokens = b.op("Mul", b.op("Gather", table, ids, axis=0), b.scalar(np.sqrt(d)))
    return b.op("Add", tokens, b.op("Gather", pe, positions(b, seq_square(b, ids)), axis=0))


def _encoder_layer(b: NetBuilder, x: str, cfg: dict[str, int]) -> str:
    d = cfg["d"]
    x = layer_norm(b, b.op("Add", x, attention(b, x, x, d=d, heads=cfg["heads"],
                                               name="self_attn")), d, eps=1e-5, name="norm1")
    ffn = feed_forward(b, x, d=d, dff=cfg["dff"], act="relu", name="ffn")
    return layer_norm(b, b.op("Add", x, ffn), d, eps=1e-5, name="norm2")


def _decoder_layer(b: NetBuilder, x: str, memory: str, mask: str, cfg: dict[str, int]) -> str:
    d, h = cfg["d"], cfg["heads"]
    own = attention(b, x, x, d=d, heads=h, mask=mask, name="self_attn")
    x = layer_norm(b, b.op("Add", x, own), d, eps=1e-5, name="norm1")
    cross = attention(b, x, memory, d=d, heads=h, name="cross_attn")
    x = layer_norm(b, b.op("Add", x, cross), d, eps=1e-5, name="norm2")
    ffn = feed_forward(b, x, d=d, dff=cfg["dff"], act="relu", name="ffn")
    return layer_norm(b, b.op("Add", x, ffn), d, eps=1e-5, name="norm3")


def transformer(batch: int, seq: int) -> onnx.ModelProto:
    """Post-LN encoder-decoder; source and target share the `seq` dim and one vocabulary."""
    cfg, b = TRANSFORMER, NetBuilder("transformer")
    src, tgt = _ids(b, "src_ids"), _ids(b, "tgt_ids")
    with b.scope("embed"):
        table = b.weight("weight", (cfg["vocab"], cfg["d"]))
    pe = b.const(sinusoid_table(max(SINUSOID_ROWS, seq), cfg["d"]), np.float32)
    memory = _embed_scaled(b, src, table, pe, cfg["d"])
    for i in range(cfg["layers"]):
        with b.scope(f"encoder.{i}"):
            memory = _encoder_layer(b, memory, cfg)
    x = _embed_scaled(b, tgt, table, pe, cfg["d"])
    mask = causal_mask(b, seq_square(b, tgt))
    for i in range(cfg["layers"]):
        with b.scope(f"decoder.{i}"):
            x = _decoder_layer(b, x, memory, mask, cfg)
    b.add_output(tied_logits(b, x, table), "logits", ["batch", "seq", cfg["vocab"]])
    doc = "Transformer encoder-decoder (N=8, d=512, dff=2048, h=8, shared 20000-token vocab)"
    return b.build({"batch": batch, "seq": seq}, doc, {"src_ids": cfg["vocab"],
                                                      "tgt_ids": cfg["vocab"]})


# ---- BERT-base (Devlin et al. 2019) with the masked-LM head ----------------------------------
BERT = {"layers": 12, "d": 768, "dff": 3072, "heads": 12, "vocab": 30522, "positions": 512}


def _bert_embeddings(b: NetBuilder, ids: str) -> tuple[str, str]:
    cfg = BERT
    with b.scope("embeddings"):
        words, table = embedding(b, ids, cfg["vocab"], cfg["d"], name="word_embeddings")
        pos_ids = positions(b, seq_square(b, ids))
        pos, _ = embedding(b, pos_ids, cfg["positions"], cfg["d"], name="position_embeddings")
        # Single-segment input: every token type is 0, so row 0 of the table is added.
        segment, _ = embedding(b, b.const(0), 2, cfg["d"], name="token_type_embeddings")
        x = b.op("Add", b.op("Add", words, pos), segment)
        return layer_norm(b, x, cfg["d"], eps=1e-12, name="LayerNorm"), table


def _bert_layer(b: NetBuilder, x: str) -> str:
    d = BERT["d"]
    ctx = attention(b, x, x, d=d, heads=BERT["heads"], name="attention", out_name="output")
    x = layer_norm(b, b.op("Add", x, ctx), d, eps=1e-12, name="attention_norm")
    ffn = feed_forward(b, x, d=d, dff=BERT["dff"], act="erf", name="ffn",
                       names=("intermediate", "output"))
    return layer_norm(b, b.op("Add", x, ffn), d, eps=1e-12, name="output_norm")


def bert_base(batch: int, seq: int) -> onnx.ModelProto:
    """BERT-base encoder + masked-LM head (dense, GELU, LayerNorm, tied decoder + bias)."""
    b = NetBuilder("bert_base")
    ids = _ids(b, "input_ids")
    x, table = _bert_embeddings(b, ids)
    for i in range(BERT["layers"]):
        with b.scope(f"encoder.{i}"):
            x = _bert_layer(b, x)
    with b.scope("cls"):
        h = feed_forward_head(b, x)
        logits = b.op("Add", tied_logits(b, h, table), b.weight("bias", (BERT["vocab"],)))
    b.add_output(logits, "logits", ["batch", "seq", BERT["vocab"]])
    return b.build({"batch": batch, "seq": seq}, "BERT-base with the masked-LM head",
                   {"input_ids": BERT["vocab"]})


def feed_forward_head(b: NetBuilder, x: str) -> str:
    """The masked-LM head's transform: Linear(d, d) -> GELU -> LayerNorm."""
    h = gelu(b, linear(b, x, BERT["d"], BERT["d"], name="transform"), "erf")
    return layer_norm(b, h, BERT["d"], eps=1e-12, name="transform_norm")


# ---- GPT-2 small (Radford et al. 2019) -------------------------------------------------------
GPT2 = {"layers": 12, "d": 768, "heads": 12, "vocab": 50257, "positions": 1024}


def _gpt2_block(b: NetBuilder, x: str, mask: str, cfg: dict[str, int]) -> str:
    d = cfg["d"]
    a = fused_attention(b, layer_norm(b, x, d, eps=1e-5, name="ln_1"), d=d,
                        heads=cfg["heads"], mask=mask, name="attn")
    x = b.op("Add", x, a)
    m = feed_forward(b, layer_norm(b, x, d, eps=1e-5, name="ln_2"), d=d, dff=4 * d,
                     act="tanh", name="mlp", names=("c_fc", "c_proj"))
    return b.op("Add", x, m)


def gpt_decoder(cfg: dict[str, int] = GPT2, name: str = "gpt2_small") -> NetBuilder:
    """Pre-LN decoder, causal self-attention, tanh GELU, LM head tied to the token table, of
    any size (`cfg` as GPT2: layers, d, heads, vocab, positions); the builder, output added."""
    b = NetBuilder(name)
    ids = _ids(b, "input_ids")
    square = seq_square(b, ids)
    tokens, table = embedding(b, ids, cfg["vocab"], cfg["d"], name="wte")
    pos, _ = embedding(b, positions(b, square), cfg["positions"], cfg["d"], name="wpe")
    x, mask = b.op("Add", tokens, pos), causal_mask(b, square)
    for i in range(cfg["layers"]):
        with b.scope(f"h.{i}"):
            x = _gpt2_block(b, x, mask, cfg)
    x = layer_norm(b, x, cfg["d"], eps=1e-5, name="ln_f")
    b.add_output(tied_logits(b, x, table), "logits", ["batch", "seq", cfg["vocab"]])
    return b


def gpt2_small(batch: int, seq: int) -> onnx.ModelProto:
    """Pre-LN decoder, causal self-attention, tanh GELU, LM head tied to the token table."""
    b = gpt_decoder()
    return b.build({"batch": batch, "seq": seq}, "GPT-2 small (124M, tied LM head)",
                   {"input_ids": GPT2["vocab"]})
