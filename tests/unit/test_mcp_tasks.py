"""The MCP front door's pure parts: a job's state as a task of the tasks extension (every shape held to
its published schema, tests/e2e/mcp_tasks.py), how `watch` asks a question on each protocol version, the
HTTP binding rule, and how `fleetforge watch` lays out live events."""

from __future__ import annotations

import io
from datetime import datetime, timezone

import pytest
from mcp_types import ClientCapabilities
from pydantic import BaseModel, Field, ValidationError

from client.events_view import EventPrinter
from client.jobs import JobSnapshot
from client.mcp_server.serve import check_binding
from client.mcp_server.tasks import JobState, answer_schema, answers_from, argument_error, created, input_key, task_view
from client.mcp_server.watch import how_to_ask
from contracts.common import JobStatus
from contracts.convert_job import ConversionProgress, ProvideInput
from contracts.errors import FleetforgeError
from contracts.events import EventKind, JobEvent
from tests.e2e.mcp_tasks import CreatedTask, TaskResult

T0 = datetime(2026, 11, 24, 10, 0, tzinfo=timezone.utc)


def state(status: str, **kw) -> JobState:
    return JobState(job_id="convert/20261124-100000-ab12", status=status, created_at=T0, **kw)


def test_a_running_job_is_a_working_task_whose_message_is_its_step():
    task = task_view(state("RUNNING", snapshot=JobSnapshot(step="compile")))
    assert task["status"] == "working" and task["statusMessage"] == "compile"
    assert task["taskId"] == "convert/20261124-100000-ab12" and task["createdAt"] == "2026-11-24T10:00:00Z"
    assert "result" not in task and "inputRequests" not in task


def test_a_job_waiting_for_input_is_input_required_with_one_form_elicitation():
    progress = ConversionProgress(status=JobStatus.NEEDS_INPUT, questions=["Which SoC?", "Which precision?"])
    task = task_view(state("NEEDS_INPUT", snapshot=JobSnapshot(convert=progress)))
    assert task["status"] == "input_required"
    [(key, request)] = task["inputRequests"].items()
    assert key.startswith("answer-") and request["method"] == "elicitation/create"
    assert request["params"]["message"] == "Which SoC? / Which precision?"
    assert {"soc", "precision"} <= set(request["params"]["requestedSchema"]["properties"])


def test_input_keys_differ_between_question_rounds_and_jobs_and_repeat_within_one():
    assert input_key("convert/a", ["Which SoC?"], "0/0/0") == input_key("convert/a", ["Which SoC?"], "0/0/0")
    assert input_key("convert/a", ["Which SoC?"], "0/0/0") != input_key("convert/a", ["Which SoC?"], "1/1/0")
    assert input_key("convert/a", ["Which SoC?"], "0/0/0") != input_key("convert/b", ["Which SoC?"], "0/0/0")


def test_a_row_awaiting_approval_asks_for_a_yes_or_no_on_the_command():
    task = task_view(state("AWAITING_APPROVAL", pending_command="docker run --rm m:1", pending_attempt=2))
    [(key, request)] = task["inputRequests"].items()
    assert key == "approve-2" and "docker run --rm m:1" in request["params"]["message"]
    assert request["params"]["requestedSchema"]["required"] == ["approved"]


def test_a_failed_job_is_a_completed_task_whose_tool_result_is_an_error_with_the_contract():
    failed = task_view(state("FAILED", result={"status": "FAILED", "failure": {"code": "COMPILER_ERROR"}},
                             summary="convert/x FAILED: COMPILER_ERROR in compile: bad arg"))
    assert failed["status"] == "completed" and failed["result"]["isError"] is True
    assert failed["result"]["structuredContent"]["failure"]["code"] == "COMPILER_ERROR"
    done = task_view(state("COMPLETED", result={"status": "COMPLETED"}))
    assert done["status"] == "completed" and done["result"]["isError"] is False


def test_the_answer_form_is_provide_inputs_fields_and_its_answers_are_what_provide_input_takes():
    form = answer_schema()["properties"]
    assert list(form) == list(ProvideInput.model_fields), "one home for what an answer holds"
    assert form["synthetic_calibration"]["type"] == "boolean" and form["soc"]["type"] == "string"
    assert form["precision"]["enum"] == ["fp32", "fp16", "int8", "w8a16", "w4a16"]
    assert all(f["description"] for f in form.values())
    got = answers_from({"soc": "sm8550", "precision": "", "calibration": None, "synthetic_calibration": "yes",
                        "unknown": "x"})
    assert got == {"soc": "sm8550"}, "empty text left out, a flag only as a boolean, unknown keys dropped"
    assert ProvideInput(**answers_from({"synthetic_calibration": True, "eval_data": "e.npz"})).synthetic_calibration is True


def test_a_cancelled_job_is_a_cancelled_task():
    assert task_view(state("CANCELLED"))["status"] == "cancelled"


def test_http_beyond_loopback_needs_a_token():
    check_binding("127.0.0.1", None)
    check_binding("::1", None)
    check_binding("0.0.0.0", "s3cret")
    with pytest.raises(FleetforgeError, match="FLEETFORGE_MCP_TOKEN"):
        check_binding("0.0.0.0", None)
    with pytest.raises(FleetforgeError):
        check_binding("10.1.2.3", "")


def test_watch_writes_an_llm_calls_deltas_on_one_line_and_every_other_event_on_its_own():
    out = io.StringIO()
    printer = EventPrinter(out)
    for event in [JobEvent(kind=EventKind.STEP, text="plan"),
                  JobEvent(kind=EventKind.TOKENS, agent="planner", text='{"sta', call="5#1"),
                  JobEvent(kind=EventKind.TOKENS, agent="planner", text='tus": "OK"}', call="5#1"),
                  JobEvent(kind=EventKind.TOKENS, agent="planner", text="again", call="5#2"),
                  JobEvent(kind=EventKind.STATUS, text="COMPLETED")]:
        printer.show(event)
    printer.end()
    assert out.getvalue().splitlines() == ["  step: plan", '  [planner] {"status": "OK"}', "  [planner] again",
                                           "  status: COMPLETED"]


def on_the_wire(task: dict) -> object:
    """tasks/get's result as the server sends it (the SDK stamps `resultType: "complete"` on it), parsed by
    the extension's schema: a missing, renamed or mistyped field fails here."""
    return TaskResult.model_validate({**task, "resultType": "complete"}).root


@pytest.mark.parametrize("job", [
    state("RUNNING", snapshot=JobSnapshot(step="compile")),
    state("NEEDS_INPUT", snapshot=JobSnapshot(convert=ConversionProgress(status=JobStatus.NEEDS_INPUT,
                                                                           questions=["Which SoC?"]))),
    state("AWAITING_APPROVAL", pending_command="docker run --rm m:1", pending_attempt=1),
    state("COMPLETED", result={"status": "COMPLETED"}),
    state("FAILED", result={"status": "FAILED"}, summary="convert/x FAILED"),
    state("FAILED", crashed="[INTERNAL] job convert/x crashed: boom"),
    state("CANCELLED"),
], ids=["working", "input_required", "approval", "completed", "failed_job", "crashed", "cancelled"])
def test_every_task_state_is_what_the_extensions_schema_says(job: JobState):
    task = on_the_wire(task_view(job))
    assert task.ttl_ms is None and task.poll_interval_ms == 2000


def test_a_completed_tasks_result_is_a_complete_tool_result_and_a_crash_is_a_failed_task_with_its_error():
    done = on_the_wire(task_view(state("COMPLETED", result={"status": "COMPLETED"})))
    assert done.result.result_type == "complete" and done.result.structured_content == {"status": "COMPLETED"}
    crashed = on_the_wire(task_view(state("FAILED", crashed="[INTERNAL] job convert/x crashed: boom")))
    assert crashed.status == "failed" and crashed.error.code == -32603 and "boom" in crashed.error.message


def test_a_created_task_is_what_the_extensions_schema_says():
    seed = CreatedTask.model_validate(created("convert/20261124-100000-ab12", T0))
    assert (seed.result_type, seed.status, seed.ttl_ms, seed.poll_interval_ms) == ("task", "working", None, 2000)
    with pytest.raises(ValidationError):  # the names the extension does not define are refused
        CreatedTask.model_validate({**created("convert/x", T0), "ttlSeconds": None})


@pytest.mark.parametrize(("version", "capabilities", "asking"), [
    ("2025-11-25", {"elicitation": {"form": {}}}, "elicitation_request"),
    ("2025-06-18", {"elicitation": {}}, "elicitation_request"),  # an empty object is form mode
    ("2026-07-28", {"elicitation": {"form": {}}}, "input_required"),
    ("2026-07-28", {}, "tools"),
    ("2025-11-25", {"elicitation": {"url": {}}}, "tools"),  # URL mode only: a form cannot travel
    ("2025-11-25", None, "tools"),
])
def test_watch_asks_a_jobs_question_as_the_negotiated_protocol_version_defines(version, capabilities, asking):
    caps = ClientCapabilities.model_validate(capabilities) if capabilities is not None else None
    assert how_to_ask(version, caps) == asking


def test_bad_tool_arguments_say_which_argument_and_what_was_wrong():
    class Args(BaseModel):
        min_cosine: float = Field(0.5, le=1.0)

    with pytest.raises(ValidationError) as e:
        Args(min_cosine=2)
    assert argument_error("convert", e.value) == (
        "[BAD_INPUT] invalid arguments for convert: min_cosine: Input should be less than or equal to 1")


def test_the_protocol_versions_served_are_the_ones_docs_mcp_names():
    """The pinned SDK negotiates them; an upgrade that changes them changes this test and docs/mcp.md."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

    from client.mcp_server.tasks import TASK_PROTOCOL_VERSIONS

    assert HANDSHAKE_PROTOCOL_VERSIONS == ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
    assert MODERN_PROTOCOL_VERSIONS == ("2026-07-28",) and TASK_PROTOCOL_VERSIONS == {"2026-07-28"}
