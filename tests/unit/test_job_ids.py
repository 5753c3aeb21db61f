"""One id grammar (client/ids.py) and the list/status rules (client/sdk.py), without a server."""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from client.ids import candidates, kind_of, run_id_for, run_id_of
from client.jobs import STATUS_QUERY, list_query, status_of
from contracts.common import JobKind, JobStatus
from contracts.errors import Err, FleetforgeError
from contracts.fleet_job import default_fleet_id
from workflows._visibility import STATUS, normalise_target, web_ui_link


@pytest.mark.parametrize("text, expected", [
    ("convert/20261122-140512-3f9a", ["convert/20261122-140512-3f9a"]),
    ("fleet-test/20261122-140512-3f9a", ["fleet-test/20261122-140512-3f9a"]),
    ("fleet/20261122-140512-3f9a/17", ["fleet/20261122-140512-3f9a/17"]),
    ("fleet/20261122-140512-3f9a", ["fleet-test/20261122-140512-3f9a"]),
    ("  kernel/abc  ", ["kernel/abc"]),
    ("20261122-140512-3f9a", [f"{k}/20261122-140512-3f9a" for k in ("inspect", "convert", "kernel", "fleet-test")]),
    ("http://127.0.0.1:8233/namespaces/default/workflows/convert%2F20261122-140512-3f9a/01a2-77/history",
     ["convert/20261122-140512-3f9a"]),
    ("http://ui:8233/namespaces/ns/workflows/fleet%2Fabc%2F3", ["fleet/abc/3"]),
])
def test_every_id_the_tool_prints_names_its_job(text: str, expected: list[str]) -> None:
    assert candidates(text) == expected


@pytest.mark.parametrize("text", ["", "nope/123", "convert/", "a b", "fleet/x/y/z", "http://ui/namespaces/default/workflows"])
def test_text_that_names_no_job_is_bad_input_saying_what_an_id_looks_like(text: str) -> None:
    with pytest.raises(FleetforgeError) as e:
        candidates(text)
    assert e.value.code is Err.BAD_INPUT and "KIND/RUN_ID" in e.value.message


def test_kinds_and_run_ids_of_workflow_ids() -> None:
    assert kind_of("fleet/abc/3") is JobKind.MODEL_TEST
    assert kind_of("fleet-test/abc") is JobKind.FLEET_TEST
    assert run_id_of("convert/r-1") == "r-1" and run_id_of("fleet/abc/3") == "abc/3"


def attrs(status: str | None) -> TypedSearchAttributes:
    return TypedSearchAttributes([SearchAttributePair(STATUS, status)] if status else [])


@pytest.mark.parametrize("execution, recorded, expected", [
    (WorkflowExecutionStatus.RUNNING, "NEEDS_INPUT", "NEEDS_INPUT"),
    (WorkflowExecutionStatus.RUNNING, None, "RUNNING"),
    (WorkflowExecutionStatus.CANCELED, "NEEDS_INPUT", "CANCELLED"),  # cancelled while waiting: not waiting any more
    (WorkflowExecutionStatus.TERMINATED, "RUNNING", "CANCELLED"),
    (WorkflowExecutionStatus.FAILED, "FAILED", "FAILED"),
    (WorkflowExecutionStatus.TIMED_OUT, "RUNNING", "FAILED"),
    (WorkflowExecutionStatus.COMPLETED, "COMPLETED", "COMPLETED"),
    (WorkflowExecutionStatus.COMPLETED, "FAILED", "FAILED"),  # recorded before FAILED jobs failed their execution
    (WorkflowExecutionStatus.COMPLETED, "NEEDS_INPUT", "COMPLETED"),
])
def test_a_closed_job_status_follows_its_execution(execution, recorded, expected) -> None:
    assert status_of(execution, attrs(recorded)) == expected


def test_list_is_one_line_per_job_and_never_lists_a_closed_job_as_waiting() -> None:
    q = list_query()
    assert "ExecutionStatus != 'ContinuedAsNew'" in q and "FleetforgeJob != 'model-test'" in q
    assert "model-test'" not in list_query(rows=True).replace("FleetforgeJob IS NOT NULL", "")
    assert list_query(JobKind.MODEL_TEST).startswith("FleetforgeJob = 'model-test'")
    for waiting in (JobStatus.RUNNING, JobStatus.NEEDS_INPUT, JobStatus.AWAITING_APPROVAL):
        assert "ExecutionStatus = 'Running'" in list_query(status=waiting)
    assert set(STATUS_QUERY) == set(JobStatus)


def test_targets_are_normalised_soc_upper_case_everything_else_lower_case() -> None:
    assert normalise_target("sm8550") == "SM8550" == normalise_target(" SM8550 ")
    assert normalise_target("cpu") == "cpu" and normalise_target("Docker") == "docker"


def test_web_ui_links_encode_the_workflow_id_and_carry_the_run_id() -> None:
    base = "http://127.0.0.1:8233/"
    assert web_ui_link(base, "default", "convert/r-1", "01a2") == \
        "http://127.0.0.1:8233/namespaces/default/workflows/convert%2Fr-1/01a2/user-metadata"
    assert web_ui_link(base, "default", "fleet/f/3") == "http://127.0.0.1:8233/namespaces/default/workflows/fleet%2Ff%2F3"
    assert web_ui_link(base, "my ns") == "http://127.0.0.1:8233/namespaces/my%20ns/workflows"
    assert web_ui_link(base, "default", query="FleetforgeStatus='FAILED'").endswith(
        "/workflows?query=FleetforgeStatus%3D%27FAILED%27")


def test_a_rerun_takes_the_run_id_in_any_form_the_tool_printed_but_only_of_its_kind() -> None:
    link = "http://127.0.0.1:8233/namespaces/default/workflows/convert%2F20261122-140512-3f9a/01a2/history"
    for printed in ("20261122-140512-3f9a", "convert/20261122-140512-3f9a", link):
        assert run_id_for(JobKind.CONVERT, printed) == "20261122-140512-3f9a"
    with pytest.raises(FleetforgeError) as e:
        run_id_for(JobKind.CONVERT, "kernel/20261122-140512-3f9a")
    assert e.value.code is Err.BAD_INPUT and "not a convert job" in e.value.message


@pytest.mark.parametrize("workflow_id, fleet_id", [
    ("fleet-test/20261122-140512-3f9a", "20261122-140512-3f9a"),
    ("fleet/nightly", "nightly"),
    ("nightly run/2026 11", "nightly-run-2026-11"),
    ("fleet-test/", "fleet"),
])
def test_a_fleet_started_without_an_id_gets_one_its_rows_can_be_named_by(workflow_id: str, fleet_id: str) -> None:
    assert default_fleet_id(workflow_id) == fleet_id
    assert candidates(f"fleet/{fleet_id}/3") == [f"fleet/{fleet_id}/3"]
    assert kind_of(f"fleet/{fleet_id}/3") is JobKind.MODEL_TEST


def test_a_job_handle_prints_what_it_is() -> None:
    from types import SimpleNamespace

    from client.jobs import JobHandle
    from contracts.convert_job import ConversionResult
    from contracts.fleet_job import ModelTestResult

    job = JobHandle(SimpleNamespace(id="convert/20261122-140512-3f9a"), ConversionResult)  # type: ignore[arg-type]
    assert repr(job) == "JobHandle('convert/20261122-140512-3f9a', kind=convert, result=ConversionResult)"
    row = JobHandle(SimpleNamespace(id="fleet/20261122-140512-3f9a/3"), ModelTestResult)  # type: ignore[arg-type]
    assert str(row) == "JobHandle('fleet/20261122-140512-3f9a/3', kind=model-test, result=ModelTestResult)"
