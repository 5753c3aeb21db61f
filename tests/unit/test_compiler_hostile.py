"""Hostile plans (what a confused or adversarial LLM could emit): compile_plan never raises,
every rejection is structured with a known code, and an accepted plan never names a path
outside the workspace."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activities.toolchains.compiler import compile_plan
from activities.toolchains.registry import default_registry
from contracts.convert import PATH_TYPES, CompileResult
from contracts.errors import Err

REG = default_registry()
TOOLS = [t.name for t in REG.list_tools()]
ARG_NAMES = sorted({a.name for t in REG.list_tools() for a in t.args}) + ["extra_args", "cmd", ""]
STRUCTURED = {Err.PLAN_INVALID.value, Err.COMPILER_ERROR.value, Err.PATH_ESCAPE.value}
IDS = ["a", "b", "c", "d", "quant", "ctx"]

HOSTILE_PATHS = ["/etc/passwd", "../x", "a/../../b", "converted/../../../etc/shadow", "a\x00b", "~root/x", "\\\\server\\x",
                 "link/escape.onnx", "link", "link/../input/model.onnx", ".", "./", "", "//etc", "converted/\u202e.onnx",
                 "converted/ﬁle.onnx", "input/model.onnx", "converted/q.onnx", "converted/m_ctx.onnx", "/", "..", "%2e%2e/x",
                 "converted/" + "a" * 300, "C:\\Windows\\x", "file:///etc/passwd"]
segment = st.sampled_from(["..", ".", "", "a", "converted", "input", "link", "~", "\x00", "é", "日本", "model.onnx"]) | st.text(max_size=6)
paths = st.sampled_from(HOSTILE_PATHS) | st.lists(segment, min_size=1, max_size=6).map("/".join) | st.text(max_size=30)
json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10) | paths
json_values = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
args = st.dictionaries(st.sampled_from(ARG_NAMES) | st.text(max_size=8), paths | json_values, max_size=6)
steps = st.fixed_dictionaries({
    "step_id": st.sampled_from(IDS) | st.text(max_size=10),
    "tool_name": st.sampled_from(TOOLS) | st.text(max_size=20),
    "required_args": args,
    "optional_args": args,
    "expected_outputs": st.lists(paths, max_size=3),
    "depends_on": st.lists(st.sampled_from(IDS) | st.text(max_size=4), max_size=4),
})
plans = st.fixed_dictionaries({
    "status": st.sampled_from(["OK", "OK", "OK", "NEEDS_INPUT", "ok", ""]),
    "intent": st.dictionaries(st.text(max_size=8), json_leaf, max_size=3),
    "steps": st.lists(steps, max_size=6),
    "rationale": st.text(max_size=20),
})


@pytest.fixture(scope="module")
def ws() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as outside:
        root = Path(d)
        (root / "input").mkdir()
        (root / "input" / "model.onnx").write_bytes(b"onnx")
        (Path(outside) / "escape.onnx").write_bytes(b"x")
        os.symlink(outside, root / "link")
        yield root


def check(result: CompileResult, root: Path) -> None:
    assert isinstance(result, CompileResult)
    if not result.ok:
        assert result.errors and not result.steps
        for e in result.errors:
            assert e.code in STRUCTURED, e
            assert e.where and e.message
        return
    assert not result.errors and result.steps
    real = root.resolve()
    seen: set[str] = set()
    for s in result.steps:
        assert set(s.depends_on) <= seen, "steps out of dependency order"
        seen.add(s.step_id)
        spec = REG.get_tool_spec(s.tool_name, s.tool_version)
        path_params = [v for k, v in s.params.items() if spec.arg(k) and spec.arg(k).type in PATH_TYPES]
        for rel in [*s.inputs, *s.outputs, *path_params]:
            assert isinstance(rel, str) and rel and "\x00" not in rel
            pure = PurePosixPath(rel)
            assert not pure.is_absolute() and ".." not in pure.parts
            resolved = (real / rel).resolve()
            assert resolved != real and real in resolved.parents, rel


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=plans)
def test_random_hostile_plans_are_rejected_structurally_or_stay_inside(ws: Path, plan: dict) -> None:
    check(compile_plan(plan, REG, ws), ws)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=paths, arg=st.sampled_from(["model", "output"]), tool=st.sampled_from(["ortqnn.quantize_qdq", "onnx.fp16"]))
def test_hostile_paths_in_otherwise_valid_step(ws: Path, path: str, arg: str, tool: str) -> None:
    required = {"model": "input/model.onnx", "output": "converted/out.onnx"} | {arg: path}
    if tool == "ortqnn.quantize_qdq":
        required["precision"] = "int8"
    result = compile_plan({"status": "OK", "steps": [{"step_id": "s", "tool_name": tool, "required_args": required}]}, REG, ws)
    check(result, ws)
    parts = path.split("/")
    if "\x00" in path or ".." in parts or parts[0] == "link" or path.startswith(("/", "~")):
        assert not result.ok


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(min_value=2, max_value=300), closing=st.integers(min_value=0, max_value=299))
def test_deep_dependency_cycles(ws: Path, n: int, closing: int) -> None:
    """A chain s0 ← s1 ← … ← s(n-1), closed into a cycle by s(closing % n) depending on the last."""
    steps = [{"step_id": f"s{i}", "tool_name": "onnx.fp16",
              "required_args": {"model": "input/model.onnx" if i == 0 else f"converted/{i - 1}.onnx", "output": f"converted/{i}.onnx"},
              "depends_on": [f"s{i - 1}"] if i else []} for i in range(n)]
    assert compile_plan({"status": "OK", "steps": steps}, REG, ws).ok  # the chain itself is fine
    steps[closing % n]["depends_on"].append(f"s{n - 1}")
    result = compile_plan({"status": "OK", "steps": steps}, REG, ws)
    check(result, ws)
    assert [e.code for e in result.errors] == [Err.PLAN_INVALID.value]
    if closing % n == n - 1:  # the last step made to depend on itself
        assert result.errors[0].message == "step depends on itself"
    else:
        assert result.errors[0].message.startswith("depends_on has a cycle among steps [")


@settings(max_examples=100, deadline=None)
@given(raw=st.text(max_size=200) | st.binary(max_size=100) | json_values)
def test_garbage_plans(raw: object) -> None:
    result = compile_plan(raw, REG, Path(tempfile.gettempdir()))
    assert not result.ok and {e.code for e in result.errors} <= STRUCTURED
