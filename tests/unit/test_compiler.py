"""The plan compiler: each kind of rejection is structured, and a valid plan compiles in
dependency order with normalised workspace-relative paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from activities.toolchains._argv import build_argv
from activities.toolchains.compiler import compile_plan
from activities.toolchains.registry import ToolRegistry, default_registry, get_tool_spec, list_tools
from activities.toolchains.socs import lookup_soc, soc_by_model
from contracts.convert import ArgSpec, CompileResult, ConversionPlan, ToolSpec, Toolchain
from contracts.errors import Err, FleetforgeError


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "model.onnx").write_bytes(b"onnx")
    return tmp_path


def step(step_id: str, tool: str, required: dict | None = None, optional: dict | None = None,
         depends_on: list[str] | None = None, expected: list[str] | None = None) -> dict:
    return {"step_id": step_id, "tool_name": tool, "required_args": required or {}, "optional_args": optional or {},
            "depends_on": depends_on or [], "expected_outputs": expected or []}


def plan(*steps: dict) -> dict:
    return {"status": "OK", "intent": {"target_soc": "sm8550", "precision": "int8"}, "steps": list(steps), "rationale": "test"}


def qdq(step_id: str = "quant", **over: object) -> dict:
    args = {"model": "input/model.onnx", "output": "converted/q.onnx", "precision": "int8"} | over
    return step(step_id, "ortqnn.quantize_qdq", args)


def ctx(step_id: str = "ctx", model: str = "converted/q.onnx", depends_on: list[str] | None = None, **optional: object) -> dict:
    return step(step_id, "ortqnn.context_binary", {"model": model, "soc": "sm8550", "output": "converted/m_ctx.onnx"},
                optional, depends_on=["quant"] if depends_on is None else depends_on)


def rejected(result: CompileResult, code: Err, where: str) -> str:
    assert not result.ok and not result.steps
    hits = [e for e in result.errors if e.code == code and e.where == where]
    assert hits, f"no {code} at {where}: {result.errors}"
    return hits[0].message


def compile_(p: dict | str, ws: Path) -> CompileResult:
    return compile_plan(p, default_registry(), ws)


# ---- SoCs and registry -------------------------------------------------------------------------

@pytest.mark.parametrize("name,model,arch", [("SM8350", 30, 68), ("sm8450", 36, 69), ("Sm8550", 43, 73),
                                             ("SM8650", 57, 75), ("sm8750", 69, 79), ("SM8850", 87, 81)])
def test_soc_table(name: str, model: int, arch: int) -> None:
    soc = lookup_soc(name)
    assert (soc.name, soc.soc_model, soc.htp_arch, soc.arch_name) == (name.upper(), model, arch, f"v{arch}")
    assert soc_by_model(model) == soc


def test_unknown_soc_is_bad_input_listing_valid_ones() -> None:
    with pytest.raises(FleetforgeError) as e:
        lookup_soc("sm9999")
    assert e.value.code is Err.BAD_INPUT and "SM8550" in e.value.message and "SM8850" in e.value.message


def test_registry_lists_versioned_specs_by_toolchain() -> None:
    names = {t.name for t in list_tools()}
    assert {"onnx.fp16", "onnx.quantize_dynamic", "onnx.quantize_static", "onnx.to_ort",
            "ortqnn.quantize_qdq", "ortqnn.context_binary"} <= names
    assert {t.name for t in list_tools(Toolchain.ORT_QNN)} == {"ortqnn.quantize_qdq", "ortqnn.context_binary"}
    spec = get_tool_spec("ortqnn.context_binary")
    assert spec.version == "1.0" and spec.arg("precision").enum_values == ["fp16", "int8", "w8a16", "w4a16"]
    assert spec.arg("dump_dlc").type == "bool" and spec.arg("dlc_dir").requires == {"dump_dlc": True}
    with pytest.raises(FleetforgeError) as e:
        get_tool_spec("qairt.nope")
    assert e.value.code is Err.BAD_INPUT


def test_registry_newest_version_wins_unless_asked() -> None:
    base = get_tool_spec("onnx.to_ort")
    newer = base.model_copy(update={"version": "1.10"})
    reg = ToolRegistry([base, newer])
    assert reg.get_tool_spec("onnx.to_ort").version == "1.10"
    assert reg.get_tool_spec("onnx.to_ort", "1.0").version == "1.0"


# ---- a valid plan ------------------------------------------------------------------------------

def test_valid_multi_step_plan_compiles_in_dependency_order(ws: Path) -> None:
    p = plan(
        step("ort", "onnx.to_ort", {"model": "converted/./fp16.onnx", "output": "converted/m.ort"}, depends_on=["fp16"]),
        ctx(precision="int8", dump_dlc=True, dlc_dir="converted/dlc"),
        step("fp16", "onnx.fp16", {"model": "input/model.onnx", "output": "converted/fp16.onnx"}),
        qdq(),
    )
    p["steps"][1]["expected_outputs"] = ["converted/m_ctx_qnn.bin", "converted/dlc/x.dlc"]
    result = compile_(p, ws)
    assert result.ok, result.feedback()
    order = [s.step_id for s in result.steps]
    assert order.index("fp16") < order.index("ort") and order.index("quant") < order.index("ctx")
    by = {s.step_id: s for s in result.steps}
    assert by["ort"].inputs == ["converted/fp16.onnx"]  # normalised
    assert by["ctx"].outputs == ["converted/m_ctx.onnx", "converted/m_ctx_qnn.bin", "converted/dlc"]
    assert by["ctx"].params == {"model": "converted/q.onnx", "soc": "sm8550", "output": "converted/m_ctx.onnx",
                                "precision": "int8", "graph_optimization": "default", "dump_dlc": True,
                                "dlc_dir": "converted/dlc"}
    assert by["quant"].params["calibration_samples"] == 8  # defaults filled in
    assert all(s.argv is None and s.tool_version == "1.0" for s in result.steps)  # in-process tools: typed params


def test_plan_as_json_text_and_case_insensitive_enum(ws: Path) -> None:
    p = ConversionPlan.model_validate(plan(qdq(precision="INT8"))).model_dump_json()
    result = compile_(p, ws)
    assert result.ok and result.steps[0].params["precision"] == "int8"


# ---- rejections --------------------------------------------------------------------------------

def test_schema_violations_are_plan_invalid(ws: Path) -> None:
    rejected(compile_("{not json", ws), Err.PLAN_INVALID, "plan")
    rejected(compile_({"status": "MAYBE", "steps": []}, ws), Err.PLAN_INVALID, "plan.status")
    bad = plan(qdq())
    bad["steps"][0]["shell"] = "rm -rf /"
    rejected(compile_(bad, ws), Err.PLAN_INVALID, "plan.steps[0].shell")
    rejected(compile_(plan(), ws), Err.PLAN_INVALID, "plan")
    needs = {"status": "NEEDS_INPUT", "questions": ["Which SoC?"], "intent": {}, "steps": [], "rationale": "?"}
    assert "NEEDS_INPUT" in rejected(compile_(needs, ws), Err.PLAN_INVALID, "plan")


def test_unknown_tool_is_rejected_naming_known_tools(ws: Path) -> None:
    msg = rejected(compile_(plan(step("x", "qairt.converter", {"model": "input/model.onnx"})), ws), Err.COMPILER_ERROR, "x")
    assert "qairt.converter" in msg and "ortqnn.context_binary" in msg


def test_missing_required_arg(ws: Path) -> None:
    s = qdq()
    del s["required_args"]["precision"]
    assert "precision" in rejected(compile_(plan(s), ws), Err.COMPILER_ERROR, "quant.precision")


def test_unsupported_optional_arg(ws: Path) -> None:
    s = qdq()
    s["optional_args"] = {"extra_args": "--force"}
    assert "extra_args" in rejected(compile_(plan(s), ws), Err.COMPILER_ERROR, "quant.extra_args")


def test_arg_in_both_required_and_optional(ws: Path) -> None:
    s = qdq()
    s["optional_args"] = {"precision": "int8"}
    rejected(compile_(plan(s), ws), Err.PLAN_INVALID, "quant.precision")


@pytest.mark.parametrize("arg,value", [("precision", "int4"), ("precision", 8), ("calibration_samples", "8"),
                                       ("calibration_samples", True), ("per_channel", "yes")])
def test_wrong_types_and_enum_values(ws: Path, arg: str, value: object) -> None:
    rejected(compile_(plan(qdq(**{arg: value})), ws), Err.COMPILER_ERROR, f"quant.{arg}")


def test_bad_soc_enum_lists_socs(ws: Path) -> None:
    s = ctx()
    s["required_args"]["soc"] = "sm9000"
    assert "sm8850" in rejected(compile_(plan(qdq(), s), ws), Err.COMPILER_ERROR, "ctx.soc")


def test_conditional_requirement(ws: Path) -> None:
    msg = rejected(compile_(plan(qdq(), ctx(dlc_dir="converted/dlc")), ws), Err.COMPILER_ERROR, "ctx.dlc_dir")
    assert "dump_dlc" in msg
    assert compile_(plan(qdq(), ctx(dump_dlc=True, dlc_dir="converted/dlc")), ws).ok


def test_conditionally_required_arg_must_be_given_when_condition_holds(ws: Path) -> None:
    spec = ToolSpec(name="t.cond", toolchain=Toolchain.ONNX, version="1", outputs=["output"], args=[
        ArgSpec(name="model", type="path_in", required=True), ArgSpec(name="output", type="path_out", required=True),
        ArgSpec(name="mode", type="enum", enum_values=["a", "b"], default="a"),
        ArgSpec(name="b_level", type="int", required=True, requires={"mode": "b"}),
    ])
    reg = ToolRegistry([spec])
    base = {"model": "input/model.onnx", "output": "converted/o.onnx"}
    assert compile_plan(plan(step("s", "t.cond", base)), reg, ws).ok
    rejected(compile_plan(plan(step("s", "t.cond", base | {"mode": "b"})), reg, ws), Err.COMPILER_ERROR, "s.b_level")
    assert compile_plan(plan(step("s", "t.cond", base | {"mode": "b", "b_level": 2})), reg, ws).ok


def test_mutually_exclusive_group(ws: Path) -> None:
    (ws / "input" / "calib.npz").write_bytes(b"npz")
    s = step("static", "onnx.quantize_static", {"model": "input/model.onnx", "output": "converted/s.onnx"},
             {"calibration_samples": 4, "calibration_data": "input/calib.npz"})
    assert "mutually exclusive" in rejected(compile_(plan(s), ws), Err.COMPILER_ERROR, "static")
    del s["optional_args"]["calibration_samples"]
    assert compile_(plan(s), ws).ok


def test_depends_on_unknown_self_and_duplicates(ws: Path) -> None:
    rejected(compile_(plan(qdq(), ctx(depends_on=["ghost"])), ws), Err.PLAN_INVALID, "ctx")
    rejected(compile_(plan(qdq(), ctx(depends_on=["ctx"])), ws), Err.PLAN_INVALID, "ctx")
    rejected(compile_(plan(qdq(), qdq()), ws), Err.PLAN_INVALID, "quant")
    rejected(compile_(plan(qdq(step_id="bad id; rm")), ws), Err.PLAN_INVALID, "bad id; rm")


def test_dependency_cycle(ws: Path) -> None:
    a = step("a", "onnx.fp16", {"model": "converted/c.onnx", "output": "converted/a.onnx"}, depends_on=["c"])
    b = step("b", "onnx.fp16", {"model": "converted/a.onnx", "output": "converted/b.onnx"}, depends_on=["a"])
    c = step("c", "onnx.fp16", {"model": "converted/b.onnx", "output": "converted/c.onnx"}, depends_on=["b"])
    assert "cycle" in rejected(compile_(plan(a, b, c), ws), Err.PLAN_INVALID, "a")


def test_input_produced_by_a_step_not_depended_on(ws: Path) -> None:
    assert "depends_on" in rejected(compile_(plan(qdq(), ctx(depends_on=[])), ws), Err.COMPILER_ERROR, "ctx")
    rejected(compile_(plan(ctx(model="converted/missing.onnx", depends_on=[])), ws), Err.COMPILER_ERROR, "ctx")


def test_two_steps_writing_one_output(ws: Path) -> None:
    rejected(compile_(plan(qdq("q1"), qdq("q2")), ws), Err.COMPILER_ERROR, "q2")


def test_expected_output_the_tool_does_not_write(ws: Path) -> None:
    s = qdq()
    s["expected_outputs"] = ["converted/other.onnx"]
    rejected(compile_(plan(s), ws), Err.COMPILER_ERROR, "quant.expected_outputs")


@pytest.mark.parametrize("path", ["/etc/passwd", "../x.onnx", "converted/../../x", "a\x00b", "~/m.onnx",
                                  "converted\\..\\x", "", "."])
def test_path_escapes(ws: Path, path: str) -> None:
    rejected(compile_(plan(qdq(output=path)), ws), Err.PATH_ESCAPE, "quant.output")


def test_symlink_escape(ws: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.onnx").write_bytes(b"x")
    os.symlink(outside, ws / "link")
    rejected(compile_(plan(qdq(model="link/secret.onnx")), ws), Err.PATH_ESCAPE, "quant.model")
    rejected(compile_(plan(qdq(output="link/out.onnx")), ws), Err.PATH_ESCAPE, "quant.output")


def test_expected_output_escape(ws: Path) -> None:
    s = qdq()
    s["expected_outputs"] = ["/tmp/x"]
    rejected(compile_(plan(s), ws), Err.PATH_ESCAPE, "quant.expected_outputs")


def test_outputs_may_not_overwrite_inputs_folder(ws: Path) -> None:
    rejected(compile_(plan(qdq(output="input/model.onnx")), ws), Err.COMPILER_ERROR, "quant.output")


def test_all_errors_reported_at_once(ws: Path) -> None:
    s = qdq(output="/abs.onnx", precision="int3")
    result = compile_(plan(s, step("x", "nope")), ws)
    wheres = {(e.code, e.where) for e in result.errors}
    assert {("PATH_ESCAPE", "quant.output"), ("COMPILER_ERROR", "quant.precision"), ("COMPILER_ERROR", "x")} <= wheres
    assert "[PATH_ESCAPE] quant.output" in result.feedback()


# ---- argv-driven tools -------------------------------------------------------------------------

def _cli_spec() -> ToolSpec:
    return ToolSpec(name="qairt.converter", toolchain=Toolchain.QAIRT, version="2.30", program="qairt-converter",
                    outputs=["output"], args=[
                        ArgSpec(name="model", type="path_in", required=True, flag="--input_network"),
                        ArgSpec(name="output", type="path_out", required=True, flag="--output_path"),
                        ArgSpec(name="float_bitwidth", type="int", default=32),
                        ArgSpec(name="preserve_io", type="bool", default=False),
                        ArgSpec(name="tag", type="str"),
                    ])


def test_argv_built_from_spec_in_spec_order(ws: Path) -> None:
    reg = ToolRegistry([_cli_spec()])
    s = step("conv", "qairt.converter", {"output": "converted/m.dlc", "model": "input/model.onnx"},
             {"preserve_io": True, "float_bitwidth": 16})
    result = compile_plan(plan(s), reg, ws)
    assert result.ok, result.feedback()
    assert result.steps[0].argv == ["qairt-converter", "--input_network", "input/model.onnx", "--output_path",
                                    "converted/m.dlc", "--float_bitwidth", "16", "--preserve_io"]
    assert build_argv(_cli_spec(), {"model": "a", "output": "b", "preserve_io": False}) == [
        "qairt-converter", "--input_network", "a", "--output_path", "b"]


def test_argv_values_cannot_smuggle_flags(ws: Path) -> None:
    reg = ToolRegistry([_cli_spec()])
    s = step("conv", "qairt.converter", {"output": "converted/m.dlc", "model": "input/model.onnx"}, {"tag": "--debug"})
    rejected(compile_plan(plan(s), reg, ws), Err.COMPILER_ERROR, "conv.tag")
