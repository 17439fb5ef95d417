"""Static checks of the Julia package, with a real Julia parser (tree-sitter-julia).

Julia itself is not installed on the development or CI machines, so this is what runs of the
Julia side here: every .jl file parses; the JSON fields the reader accesses are exactly the
fields the shared schema names (and its required ones exactly the fields read as required);
the export list names defined things; the Project.toml has the UUID, deps and compat bounds
that the Python bridge and Julia's package manager expect.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import tree_sitter
import tree_sitter_julia

from autotm_py import julia as bridge

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "julia" / "AutoTMBridge"
SOURCES = sorted((PACKAGE / "src").glob("*.jl"))
ALL_JL = sorted((ROOT / "julia").rglob("*.jl"))
ACCESSORS = {"_req": 3, "_opt": 3}  # helper name -> position of the key argument (1-based)
PARSER = tree_sitter.Parser(tree_sitter.Language(tree_sitter_julia.language()))


# ---- tree helpers ------------------------------------------------------------------------------
def parse(source: bytes) -> tree_sitter.Tree:
    return PARSER.parse(source)


def walk(node: tree_sitter.Node) -> Iterator[tree_sitter.Node]:
    yield node
    for child in node.children:
        yield from walk(child)


def syntax_problems(source: bytes) -> list[str]:
    """ERROR and MISSING nodes of a parse, as 'line:col: text' (1-based lines)."""
    problems = []
    for node in walk(parse(source).root_node):
        if node.type == "ERROR" or node.is_missing:
            kind = "missing" if node.is_missing else "unexpected"
            line, col = node.start_point
            problems.append(f"{line + 1}:{col + 1}: {kind} {node.text.decode()[:40]!r}")
    return problems


def string_value(node: tree_sitter.Node) -> str | None:
    """The text of a plain string literal (None if it interpolates or is not a string)."""
    if node.type != "string_literal":
        return None
    parts = [c for c in node.children if c.type not in ('"', '"""')]
    if any(c.type != "content" for c in parts):
        return None
    return "".join(c.text.decode() for c in parts)


def call_args(node: tree_sitter.Node) -> tuple[str | None, list[tree_sitter.Node]]:
    callee, arglist = node.children[0], node.child_by_field_name("arguments")
    arglist = arglist or next((c for c in node.children if c.type == "argument_list"), None)
    args = [c for c in (arglist.children if arglist else []) if c.is_named]
    name = callee.text.decode() if callee.type == "identifier" else None
    return name, args


def accessed_keys(paths: list[Path]) -> dict[str, set[str]]:
    """Keys passed as string literals to the JSON accessors, by accessor name."""
    keys: dict[str, set[str]] = {name: set() for name in ACCESSORS}
    for path in paths:
        for node in walk(parse(path.read_bytes()).root_node):
            if node.type != "call_expression":
                continue
            name, args = call_args(node)
            if name not in ACCESSORS or _is_definition(node):
                continue
            key = string_value(args[ACCESSORS[name] - 1])
            assert key is not None, f"{path.name}:{node.start_point[0] + 1}: {name} needs a " \
                                    "literal key so the schema check can see it"
            keys[name].add(key)
    return keys


def _is_definition(call: tree_sitter.Node) -> bool:
    parent = call.parent
    if parent is not None and parent.type == "signature":
        return True
    return parent is not None and parent.type == "assignment" and parent.children[0] == call


def schema_fields(node: Any, *, required: bool) -> set[str]:
    """Property names (or unconditionally required names) anywhere in the schema; `if`/`then`
    branches are conditional and their required lists do not count."""
    out: set[str] = set()
    if isinstance(node, dict):
        if required:
            out |= set(node.get("required", ()))
        else:
            out |= set(node.get("properties", {}))
        for key, value in node.items():
            if key not in ("if", "then"):
                out |= schema_fields(value, required=required)
    elif isinstance(node, list):
        for item in node:
            out |= schema_fields(item, required=required)
    return out


def load_schema() -> dict[str, Any]:
    return json.loads(resources.files("autotm_py").joinpath("schemas/plan.schema.json").read_text())


# ---- every .jl file is valid Julia --------------------------------------------------------------
def test_package_files_exist() -> None:
    assert {p.name for p in SOURCES} == {"AutoTMBridge.jl", "types.jl", "read.jl", "queries.jl",
                                         "apply.jl"}
    assert (PACKAGE / "test" / "runtests.jl") in ALL_JL


@pytest.mark.parametrize("path", ALL_JL, ids=lambda p: str(p.relative_to(ROOT)))
def test_julia_file_parses(path: Path) -> None:
    assert syntax_problems(path.read_bytes()) == [], f"{path} has Julia syntax errors"


DOCS = [ROOT / "docs" / "julia.md", ROOT / "julia" / "README.md"]


def julia_blocks(markdown: str) -> list[str]:
    blocks, inside, current = [], False, []
    for line in markdown.splitlines():
        if line.strip() == "```julia" and not inside:
            inside, current = True, []
        elif line.strip() == "```" and inside:
            inside = False
            blocks.append("\n".join(current) + "\n")
        elif inside:
            current.append(line)
    return blocks


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_julia_examples_in_docs_parse(doc: Path) -> None:
    blocks = julia_blocks(doc.read_text())
    assert blocks, f"{doc} has no julia examples"
    for block in blocks:
        assert syntax_problems(block.encode()) == [], f"{doc}: bad Julia in\n{block}"


BROKEN_SNIPPETS = {
    "missing end": b"function f(x)\n    if x > 0\n        return x\nend\n",
    "unbalanced paren": b"y = f(1, (2 + 3)\nz = 4\n",
    "doubled operator": b"x = 1 + * 2\n",
    "extra end": b"function f(x)\n    x\nend end\n",
    "unclosed if": b"if x\n    1\nelse\n",
    "bad struct": b"struct 1Bad\n    x::Int\nend\n",
    "unclosed string": b'msg = "never closed\n',
}


@pytest.mark.parametrize("name", sorted(BROKEN_SNIPPETS))
def test_syntax_check_catches_broken_code(name: str) -> None:
    assert syntax_problems(BROKEN_SNIPPETS[name]), f"the parser accepted {name}"


def test_syntax_check_accepts_the_constructs_we_use() -> None:
    ok = (b'@enum Tier FAST SLOW\nstruct P <: R\n    x::Union{Int,Nothing}\nend\n'
          b'Base.:(==)(a::P, b::P) = a.x == b.x\nf(x; k=1) = "$x[$k]"\n'
          b'g(xs) = Int[v for (i, v) in enumerate(xs) if i > 1]\n')
    assert syntax_problems(ok) == []


# ---- the reader reads exactly the schema's fields -----------------------------------------------
# Fields of older formats the reader still reads (version 2's `graph`: replay, now `run`).
LEGACY_FIELDS = {"graph"}


def test_reader_reads_exactly_the_schema_fields() -> None:
    keys = accessed_keys(SOURCES)
    schema = load_schema()
    read = (keys["_req"] | keys["_opt"]) - LEGACY_FIELDS
    assert read == schema_fields(schema, required=False), "Julia reads fields the schema lacks " \
        f"({sorted(read - schema_fields(schema, required=False))}) or misses some " \
        f"({sorted(schema_fields(schema, required=False) - read)})"
    assert keys["_req"] == schema_fields(schema, required=True)
    # version 2's run mode: `graph` and the arena, placed and scratch of its config
    assert keys["_opt"] == {"overlaps", "tensors", "kernels", "kernel_io", "graph", "arena",
                            "placed", "scratch", "loss_chunks", "channels_last", "precision",
                            "split_conv_grads", "host_updates", "host_share",
                            "updates_early", "gpu", "source"}
    assert "run" in keys["_req"]


def test_reader_accesses_json_only_through_the_accessors() -> None:
    """A `d["key"]`, `get(d, "key", ...)` or `haskey(d, "key")` would escape the schema check."""
    for path in SOURCES:
        for node in walk(parse(path.read_bytes()).root_node):
            where = f"{path.name}:{node.start_point[0] + 1}"
            if node.type == "index_expression":
                literals = [n for n in walk(node.children[-1]) if string_value(n) is not None]
                assert not literals, f"{where}: index with a string key; use _req/_opt"
            if node.type == "call_expression":
                name, args = call_args(node)
                if name in ("get", "haskey", "getindex") and len(args) > 1:
                    assert string_value(args[1]) is None, f"{where}: {name} with a literal key"


def test_reader_knows_the_schema_values() -> None:
    literals = {string_value(n) for n in walk(parse((PACKAGE / "src" / "read.jl").read_bytes())
                                              .root_node)}
    defs = load_schema()["$defs"]
    assert set(defs["record"]["properties"]["op"]["enum"]) <= literals
    assert set(defs["tier"]["enum"]) <= literals
    assert set(defs["move"]["properties"]["mode"]["enum"]) <= literals
    assert load_schema()["properties"]["format"]["const"] in literals


def test_the_accessor_check_sees_keys() -> None:
    """Guard against a vacuous key check: a known snippet yields its keys."""
    source = b'a = _req(_int, d, "kernel", ctx)\nb = _opt(_id, d, "overlaps", nothing, ctx)\n'
    path = Path(__file__).parent / "_jl_snippet_unused.jl"
    try:
        path.write_bytes(source)
        assert accessed_keys([path]) == {"_req": {"kernel"}, "_opt": {"overlaps"}}
    finally:
        path.unlink(missing_ok=True)


# ---- exports and the project file ---------------------------------------------------------------
def defined_names(paths: list[Path]) -> set[str]:
    names: set[str] = set()
    for path in paths:
        for node in walk(parse(path.read_bytes()).root_node):
            if node.type in ("struct_definition", "abstract_definition"):
                head = next(c for c in node.children if c.type == "type_head")
                names.add(next(n for n in walk(head) if n.type == "identifier").text.decode())
            elif node.type == "macrocall_expression" and node.text.startswith(b"@enum"):
                args = next(c for c in node.children if c.type == "macro_argument_list")
                names |= {c.text.decode() for c in args.children if c.type == "identifier"}
            elif node.type in ("const_statement",):
                names.add(next(n for n in walk(node) if n.type == "identifier").text.decode())
            elif node.type == "function_definition":
                sig = next(c for c in node.children if c.type == "signature")
                names.add(next(n for n in walk(sig) if n.type == "identifier").text.decode())
            elif node.type == "assignment" and node.children[0].type == "call_expression":
                callee = node.children[0].children[0]
                if callee.type == "identifier":
                    names.add(callee.text.decode())
    return names


def test_every_export_is_defined() -> None:
    main = parse((PACKAGE / "src" / "AutoTMBridge.jl").read_bytes()).root_node
    export = next(n for n in walk(main) if n.type == "export_statement")
    exported = {c.text.decode() for c in export.children if c.type == "identifier"}
    assert {"read_plan", "apply_plan!", "bytes_moved", "moves", "tensor_name", "Plan"} <= exported
    missing = exported - defined_names(SOURCES)
    assert not missing, f"exported but not defined: {sorted(missing)}"


def test_project_toml() -> None:
    project = tomllib.loads((PACKAGE / "Project.toml").read_text())
    assert project["name"] == bridge.BRIDGE_NAME
    assert project["uuid"] == bridge.BRIDGE_UUID
    assert set(project["deps"]) == {"JSON"}
    assert project["compat"]["julia"] == "1.10"
    assert set(project["compat"]) >= set(project["deps"]), "every dependency needs a compat bound"
    assert project["targets"]["test"] == ["Test"]


def test_runtests_reads_the_committed_fixtures() -> None:
    text = (PACKAGE / "test" / "runtests.jl").read_text()
    for name in ("plan_small.json", "plan_small.expected.json"):
        assert name in text
        assert (PACKAGE / "test" / "fixtures" / name).is_file()
