"""The kernel agents' pure parts: prompts rendered from the typed context, one parser per format."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.kernels import llm_agents, offline_coder
from activities.llm.structured import Rejected
from contracts.common import ArtifactRef
from contracts.kernel import KernelTask, LLMDecision
from contracts.kernel_job import AnalyzeRequest, Attempt, CodeRequest, DesignRequest, KernelDesign, Mismatch

RELU = (Path(__file__).resolve().parents[2] / "examples" / "kernels" / "relu.py").read_text()
TASK = KernelTask(op_name="relu", task_desc=RELU, task_id="relu-1", arch="cpu-interpreter")
REF = ArtifactRef(uri="file:///c.py", sha256="a" * 64, size=10, media_type="text/x-python")


def test_coder_prompt_carries_task_design_history_feedback_and_suggestion():
    req = CodeRequest(task=TASK, design=KernelDesign(family="elementwise", block_sizes={"BLOCK": 1024}),
                      feedback="trial 0 output 0: 53/7000 elements differ beyond atol=rtol=0.0001",
                      mismatches=[Mismatch(trial=0, output=0, index=[6, 950], expected=0.7, got=0.0)],
                      attempts=[Attempt(step=2, candidate=REF, verdict="FAILED: tail")], suggestion="mask the tail", step=4)
    prompt = llm_agents.code_prompt(req, ["def old_candidate(): pass\n"])
    for expected in ("return torch.relu(x)", "family: elementwise", "def old_candidate", "53/7000 elements differ",
                     "index [6, 950]: 0.7 -> 0.0", "mask the tail", "Triton interpreter", "exactly one fenced ```python"):
        assert expected in prompt, expected


def test_optimizer_and_designer_and_analysis_have_their_own_templates():
    opt = llm_agents.code_prompt(CodeRequest(task=TASK, role="optimizer"), [])
    assert "make it faster" in opt
    assert '"block_sizes"' in llm_agents.design_prompt(DesignRequest(task=TASK))
    analysis = llm_agents.analyze_prompt(AnalyzeRequest(task=TASK, agent="verifier", options=["coder", "finish"], step=4,
                                                        last_result="FAILED: x", recent=["step 3 verifier: FAILED: x"]))
    assert '{"decision"' in analysis and "- coder\n- finish" in analysis and "FAILED: x" in analysis


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("```python\nx = 1\n```", "x = 1\n"),
        ("Sure:\n```py\nx = 1\n```\nDone.", "x = 1\n"),
        ("```\nx = 1\n```", "x = 1\n"),
        ("no code here", Rejected("the answer has no fenced ```python block with the candidate")),
        ("```python\na = 1\n```\n```python\nb = 2\n```",
         Rejected("the answer has 2 fenced python blocks; expected exactly one with the whole candidate")),
        ("```python\n\n```", Rejected("the fenced python block is empty")),
    ],
    ids=["python", "py with prose", "untagged", "none", "two", "empty"],
)
def test_parse_code_wants_exactly_one_fenced_python_block(text, expected):
    assert llm_agents.parse_code(text) == expected


def test_offline_answer_round_trips_through_the_same_parser():
    source = offline_coder.code(TASK)
    assert source is not None and llm_agents.parse_code(offline_coder.render_answer(source)) == source


def test_design_and_decision_parsers_validate_json():
    assert llm_agents.parse_design('{"family": "elementwise"}') == KernelDesign(family="elementwise")
    assert isinstance(llm_agents.parse_design("a tiled kernel"), Rejected)
    assert llm_agents.parse_decision('```json\n{"decision": "coder", "suggestion": "s"}\n```') == \
        LLMDecision(next_agent="coder", suggestion="s")
    assert isinstance(llm_agents.parse_decision('{"suggestion": "s"}'), Rejected)
