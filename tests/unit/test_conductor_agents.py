"""The kernel agents' pure parts: prompts rendered from the typed context, the registered parsers, and
answers turned into designs and candidates (or refusals the ladder repairs with)."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.kernels import llm_agents, offline_coder, parsers
from activities.llm.structured import Rejected
from contracts.common import ArtifactRef
from contracts.kernel import KernelTask, LLMDecision, OutputFormat
from contracts.kernel_job import (
    AnalyzeRequest,
    Attempt,
    CodeRequest,
    DesignRequest,
    KernelDesign,
    Mismatch,
    StaticReport,
    VerifierReport,
)

RELU = (Path(__file__).resolve().parents[2] / "examples" / "kernels" / "relu.py").read_text()
TASK = KernelTask(op_name="relu", task_desc=RELU, task_id="relu-1", arch="cpu-interpreter", overrides={"dim": 1000})
REF = ArtifactRef(uri="file:///c.py", sha256="a" * 64, size=10, media_type="text/x-python")
LOG = "Traceback (frames in the candidate):\n  candidate.py:12, in relu_kernel\n    y = x +\nNameError: boom"


def test_coder_prompt_carries_task_design_history_full_feedback_suggestion_and_repairs():
    req = CodeRequest(task=TASK, design=KernelDesign(family="elementwise", block_sizes={"BLOCK": 1024}, sketch="y = max(x, 0)"),
                      feedback="trial 0 (signed_normal inputs) output 0: 53/7000 elements differ beyond atol=rtol=0.0001",
                      log=LOG, input_family="signed_normal",
                      mismatches=[Mismatch(trial=0, family="signed_normal", output=0, index=[6, 950], expected=0.7, got=0.0)],
                      attempts=[Attempt(step=2, candidate=REF, verdict="FAILED: tail")], suggestion="mask the tail", step=4,
                      repair=["static check: line 3: forbidden import 'os'"])
    prompt = llm_agents.code_prompt(req, ["def old_candidate(): pass\n"])
    for expected in ("return torch.relu(x)", "family: elementwise", "y = max(x, 0)", "def old_candidate",
                     "53/7000 elements differ", "signed_normal inputs", "candidate.py:12, in relu_kernel", "NameError: boom",
                     "index [6, 950]: 0.7 -> 0.0", "mask the tail", "Triton interpreter", "exactly one fenced ```python",
                     "forbidden import 'os'", "Sizes set for this run (already in the source above): dim=1000",
                     "compile for the H100 SXM5 80GB (sm_90)", "at most 227 KB of shared memory"):
        assert expected in prompt, expected


def test_optimizer_designer_and_analysis_have_their_own_templates():
    opt = llm_agents.code_prompt(CodeRequest(task=TASK, role="optimizer"), [])
    assert "make it faster" in opt
    akg = OutputFormat(parser_name="designer_parser", parser_definition={"output_fields": {
        "code": {"field_type": "str", "mandatory": True, "field_description": "Algorithm pseudocode"}}})
    designer = llm_agents.design_prompt(DesignRequest(task=TASK, output=akg, repair=["the answer lacks the mandatory field 'code'"]))
    assert '"code" (str, mandatory): Algorithm pseudocode' in designer and "lacks the mandatory field" in designer


def test_analysis_sees_task_last_candidate_full_feedback_and_bounded_history():
    report = VerifierReport(passed=False, reason="candidate crashed: exit code 1: NameError: boom", log=LOG,
                            static=StaticReport(ok=True), input_family="task")
    req = AnalyzeRequest(task=TASK, agent="verifier", options=["coder", "finish"], step=4, last_result="FAILED: x",
                         recent=["step 2 coder: candidate written", "step 3 verifier: FAILED: x"], report=report,
                         repair=["decision 'banana' not in ['coder', 'finish']"])
    prompt = llm_agents.analyze_prompt(req, "class ModelNew: ...\n")
    for expected in ('{"decision"', "- coder\n- finish", "return torch.relu(x)", "class ModelNew: ...",
                     "candidate.py:12, in relu_kernel", "NameError: boom", "step 2 coder: candidate written",
                     "decision 'banana' not in"):
        assert expected in prompt, expected


CODE = parsers.DEFAULT_FORMATS["coder"]


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
def test_code_parser_wants_exactly_one_fenced_python_block(text, expected):
    assert llm_agents.source_from(text, CODE) == expected


def test_json_parser_selected_by_name_reads_the_configured_code_field():
    fmt = OutputFormat(parser_name="json_parser", parser_definition={"output_fields": {"kernel": {"mandatory": True}}})
    assert llm_agents.source_from('{"kernel": "x = 1"}', fmt) == "x = 1\n"
    assert llm_agents.source_from('{"code": "x = 1"}', fmt) == Rejected("the answer lacks the mandatory field 'kernel'")


def test_designer_parser_enforces_mandatory_fields_and_keeps_the_sketch():
    akg = OutputFormat(parser_name="designer_parser", parser_definition={"output_fields": {
        "code": {"field_type": "str", "mandatory": True, "field_description": "Algorithm pseudocode"}}})
    design = llm_agents.design_from('{"code": "for each row: ...", "family": "rowwise", "extra": 3}', akg)
    assert design == KernelDesign(family="rowwise", sketch="for each row: ...", fields={"extra": 3})
    assert llm_agents.design_from('{"family": "rowwise"}', akg) == \
        Rejected("the answer lacks the mandatory field 'code' (Algorithm pseudocode)")
    assert isinstance(llm_agents.design_from("a tiled kernel", akg), Rejected)
    assert isinstance(llm_agents.design_from('{"code": "x", "block_sizes": {"B": "big"}}', akg), Rejected)


def test_decision_parser_accepts_any_case_and_the_analyze_format():
    assert llm_agents.parse_decision('```json\n{"decision": "Coder", "suggestion": "s"}\n```') == \
        LLMDecision(next_agent="coder", suggestion="s")
    assert isinstance(llm_agents.parse_decision('{"suggestion": "s"}'), Rejected)


def test_every_registered_parser_name_has_an_implementation():
    from contracts.kernel import PARSER_FIELDS

    assert set(parsers.PARSERS) == set(PARSER_FIELDS)


def test_offline_answer_round_trips_through_the_same_parser(relu_analysis):
    source = offline_coder.code(TASK, None, relu_analysis)
    assert source is not None and llm_agents.source_from(offline_coder.render_answer(source), CODE) == source


@pytest.fixture(scope="module")
def relu_analysis(tmp_path_factory):
    from tests.unit.test_conductor_offline_designer import analyse

    return analyse(RELU, tmp_path_factory.mktemp("relu"))


def stored(kernels, analysis):  # noqa: ANN001, ANN201 - KernelActivities, ReferenceAnalysis -> ArtifactRef
    """The traced reference in the activities' store, as trace_reference leaves it: requests carry the ref."""
    return kernels.store.put_bytes(analysis.model_dump_json().encode(), media_type="application/json",
                                   name="reference.json")


async def test_the_offline_coder_repeating_a_rejected_candidate_is_refused_as_a_duplicate(relu_analysis, tmp_path):
    """A deterministic agent can only repeat itself: its candidate is refused (never verified again), and
    the conductor then ends NO_PROGRESS (workflows.conductor_policy.no_answer_finish)."""
    import hashlib

    from activities.kernels.activities import KernelActivities
    from activities.storage import FileStore
    from contracts.kernel_job import RejectedCandidate, Rejection
    from contracts.settings import Settings

    kernels = KernelActivities(FileStore(tmp_path / "artifacts"), Settings(state_dir=tmp_path, llm="offline"))
    trace = stored(kernels, relu_analysis)
    first = await kernels.code(CodeRequest(task=TASK, reference=trace, step=2))
    assert first.parsed_ok and first.candidate is not None
    source = kernels.store.get_bytes(first.candidate)
    assert first.candidate.sha256 == hashlib.sha256(source).hexdigest()
    rejected = RejectedCandidate(sha256=first.candidate.sha256, step=3, verdict="trial 0 (task inputs) output 0: wrong")
    again = await kernels.code(CodeRequest(task=TASK, reference=trace, step=4, rejected=[rejected]))
    assert not again.parsed_ok and again.rejection is Rejection.DUPLICATE and again.candidate is None
    assert again.reason.startswith("the offline template's candidate is identical to the one the verifier rejected "
                                   "at step 3 (trial 0 (task inputs) output 0: wrong)")


async def test_no_template_is_a_typed_refusal_naming_the_aten_ops(tmp_path):
    from activities.kernels.activities import KernelActivities
    from activities.storage import FileStore
    from contracts.kernel_job import Rejection
    from contracts.settings import Settings
    from tests.unit.test_conductor_offline_designer import analyse

    sort = RELU.replace("torch.relu(x)", "torch.sort(x, dim=1)[0]")
    kernels = KernelActivities(FileStore(tmp_path / "artifacts"), Settings(state_dir=tmp_path, llm="offline"))
    design = await kernels.design(DesignRequest(task=TASK, reference=stored(kernels, analyse(sort, tmp_path))))
    assert not design.parsed_ok and design.rejection is Rejection.NO_TEMPLATE
    assert design.reason.startswith("no offline template: no lowering for sort (aten ops: ")
    assert design.reason.endswith("(aten ops: aten.sort.default); configure an LLM (FLEETFORGE_LLM_BASE_URL) to write "
                                  "this kernel")
