"""workflow.yaml -> ConductorConfig: the shipped configs load, bad ones name file, key and problem."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from activities.kernels.config_loader import config_for_task, load_workflow_config, shipped_workflows
from contracts.errors import Err, FleetforgeError
from contracts.kernel import ConductorConfig, KernelTask

VALID = """\
agent_info:
  designer:
    possible_next_agent: [coder]
  coder:
    possible_next_agent: [verifier]
  verifier:
    possible_next_agent: [finish, coder]
start_agent: designer
mandatory_llm_analysis: [verifier]
limitation_info:
  required:
    max_step: 20
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "workflow.yaml"
    path.write_text(text)
    return path


def _error(path: Path) -> str:
    with pytest.raises(FleetforgeError) as info:
        load_workflow_config(path)
    assert info.value.code is Err.WORKFLOW_CONFIG_INVALID
    assert "\n" not in info.value.message
    assert info.value.message.startswith(f"{path}: ")
    return info.value.message


def test_the_shipped_workflows_are_listed_and_load_and_the_default_optimizes():
    assert set(shipped_workflows()) == {"default", "first_verified", "coder_only", "akg_style"}
    default = load_workflow_config("default")
    assert default.start_agent == "designer"
    assert default.next_agents("verifier") == ["finish", "coder", "optimizer"]
    assert default.mandatory_analysis == ["verifier"]
    assert default.next_agents("optimizer") == ["verifier"]
    assert default.repeat_limit("optimizer") == 2
    assert default.repeat_limit("designer") == 3
    assert default.sequences["optimizer_verifier"].max_repeats == 3
    first = load_workflow_config("first_verified")
    assert first.start_agent == "designer" and first.next_agents("verifier") == ["finish", "coder"]
    assert "optimizer" not in first.agent_info
    coder_only = load_workflow_config("coder_only")
    assert coder_only.start_agent == "coder" and "designer" not in coder_only.agent_info
    assert default.output_format("coder").parser_name == "coder_parser"
    assert default.output_format("coder").mandatory_fields == ["code"]


def test_a_path_loads_and_the_llm_analysis_alias_is_accepted(tmp_path):
    cfg = load_workflow_config(_write(tmp_path, VALID))
    assert cfg.mandatory_analysis == ["verifier"]
    assert cfg.max_step == 20
    # the model round-trips through JSON (it travels in workflow inputs)
    assert ConductorConfig.model_validate_json(cfg.model_dump_json()) == cfg


def test_mixed_kernels_are_off_unless_the_workflow_yaml_allows_them(tmp_path):
    assert load_workflow_config(_write(tmp_path, VALID)).allow_mixed_kernels is False
    assert all(not load_workflow_config(name).allow_mixed_kernels for name in shipped_workflows())
    assert load_workflow_config(_write(tmp_path, VALID + "allow_mixed_kernels: true\n")).allow_mixed_kernels is True
    assert "allow_mixed_kernels" in _error(_write(tmp_path, VALID + "allow_mixed_kernels: sometimes\n"))


def test_unknown_shipped_name_lists_the_known_ones():
    with pytest.raises(FleetforgeError) as info:
        load_workflow_config("nonesuch")
    assert info.value.code is Err.WORKFLOW_CONFIG_INVALID
    assert "nonesuch" in info.value.message and "default" in info.value.message


def test_missing_file_is_a_config_error(tmp_path):
    missing = tmp_path / "absent.yaml"
    with pytest.raises(FleetforgeError) as info:
        load_workflow_config(missing)
    assert info.value.code is Err.WORKFLOW_CONFIG_INVALID
    assert str(missing) in info.value.message


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = _write(tmp_path, "agent_info:\n  coder: [verifier\nstart_agent: coder\n")
    message = _error(path)
    assert "line 3" in message and "invalid YAML" in message


def test_non_mapping_document_is_rejected(tmp_path):
    assert "expected a mapping" in _error(_write(tmp_path, "- just\n- a list\n"))


@pytest.mark.parametrize(
    ("old", "new", "key", "problem"),
    [
        ("max_step: 20", "max_step: 0", "limitation_info.required.max_step", "greater than 0"),
        ("    max_step: 20\n", "    other: 1\n", "limitation_info.required.max_step", "Field required"),
        ("[finish, coder]", "[finish, tester]", "agent_info.verifier.possible_next_agent", "unknown agent 'tester'"),
        ("start_agent: designer", "start_agent: planner", "start_agent", "unknown agent 'planner'"),
        ("start_agent: designer\n", "", "start_agent", "Field required"),
        ("[finish, coder]", "[coder]", "agent_info", "'finish' is unreachable"),
        ("mandatory_llm_analysis: [verifier]", "mandatory_analysis: [judge]", "mandatory_analysis.0", "unknown agent 'judge'"),
        ("start_agent: designer", "start_agnet: designer", "start_agnet", "Extra inputs are not permitted"),
        ("[coder]\n  coder", "[coder]\n    max_repeats: -1\n  coder", "agent_info.designer.max_repeats", "greater than 0"),
    ],
)
def test_invalid_config_names_file_key_and_problem(tmp_path, old, new, key, problem):
    assert old in VALID
    message = _error(_write(tmp_path, VALID.replace(old, new, 1)))
    assert re.search(rf"(: |; ){re.escape(key)}: [^;]*{re.escape(problem)}", message), message


def test_finish_reachable_only_through_an_unreachable_agent_is_rejected():
    data = {
        "agent_info": {
            "coder": {"possible_next_agent": ["coder"]},
            "verifier": {"possible_next_agent": ["finish"]},
        },
        "start_agent": "coder",
        "limitation_info": {"required": {"max_step": 5}},
    }
    with pytest.raises(ValidationError, match="unreachable"):
        ConductorConfig.model_validate(data)


def test_repeat_limit_overrides_must_name_declared_agents():
    data = {
        "agent_info": {"coder": {"possible_next_agent": ["finish"]}},
        "start_agent": "coder",
        "limitation_info": {"required": {"max_step": 5}, "optional": {"repeat_limits": {"ghost": 2}}},
    }
    with pytest.raises(ValidationError, match="repeat_limits.single_agent.ghost: unknown agent"):
        ConductorConfig.model_validate(data)


AKG = (Path(__file__).parents[2] / "examples" / "workflows" / "akg_style.yaml").read_text()


def test_akg_workflow_yaml_keys_are_understood(tmp_path):
    cfg = load_workflow_config(_write(tmp_path, AKG))
    assert cfg.mandatory_analysis == ["verifier"]
    assert cfg.repeat_limit("coder") == 2 and cfg.repeat_limit("designer") == 3
    assert cfg.sequences["coder_verifier"].pattern == ["coder", "verifier"]
    assert cfg.sequences["coder_verifier"].max_repeats == 2
    designer = cfg.output_format("designer")
    assert designer.parser_name == "designer_parser"
    assert designer.output_fields["code"].field_description == "Algorithm pseudocode implementation"
    assert cfg.output_format("coder").mandatory_fields == ["code"]


def test_the_flat_repeat_limits_form_still_means_single_agent():
    data = {"agent_info": {"coder": {"possible_next_agent": ["finish", "coder"]}}, "start_agent": "coder",
            "limitation_info": {"required": {"max_step": 5}, "optional": {"repeat_limits": {"coder": 4}}}}
    assert ConductorConfig.model_validate(data).repeat_limit("coder") == 4


@pytest.mark.parametrize(("old", "new", "key", "problem"), [
    ("parser_name: coder_parser", "parser_name: magic_parser", "agent_info.coder.output_format",
     "unknown parser 'magic_parser' (registered: code_parser, coder_parser"),
    ("  verifier:\n    possible_next_agent: [finish, coder]",
     "  verifier:\n    possible_next_agent: [finish, coder, tuner]\n  tuner:\n    possible_next_agent: [verifier]",
     "agent_info.tuner", "no implementation for agent 'tuner' (implemented: designer, coder, verifier, optimizer)"),
    ("          pattern: [coder, verifier]", "          pattern: [coder, tester]",
     "limitation_info.optional.repeat_limits.sequences.coder_verifier.pattern", "unknown agent 'tester'"),
    ("            field_description: \"Complete executable code implementation\"",
     "            field_description: \"x\"\n          tests:\n            field_type: str\n            mandatory: true",
     "agent_info.coder.output_format", "reads one fenced python block into one field; 2 mandatory fields"),
], ids=["unknown parser", "agent without implementation", "sequence with an unknown agent", "two code fields"])
def test_akg_config_errors_name_the_key_at_load(tmp_path, old, new, key, problem):
    assert old in AKG
    message = _error(_write(tmp_path, AKG.replace(old, new, 1)))
    assert key in message and problem in message, message


def test_kernel_task_arch_must_be_a_known_target():
    assert KernelTask(op_name="relu", task_desc="x", task_id="t", arch="interpreter").on_cpu
    with pytest.raises(ValidationError, match="unknown target 'cpu_interpeter'; known targets: cpu-interpreter"):
        KernelTask(op_name="relu", task_desc="x", task_id="t", arch="cpu_interpeter")


def test_kernel_task_defaults_and_validation():
    task = KernelTask(op_name="relu", task_desc="y = max(x, 0)", task_id="t1", arch="cpu")
    assert (task.dsl, task.framework, task.workflow, task.num_candidates) == ("triton", "torch", "default", 1)
    with pytest.raises(ValidationError):
        KernelTask(op_name="relu op", task_desc="x", task_id="t1", arch="cpu")
    with pytest.raises(ValidationError):
        KernelTask(op_name="relu", task_desc="x", task_id="t1", arch="cpu", dsl="swft")
    with pytest.raises(ValidationError):
        KernelTask(op_name="relu", task_desc="x", task_id="t1", arch="cpu", num_candidates=0)


def test_config_for_task_prefers_inline_config_and_applies_max_step():
    inline = load_workflow_config("coder_only")
    task = KernelTask(op_name="relu", task_desc="x", task_id="t1", arch="cpu", conductor=inline)
    assert config_for_task(task) == inline
    named = KernelTask(op_name="relu", task_desc="x", task_id="t1", arch="cpu", workflow="default", max_step=7)
    cfg = config_for_task(named)
    assert cfg.start_agent == "designer" and cfg.max_step == 7
    assert cfg.repeat_limit("optimizer") == 2
    assert load_workflow_config("default").max_step == 24
