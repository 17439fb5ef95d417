"""Bad input, through the CLI: one line `error: ...` naming the input and the fix, a non-zero
exit code, no traceback (unless -v). And the same cases through the API, as typed errors."""

from __future__ import annotations

import onnx
import pytest

from autotm_py.cli import main
from autotm_py.errors import ConfigError, ModelImportError, ShapeError, UnsupportedOpError
from autotm_py.frontend.onnx import import_model, import_onnx
from tests.fixtures import onnx_models as M


def _write(path, model):
    onnx.save(model, path)
    return path


def _bad_files(tmp):
    """name -> (file, extra CLI args, words the message must contain)."""
    valid = M.dynamic_relu(default_dims={"batch": 2, "seq": 3}).SerializeToString()
    (tmp / "empty.onnx").write_bytes(b"")
    (tmp / "truncated.onnx").write_bytes(valid[: len(valid) // 2])
    (tmp / "text.onnx").write_text("this is not a model\n")
    (tmp / "data").mkdir()
    old = M.dynamic_relu(default_dims={"batch": 2, "seq": 3})
    old.opset_import[0].version = 8
    new = M.dynamic_relu(default_dims={"batch": 2, "seq": 3})
    new.opset_import[0].version = 99
    mismatch = M.make([M.node("MatMul", ["x", "W"], ["y"])], [M.inp("x", [2, 3])], ["y"],
                      [M.init("W", [[1.0] * 5] * 4)])
    return {
        "missing": (tmp / "nope.onnx", [], ["nope.onnx", "does not exist"]),
        "directory": (tmp / "data", [], ["is not a file"]),
        "empty": (tmp / "empty.onnx", [], ["empty.onnx", "is empty"]),
        "truncated": (tmp / "truncated.onnx", [], ["truncated.onnx", "truncated"]),
        "not-onnx": (tmp / "text.onnx", [], ["text.onnx", "not a readable ONNX model"]),
        "escaping-data": (_write(tmp / "esc.onnx", M.external_weight("../w.bin")), [],
                          ["'W'", "../w.bin", "outside the model's folder"]),
        "absolute-data": (_write(tmp / "abs.onnx", M.external_weight("/etc/hosts")), [],
                          ["/etc/hosts", "outside the model's folder"]),
        "cycle": (_write(tmp / "cycle.onnx", M.cycle()), [], ["cycle", "a_node"]),
        "dangling": (_write(tmp / "dangling.onnx", M.dangling()), [], ["'ghost'", "dangling"]),
        "unbound-dim": (_write(tmp / "dyn.onnx", M.dynamic_relu()), ["--batch", "2"],
                        ["'x'", "'seq'", "--dim seq=VALUE"]),
        "bad-dim-syntax": (tmp / "dyn.onnx", ["--dim", "seq"], ["--dim 'seq'", "NAME=VALUE"]),
        "bad-dim-value": (tmp / "dyn.onnx", ["--dim", "seq=-4"], ["--dim 'seq=-4'"]),
        "unknown-dim": (tmp / "dyn.onnx", ["--dim", "sequence=4"],
                        ["'sequence'", "batch, seq"]),
        "bad-batch": (tmp / "dyn.onnx", ["--batch", "0"], ["--batch 0"]),
        "hard-coded-batch": (_write(tmp / "hard.onnx", M.hardcoded_batch()), ["--batch", "3"],
                             ["Reshape", "--batch 3", "dynamic batch axis"]),
        "custom-domain": (_write(tmp / "ms.onnx", M.unsupported_op()), [],
                          ["'FusedGemm'", "'com.microsoft'", "the_bad_node", "supported: "]),
        "unsupported-op": (_write(tmp / "selu.onnx", M.unsupported_op("", "Selu")), [],
                           ["'Selu'", "'ai.onnx'", "opset 17", "Conv, ConvTranspose"]),
        "inconsistent-shapes": (_write(tmp / "mm.onnx", mismatch), [],
                                ["shape inference failed", "MatMul"]),
        "old-opset": (_write(tmp / "old.onnx", old), [], ["opset 8", "version_converter"]),
        "new-opset": (_write(tmp / "new.onnx", new), [], ["opset 99", "upgrade the onnx"]),
    }


CASES = ["missing", "directory", "empty", "truncated", "not-onnx", "escaping-data",
         "absolute-data", "cycle", "dangling", "unbound-dim", "bad-dim-syntax", "bad-dim-value",
         "unknown-dim", "bad-batch", "hard-coded-batch", "inconsistent-shapes", "custom-domain",
         "unsupported-op", "old-opset", "new-opset"]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    return _bad_files(tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_clean_line(case, bad_files, capsys):
    path, args, words = bad_files[case]
    code = main(["inspect", str(path), *args])
    out, err = capsys.readouterr()
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and out == ""
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_verbose_shows_the_traceback(bad_files, capsys):
    path, _, _ = bad_files["cycle"]
    assert main(["-v", "inspect", str(path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")


@pytest.mark.parametrize(("case", "error"), [
    ("missing", ModelImportError), ("truncated", ModelImportError),
    ("escaping-data", ModelImportError), ("cycle", ModelImportError),
    ("custom-domain", UnsupportedOpError), ("unsupported-op", UnsupportedOpError),
    ("hard-coded-batch", ShapeError)])
def test_api_raises_typed_errors(case, error, bad_files):
    path, args, _ = bad_files[case]
    with pytest.raises(error):
        import_onnx(path, batch=int(args[1]) if args else None)


def test_api_dims_errors():
    model = M.dynamic_relu()
    with pytest.raises(ShapeError, match="unbound symbolic dimension 'batch'"):
        import_model(model)
    with pytest.raises(ConfigError, match="no symbolic input dimension named 'nope'"):
        import_model(model, dims={"nope": 3})
    with pytest.raises(ConfigError, match="disagree"):
        import_model(model, batch=2, dims={"batch": 3, "seq": 1})


def test_unsupported_error_lists_domain_opset_node_and_ops():
    with pytest.raises(UnsupportedOpError) as info:
        import_model(M.unsupported_op())
    exc = info.value
    assert (exc.op_type, exc.domain, exc.opset, exc.node) == ("FusedGemm", "com.microsoft", 17,
                                                              "the_bad_node")
    assert "Conv" in exc.supported and "Upsample" in exc.supported


def test_every_unsupported_op_is_named_with_its_count(capsys, tmp_path):
    """Not only the first: each unsupported op type once, with how many nodes use it."""
    nodes = [M.node("Relu", ["x"], ["a"]),
             onnx.helper.make_node("FusedGemm", ["a"], ["b"], name="g1", domain="com.microsoft"),
             onnx.helper.make_node("FusedGemm", ["b"], ["c"], name="g2", domain="com.microsoft"),
             M.node("Relu", ["c"], ["d"]),
             onnx.helper.make_node("Bogus", ["d"], ["y"], name="bog")]
    model = M.make(nodes, [M.inp("x", [2, 4])], ["y"], extra_opsets=[("com.microsoft", 1)])
    with pytest.raises(UnsupportedOpError) as info:
        import_model(model)
    exc = info.value
    assert exc.others == (("FusedGemm", "com.microsoft", 2, "g1"), ("Bogus", "", 1, "bog"))
    text = str(exc)
    assert "3 nodes of 2 op types" in text and "'FusedGemm' of domain 'com.microsoft' x2" in text
    assert "'Bogus' x1 (node 'bog')" in text
    path = _write(tmp_path / "two_bad.onnx", model)
    assert main(["inspect", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FusedGemm" in err[0] and "Bogus" in err[0]


def test_shape_op_on_runtime_data_is_named():
    """An op that is supported only on constants, applied to run-time data."""
    nodes = [M.node("Relu", ["x"], ["r"]), M.node("Equal", ["r", "x"], ["y"])]
    model = M.make(nodes, [M.inp("x", [4])], [onnx.helper.make_tensor_value_info(
        "y", onnx.TensorProto.BOOL, None)])
    with pytest.raises(UnsupportedOpError, match="'Equal'"):
        import_model(model)


def test_malformed_default_dims_metadata():
    model = M.dynamic_relu()
    onnx.helper.set_model_props(model, {"autotm.default_dims": "{not json"})
    with pytest.raises(ModelImportError, match=r"autotm\.default_dims"):
        import_model(model)
