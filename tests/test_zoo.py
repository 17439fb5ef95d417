"""The model zoo: valid ONNX, shapes at any batch, parameter counts against published or
independently derived numbers, the export CLI, and the sequence helpers run by onnxruntime."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import shape_inference

from autotm_py.cli import main as cli_main
from autotm_py.errors import ConfigError
from autotm_py.frontend.zoo import (
    DEFAULT_DIMS_KEY,
    INDEX_RANGES_KEY,
    ZOO,
    build_graph,
    build_model,
    count_params,
    export_model,
)
from autotm_py.frontend.zoo.attention import (
    causal_mask,
    embedding,
    fused_attention,
    positions,
    seq_square,
    tied_logits,
)
from autotm_py.frontend.zoo.dlrm import KAGGLE_TABLES
from autotm_py.frontend.zoo.layers import INT64, NetBuilder
from autotm_py.frontend.zoo.weights import write_weights
from autotm_py.ir.ops import FORWARD_OPS

MODELS_DIR = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    return {name: build_model(name) for name in ZOO}


def _props(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def _weights_end(model: onnx.ModelProto) -> int:
    ends = []
    for tensor in model.graph.initializer:
        info = {e.key: int(e.value) for e in tensor.external_data if e.key != "location"}
        ends.append(info["offset"] + info["length"])
    return max(ends)


def _bind(model: onnx.ModelProto, dims: dict[str, int]) -> onnx.ModelProto:
    """A copy with input dims bound and output shapes erased, shapes inferred (strict)."""
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    for value in bound.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                number = dims[dim.dim_param]
                dim.Clear()
                dim.dim_value = number
    for value in bound.graph.output:
        value.type.tensor_type.ClearField("shape")
    return shape_inference.infer_shapes(bound, check_type=True, strict_mode=True, data_prop=True)


def _shape(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in value.type.tensor_type.shape.dim]


# ---- structure -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ZOO))
def test_checker_passes_with_a_weights_file(name, tmp_path):
    path = export_model(name, tmp_path / f"{name}.onnx")
    model = onnx.load(str(path), load_external_data=False)
    with open(tmp_path / f"{name}.weights.bin", "wb") as fh:
        fh.truncate(_weights_end(model))  # sparse: the checker wants the file to exist
    onnx.checker.check_model(str(path), full_check=True)


@pytest.mark.parametrize("name", list(ZOO))
def test_one_file_serves_any_batch_and_sequence(name, models):
    model = models[name]
    entry = ZOO[name]
    for batch, seq in ((3, 17), (5, 40)):
        inferred = _bind(model, {"batch": batch, "seq": seq})
        out = _shape(inferred.graph.output[0])
        assert out[0] == batch
        if entry.is_sequence:
            assert out[1] == seq
        # every intermediate tensor has a fully known shape, so the importer never guesses
        for value in inferred.graph.value_info:
            dims = _shape(value)
            assert all(isinstance(d, int) and d > 0 for d in dims), (value.name, dims)


@pytest.mark.parametrize("name", list(ZOO))
def test_ops_inputs_outputs_and_metadata(name, models):
    model = models[name]
    ops = {node.op_type for node in model.graph.node}
    assert ops - {"Constant"} <= set(FORWARD_OPS), ops - set(FORWARD_OPS)
    assert model.opset_import[0].version == 17
    assert len(model.graph.output) == 1
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert _shape(model.graph.output[0])[0] == "batch"
    for value in model.graph.input:
        assert _shape(value)[0] == "batch"
    assert json.loads(_props(model)[DEFAULT_DIMS_KEY]) == dict(ZOO[name].default_dims)
    for tensor in model.graph.initializer:  # weights: external, never inline
        assert tensor.data_location == onnx.TensorProto.EXTERNAL
        assert not tensor.raw_data


def test_expected_outputs(models):
    expect = {"vgg19": ["batch", 1000], "dlrm": ["batch", 2],
              "transformer": ["batch", "seq", 20000], "bert_base": ["batch", "seq", 30522],
              "gpt2_small": ["batch", "seq", 50257]}
    for name, shape in expect.items():
        assert _shape(models[name].graph.output[0]) == shape
    inputs = {v.name: (_shape(v), v.type.tensor_type.elem_type)
              for v in models["dlrm"].graph.input}
    assert inputs == {"dense": (["batch", 13], onnx.TensorProto.FLOAT),
                      "sparse": (["batch", 26], onnx.TensorProto.INT64)}
    assert json.loads(_props(models["dlrm"])[INDEX_RANGES_KEY])["sparse"] == list(KAGGLE_TABLES)


# ---- parameter counts ------------------------------------------------------------------------
def _vgg_params(convs: list[tuple[int, int]]) -> int:
    fc = 25088 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 1000 + 1000
    return sum(9 * cin * cout + cout for cin, cout in convs) + fc


def _resnet_params(depths: list[int]) -> int:
    """Bottleneck ResNet by closed form (BN: 2 trainable values per channel)."""
    total, cin = 3 * 64 * 49 + 2 * 64, 64
    for planes, depth in zip((64, 128, 256, 512), depths, strict=True):
        out = 4 * planes
        block = cin_block = 0
        for index in range(depth):
            cin_block = cin if index == 0 else out
            block = cin_block * planes + 9 * planes * planes + planes * out + 2 * (2 * planes + out)
            if index == 0:
                block += cin * out + 2 * out  # projection shortcut
            total += block
        cin = out
    return total + 2048 * 1000 + 1000


def _densenet_params(k: int = 32, blocks: tuple[int, ...] = (6, 12, 64, 48)) -> int:
    total, c = 3 * 2 * k * 49 + 2 * 2 * k, 2 * k
    for index, layers in enumerate(blocks):
        for _ in range(layers):
            total += 2 * c + c * 4 * k + 2 * 4 * k + 9 * 4 * k * k
            c += k
        if index < len(blocks) - 1:
            total += 2 * c + c * (c // 2)
            c //= 2
    return total + 2 * c + c * 1000 + 1000


def _attention(d: int) -> int:
    return 4 * (d * d + d)


def _ffn(d: int, dff: int) -> int:
    return d * dff + dff + dff * d + d


def test_params_exact_published(models):
    # torchvision vgg19 / resnet50, and transformers' GPT-2 small (tied embeddings)
    for name in ("vgg19", "resnet50", "gpt2_small"):
        assert count_params(models[name]) == ZOO[name].published_params


def test_params_rounded_published(models):
    # published to 0.1M (timm model cards; Devlin et al. to 10M): ours rounds to the same
    for name, unit in (("resnet200", 1e5), ("inception_v4", 1e5), ("bert_base", 1e7)):
        assert round(count_params(models[name]) / unit) == round(ZOO[name].published_params / unit)


def test_params_closed_form(models):
    assert count_params(models["resnet50"]) == _resnet_params([3, 4, 6, 3])
    assert count_params(models["resnet200"]) == _resnet_params([3, 24, 36, 3])
    vgg416 = ([(3, 64)] + [(64, 64)] * 80 + [(64, 128)] + [(128, 128)] * 81 + [(128, 256)]
              + [(256, 256)] * 82 + [(256, 512)] + [(512, 512)] * 166)
    assert len(vgg416) == 413
    assert count_params(models["vgg416"]) == _vgg_params(vgg416)
    assert count_params(models["densenet264"]) == _densenet_params()
    assert round(_densenet_params() / 1e5) == 333  # the 33.3M usually quoted
    d, dff, ln = 512, 2048, 2 * 512
    enc, dec = _attention(d) + _ffn(d, dff) + 2 * ln, 2 * _attention(d) + _ffn(d, dff) + 3 * ln
    assert count_params(models["transformer"]) == 20000 * d + 8 * (enc + dec)
    mlps = sum(a * b + b for a, b in [(13, 512), (512, 256), (256, 64), (64, 16),
                                      (16 + 27 * 26 // 2, 512), (512, 256), (256, 2)])
    assert count_params(models["dlrm"]) == 16 * sum(KAGGLE_TABLES) + mlps


def test_bert_matches_transformers_bertmodel_minus_pooler_plus_mlm_head(models):
    pooler, d, vocab = 768 * 768 + 768, 768, 30522
    mlm_head = d * d + d + 2 * d + vocab  # transform dense + LayerNorm + decoder bias (tied)
    assert count_params(models["bert_base"]) == 109_482_240 - pooler + mlm_head


def test_batchnorm_running_stats_are_not_parameters(models):
    bn_channels = sum(
        math.prod(t.dims) for t in models["resnet50"].graph.initializer
        if t.name.endswith("running_mean"))
    total = count_params(models["resnet50"], trainable_only=False)
    assert total == count_params(models["resnet50"]) + 2 * bn_channels


# ---- API and CLI -----------------------------------------------------------------------------
def test_export_writes_dims_and_no_weights(tmp_path):
    path = export_model("bert_base", tmp_path / "b.onnx", batch=8, seq_len=128)
    model = onnx.load(str(path), load_external_data=False)
    assert json.loads(_props(model)[DEFAULT_DIMS_KEY]) == {"batch": 8, "seq": 128}
    assert _shape(model.graph.input[0]) == ["batch", "seq"]
    locations = {e.value for t in model.graph.initializer for e in t.external_data
                 if e.key == "location"}
    assert locations == {"b.weights.bin"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.onnx"]
    assert path.stat().st_size < 200_000


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"batch": 0}, "positive"),
    ({"seq_len": 64}, "no sequence dimension"),
])
def test_bad_dims_are_config_errors(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        build_model("resnet50", **kwargs)
    with pytest.raises(ConfigError, match="at most 1024"):
        build_model("gpt2_small", seq_len=2048)


def test_cli_export_and_errors(tmp_path, capsys):
    out = tmp_path / "v.onnx"
    assert cli_main(["zoo", "export", "vgg19", "--batch", "64", "-o", str(out)]) == 0
    assert "weights not written" in capsys.readouterr().out
    model = onnx.load(str(out), load_external_data=False)
    assert json.loads(_props(model)[DEFAULT_DIMS_KEY]) == {"batch": 64}
    bad = tmp_path / "bad.onnx"
    assert cli_main(["zoo", "export", "vgg20", "-o", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown zoo model 'vgg20'") and "vgg19" in err
    assert "\n" not in err and not bad.exists()


def test_cli_list_json(capsys):
    assert cli_main(["zoo", "list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert list(rows) == list(ZOO)
    assert rows["resnet50"]["params"] == 25_557_032
    assert rows["gpt2_small"]["default_dims"] == {"batch": 16, "seq": 1024}


def test_models_dir_is_up_to_date(tmp_path):
    for name in ZOO:
        shipped = MODELS_DIR / f"{name}.onnx"
        fresh = export_model(name, tmp_path / f"{name}.onnx")
        assert shipped.read_bytes() == fresh.read_bytes(), \
            f"models/{name}.onnx is stale: run python models/export_all.py"


# ---- running for real (onnxruntime) ---------------------------------------------------------
def test_positions_and_causal_mask_follow_the_sequence_length():
    b = NetBuilder("aux")
    ids = b.add_input("ids", INT64, ["batch", "seq"])
    square = seq_square(b, ids)
    b.add_output(b.op("Cast", positions(b, square), to=onnx.TensorProto.FLOAT), "pos", ["seq"])
    b.add_output(causal_mask(b, square), "mask", ["seq", "seq"])
    session = ort.InferenceSession(b.build({"batch": 1, "seq": 1}, "").SerializeToString())
    for seq in (1, 6):
        pos, mask = session.run(None, {"ids": np.full((2, seq), 7, dtype=np.int64)})
        assert pos.tolist() == list(range(seq))
        assert np.array_equal(mask == 0, np.tril(np.ones((seq, seq), dtype=bool)))


def test_causal_attention_never_looks_ahead(tmp_path):
    """A one-block GPT built from the zoo's helpers, with written weights, run by ORT: changing
    the last token changes only the last position's logits."""
    b = NetBuilder("tiny")
    ids = b.add_input("ids", INT64, ["batch", "seq"])
    square = seq_square(b, ids)
    tokens, table = embedding(b, ids, 50, 16, name="wte")
    pos, _ = embedding(b, positions(b, square), 32, 16, name="wpe")
    x = b.op("Add", tokens, pos)
    x = b.op("Add", x, fused_attention(b, x, d=16, heads=2, mask=causal_mask(b, square),
                                       name="attn"))
    b.add_output(tied_logits(b, x, table), "logits", ["batch", "seq", 50])
    model = b.build({"batch": 1, "seq": 8}, "")
    write_weights(model, tmp_path / b.location)
    (tmp_path / "tiny.onnx").write_bytes(model.SerializeToString())
    session = ort.InferenceSession(str(tmp_path / "tiny.onnx"))
    first = np.array([[3, 1, 4, 1, 5, 9]], dtype=np.int64)
    changed = first.copy()
    changed[0, -1] = 2
    a, c = (session.run(None, {"ids": v})[0] for v in (first, changed))
    assert np.allclose(a[:, :-1], c[:, :-1]) and not np.allclose(a[:, -1], c[:, -1])


def test_resnet50_runs_with_written_weights(tmp_path):
    path = export_model("resnet50", tmp_path / "r.onnx", with_weights=True)
    weights = tmp_path / "r.weights.bin"
    assert weights.stat().st_size == _weights_end(onnx.load(str(path), load_external_data=False))
    loaded = {t.name: onnx.numpy_helper.to_array(t, base_dir=str(tmp_path))
              for t in onnx.load(str(path)).graph.initializer}
    assert np.all(loaded["layer1.0.conv3.bn.weight"] == 0)  # zero-init residual branch end
    assert np.all(loaded["layer1.0.conv3.bn.running_var"] == 1)
    assert abs(loaded["stem.conv.weight"].std() - math.sqrt(2 / 147)) < 0.01  # He-normal
    session = ort.InferenceSession(str(path))
    logits = session.run(None, {"images": np.ones((2, 3, 224, 224), np.float32)})[0]
    assert logits.shape == (2, 1000) and np.isfinite(logits).all()


# ---- through the importer --------------------------------------------------------------------
def _output_shape(graph) -> tuple[int, ...]:
    (out,) = graph.outputs
    return graph.tensors[out].shape


def test_build_graph_binds_defaults_and_overrides():
    assert _output_shape(build_graph("dlrm")) == (128, 2)  # the file's default batch
    assert _output_shape(build_graph("dlrm", batch=4)) == (4, 2)
    gpt2 = build_graph("gpt2_small", dims={"batch": 2, "seq": 16})
    assert _output_shape(gpt2) == (2, 16, 50257)
    assert _output_shape(build_graph("bert_base", batch=3, dims={"seq": 8})) == (3, 8, 30522)


@pytest.mark.parametrize("name", ["resnet50", "dlrm", "inception_v4"])
def test_imported_weights_are_the_models_parameters(name):
    graph = build_graph(name, batch=2)
    weights = sum(math.prod(t.shape) for t in graph.tensors if t.role.value == "weight")
    assert weights == count_params(build_model(name), trainable_only=False)
    graph.validate()
