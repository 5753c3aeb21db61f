"""A kernel job's trace lives in the store, not in its result (the history holds it once): record_trace appends
entries to trace.jsonl, and `client.artifacts.kernel_trace` (the one reader of the CLI, the SDK and the benches)
reads them back as TraceEntry."""

from __future__ import annotations

import json

from temporalio.contrib.pydantic import pydantic_data_converter

from activities.kernels.activities import KernelActivities
from activities.storage import FileStore
from client.artifacts import kernel_trace
from contracts.common import ArtifactRef, JobStatus
from contracts.kernel import KernelTask
from contracts.kernel_job import (
    KernelOutcome,
    KernelResult,
    RecordTraceRequest,
    TraceEntry,
    VerifierReport,
    VerifyRequest,
    VerifyResult,
)
from contracts.settings import Settings


def test_the_recorded_trace_is_read_back_entry_for_entry(tmp_path):
    store = FileStore(tmp_path / "artifacts")
    kernels = KernelActivities(store, Settings(state_dir=tmp_path, llm="offline"))
    coder = TraceEntry(step=1, agent="coder", summary="candidate written", ok=True, provider="offline")
    verifier = TraceEntry(step=2, agent="verifier", summary="FAILED: elements differ", ok=False)
    first = kernels.record_trace(RecordTraceRequest(entries=[coder]))
    both = kernels.record_trace(RecordTraceRequest(previous=first, entries=[verifier]))

    result = KernelResult(outcome=KernelOutcome.FAILED, status=JobStatus.FAILED, trace_artifact=both)
    assert kernel_trace(store, result) == [coder, verifier]
    assert kernel_trace(store, result.model_copy(update={"trace_artifact": first})) == [coder]
    assert both.name == "trace.jsonl" and both.media_type == "application/jsonl"


def test_a_job_that_recorded_no_trace_has_no_steps(tmp_path):
    assert kernel_trace(FileStore(tmp_path), KernelResult(outcome=KernelOutcome.FAILED, status=JobStatus.FAILED)) == []


def test_the_result_carries_the_trace_ref_only():
    assert "trace" not in KernelResult.model_fields and "trace_artifact" in KernelResult.model_fields


def test_record_traces_request_holds_the_entries_without_their_defaults_and_they_come_back_whole():
    entry = TraceEntry(step=1, agent="coder", summary="candidate written", ok=True, routing="config")
    converter = pydantic_data_converter.payload_converter  # the workflow's: this payload is in the history
    payload = converter.to_payloads([RecordTraceRequest(entries=[entry])])[0]
    assert json.loads(payload.data)["entries"] == [
        {"step": 1, "agent": "coder", "summary": "candidate written", "ok": True, "routing": "config"}]
    assert converter.from_payloads([payload], [RecordTraceRequest])[0].entries == [entry]


def test_every_kernel_activity_message_leaves_its_defaults_out_of_the_history_and_comes_back_whole():
    converter = pydantic_data_converter.payload_converter
    task = KernelTask(op_name="relu", task_desc="x", task_id="relu-1", arch="cpu-interpreter")
    candidate = ArtifactRef(uri="file:///a/c.py", sha256="0" * 64, size=3)
    req = VerifyRequest(task=task, candidate=candidate, held_out={"n": 7})
    res = VerifyResult(report=VerifierReport(passed=True, reason="", static={"ok": True}), speed="correctness only")
    sent = [json.loads(p.data) for p in converter.to_payloads([req, res])]

    assert sent[0] == {"task": {"op_name": "relu", "task_desc": "x", "task_id": "relu-1", "arch": "cpu-interpreter"},
                       "candidate": {"uri": "file:///a/c.py", "sha256": "0" * 64, "size": 3}, "held_out": {"n": 7}}
    assert sent[1] == {"report": {"passed": True, "reason": "", "static": {"ok": True}}, "speed": "correctness only"}
    assert converter.from_payloads(converter.to_payloads([req, res]), [VerifyRequest, VerifyResult]) == [req, res]
    assert req.model_dump().keys() == VerifyRequest.model_fields.keys(), "python-mode dumps keep every field"
