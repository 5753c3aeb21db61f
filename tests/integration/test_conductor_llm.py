"""ConductorWorkflow with LLM agents (llm="openai") against a scripted OpenAI-compatible server:
verifier feedback routed back to the coder, unusable answers repaired inside the step (the agent
ladder), broken answers falling back to the offline template, a rejected candidate never verified
twice, AKG workflow.yaml limits, MAX_STEPS with the full trace, routing decisions in any case and
their deterministic fallback, parallel candidates, the offline optimizer's rewrites before the LLM's.
Real dev server, real artifact store, real verifier children under the Triton interpreter."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from activities.kernels.config_loader import load_workflow_config
from activities.kernels.task_source import apply_overrides
from activities.storage import ArtifactStore
from client.artifacts import kernel_trace
from contracts.agents import AnswerSource
from contracts.common import JobKind, JobStatus
from contracts.kernel import ConductorConfig, FinishReason, KernelTask, TimeLimit
from contracts.kernel_job import KernelOutcome, KernelRequest, KernelResult, TraceEntry
from contracts.settings import Settings
from tests.doubles.openai_server import Scripted, ScriptedOpenAIServer, error, text_stream
from tests.helpers import fresh_queues, new_worker, outcome_of
from worker import build_registry
from workflows._visibility import start_attributes
from workflows.conductor import ConductorWorkflow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RELU = (EXAMPLES / "kernels" / "relu.py").read_text()

KERNEL_SOURCE = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = {mask}
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.zeros_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
'''
GOOD = KERNEL_SOURCE.format(mask="offs < n")
MASKING_BUG = KERNEL_SOURCE.format(mask="offs < n - 100")
"""The tail of the tensor is never written: the last 100 outputs stay 0."""
OTHER_MASKING_BUG = KERNEL_SOURCE.format(mask="offs < n - 50")
BROKEN = "```python\nimport torch\nclass ModelNew(:\n    pass\n```"
"""A syntax error: refused by the static checks, never run."""

USAGE = {"prompt_tokens": 100, "completion_tokens": 40, "total_tokens": 140}


def answer(text: str) -> Scripted:
    return text_stream([text[i:i + 200] for i in range(0, len(text), 200)], usage=USAGE)


def code_answer(source: str) -> Scripted:
    return answer(f"Here is the kernel.\n\n```python\n{source}```\n")


def design_answer() -> Scripted:
    return answer(json.dumps({"family": "elementwise", "block_sizes": {"BLOCK": 1024}, "grid": "cdiv(numel, BLOCK)",
                              "tiling": "flat 1-D tiles", "notes": "mask the tail"}))


def decision(agent: str, suggestion: str = "") -> Scripted:
    return answer(json.dumps({"decision": agent, "suggestion": suggestion}))


def prompt_of(request: dict[str, Any]) -> str:
    return request["messages"][-1]["content"]


async def run_llm_conductor(client: Client, tmp_path: Path, store: ArtifactStore, server: ScriptedOpenAIServer,
                            workflow: str | ConductorConfig, *, source: str = RELU, request_kw: dict | None = None,
                            task_id: str | None = None, **task_kw: Any) -> tuple[KernelResult, list[TraceEntry]]:
    """The job's result and its trace, read from the store (what the running job's query showed)."""
    settings = Settings(state_dir=tmp_path / "state", llm="openai", llm_base_url=server.base_url, llm_model="scripted")
    reg = build_registry(settings, store)
    queues = fresh_queues()
    task = KernelTask(op_name="relu", task_desc=source, task_id=task_id or f"relu-llm-{uuid.uuid4().hex[:6]}",
                      arch="cpu-interpreter", **task_kw)
    config = workflow if isinstance(workflow, ConductorConfig) else load_workflow_config(workflow)
    req = KernelRequest(task=task, config=config, queues=queues, verify_timeout_s=90, llm="openai", **(request_kw or {}))
    async with new_worker(client, workflows=[ConductorWorkflow], task_queue=queues.workflows,
                          activities=reg.by_kind["llm"] + reg.by_kind["kernels"]):
        handle = await client.start_workflow(
            ConductorWorkflow.run, req, id=f"kernel/{task.task_id}", task_queue=queues.workflows,
            search_attributes=start_attributes(JobKind.KERNEL, task.op_name))
        result = await outcome_of(handle, KernelResult)
        trace = kernel_trace(store, result)
        assert await handle.query(ConductorWorkflow.trace) == trace
    return result, trace


@pytest.mark.slow
async def test_masking_bug_feedback_reaches_the_coder_and_the_second_candidate_verifies(temporal_env, tmp_path, file_store):
    script = [design_answer(), code_answer(MASKING_BUG), decision("Coder", "write the tail: mask must be offs < n"),
              code_answer(GOOD)]
    with ScriptedOpenAIServer(script) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, "first_verified")

    assert result.outcome is KernelOutcome.VERIFIED and result.status is JobStatus.COMPLETED
    assert [(e.agent, e.ok) for e in trace] == [
        ("designer", True), ("coder", True), ("verifier", False), ("coder", True), ("verifier", True)]
    failed = trace[2].report
    assert failed is not None and "elements differ" in failed.reason
    assert failed.mismatches and all(m.index[0] == 6 and m.index[1] >= 900 for m in failed.mismatches)
    assert trace[3].routing == "llm: coder" and not trace[3].fallback, '{"decision": "Coder"} is the coder'
    assert trace[3].routing_provenance is not None and trace[3].routing_provenance.source is AnswerSource.LLM
    analysis = prompt_of(server.requests[2])
    for expected in ("return torch.relu(x)", "offs < n - 100", failed.reason, "step 3 verifier: FAILED"):
        assert expected in analysis, f"the routing analysis sees {expected!r}"

    second_prompt = prompt_of(server.requests[3])
    assert failed.reason in second_prompt, "the verifier's feedback reached the coder"
    m = failed.mismatches[0]
    assert f"index {m.index}: {m.expected} -> {m.got}" in second_prompt
    assert "write the tail: mask must be offs < n" in second_prompt, "the conductor's suggestion reached the coder"
    assert "offs < n - 100" in second_prompt, "the failed attempt is in the coder's bounded history"
    assert file_store.get_bytes(trace[3].prompt).decode() == second_prompt, "the prompt artifact is what was sent"

    assert file_store.get_bytes(result.best_candidate).decode() == GOOD
    assert trace[1].provider == "openai" and trace[1].tokens.total == 140
    transcript = json.loads(file_store.get_bytes(trace[1].transcript))
    assert (transcript["provider"], transcript["agent"]) == ("openai", "kernel-coder")
    assert trace[3].tokens.total == 280, "the coder's tokens plus the analysis that chose it"
    assert (result.tokens.total_tokens, result.tokens.calls) == (4 * 140, 4)
    assert len(server.requests) == 4


async def test_an_unparsable_coder_answer_is_repaired_inside_the_step(temporal_env, tmp_path, file_store):
    script = [answer("I would write a Triton kernel that masks the tail."), code_answer(GOOD)]
    with ScriptedOpenAIServer(script) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, "coder_only")

    assert result.outcome is KernelOutcome.VERIFIED
    assert [(e.agent, e.ok) for e in trace] == [("coder", True), ("verifier", True)]
    coder = trace[0]
    assert coder.provenance is not None and coder.provenance.source is AnswerSource.LLM
    assert coder.provenance.llm_answers == 2
    assert coder.provenance.rejections == ["the answer has no fenced ```python block with the candidate"]
    assert "no fenced ```python block" in prompt_of(server.requests[1]), "the repair round saw the concrete error"
    assert coder.provider == "openai" and result.tokens.calls == 2


async def test_a_coder_that_keeps_sending_broken_code_ends_verified_through_the_offline_template(
        temporal_env, tmp_path, file_store):
    with ScriptedOpenAIServer([answer(BROKEN)] * 3) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, "coder_only")

    assert result.outcome is KernelOutcome.VERIFIED and result.status is JobStatus.COMPLETED
    assert [(e.agent, e.ok) for e in trace] == [("coder", True), ("verifier", True)]
    coder = trace[0]
    assert coder.provenance is not None and coder.provenance.source is AnswerSource.FALLBACK
    assert coder.provenance.llm_answers == 3 and len(coder.provenance.rejections) == 3
    assert all(r.startswith("static check: syntax error at line 2") for r in coder.provenance.rejections)
    assert "3 LLM answer(s) refused" in coder.provenance.fallback_reason
    assert coder.provider == "offline" and coder.summary == "candidate written (offline fallback)"
    assert result.fallbacks == [f"step 1 coder: {coder.provenance.fallback_reason}"]
    assert len(server.requests) == 3


@pytest.mark.slow
async def test_after_n_llm_candidates_fail_verification_the_offline_template_is_tried(temporal_env, tmp_path, file_store):
    with ScriptedOpenAIServer([code_answer(MASKING_BUG), code_answer(OTHER_MASKING_BUG)]) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, "coder_only",
                                         request_kw={"llm_rejections_before_fallback": 2})

    assert result.outcome is KernelOutcome.VERIFIED
    assert [(e.agent, e.ok) for e in trace] == [("coder", True), ("verifier", False), ("coder", True),
                                                       ("verifier", False), ("coder", True), ("verifier", True)]
    fallback = trace[4].provenance
    assert fallback is not None and fallback.source is AnswerSource.FALLBACK
    assert fallback.fallback_reason == "the verifier rejected 2 LLM candidates; trying the offline template's candidate"
    assert result.fallbacks and len(server.requests) == 2


@pytest.mark.slow
async def test_a_rejected_candidate_sent_again_is_not_verified_again_and_the_job_ends_no_progress(
        temporal_env, tmp_path, file_store):
    cumsum = apply_overrides((EXAMPLES / "kernelbench" / "36_Cumsum.py").read_text(), {"batch_size": 4, "length": 10})
    cumsum = cumsum.replace("torch.cumsum(x, dim=self.dim)", "torch.sort(x, dim=self.dim)[0]")  # no offline fallback
    wrong = KERNEL_SOURCE.format(mask="offs < n").replace("def __init__(self):", "def __init__(self, dim):")
    with ScriptedOpenAIServer([code_answer(wrong)] * 4) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, "coder_only", source=cumsum)

    assert result.finish_reason is FinishReason.NO_PROGRESS and result.status is JobStatus.FAILED
    assert [(e.agent, e.ok) for e in trace] == [("coder", True), ("verifier", False), ("coder", False)]
    assert result.duplicates_refused == 3, "three answers repeated the rejected candidate; none was verified"
    assert "identical to the one the verifier rejected at step 2" in prompt_of(server.requests[2])
    assert result.failure is not None and result.failure.code == "NO_PROGRESS"
    assert len(server.requests) == 4




@pytest.mark.slow
async def test_an_akg_workflow_yaml_runs_and_its_sequence_limit_stops_the_loop(temporal_env, tmp_path, file_store):
    path = Path(__file__).parents[2] / "examples" / "workflows" / "akg_style.yaml"
    script = [answer(json.dumps({"code": "for each block: y = max(x, 0)"})), code_answer(MASKING_BUG),
              decision("coder", "write the tail"), code_answer(OTHER_MASKING_BUG)]
    with ScriptedOpenAIServer(script) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, load_workflow_config(path))

    assert [(e.agent, e.ok) for e in trace] == [
        ("designer", True), ("coder", True), ("verifier", False), ("coder", True), ("verifier", False)]
    assert result.finish_reason is FinishReason.REPEAT_LIMIT and result.status is JobStatus.FAILED
    assert result.failure is not None and result.failure.code == "REPEAT_LIMIT"
    assert "sequence coder_verifier (coder -> verifier) ran 2 times" in result.failure.message
    design = json.loads(file_store.get_bytes(trace[0].artifact))
    assert design["sketch"] == "for each block: y = max(x, 0)", "designer_parser read the AKG `code` field"
    assert '"code" (str, mandatory): Algorithm pseudocode implementation' in prompt_of(server.requests[0])
    assert len(server.requests) == 4, "the limit ended the run before another analysis or coder answer"


@pytest.mark.slow
async def test_max_step_ends_with_max_steps_and_the_full_trace(temporal_env, tmp_path, file_store):
    script = [code_answer(MASKING_BUG), code_answer(OTHER_MASKING_BUG)]
    with ScriptedOpenAIServer(script) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, "coder_only", max_step=5)

    assert result.outcome is KernelOutcome.MAX_STEPS and result.finish_reason is FinishReason.MAX_STEPS
    assert result.status is JobStatus.FAILED and result.steps == 4, "step 5 would be an unverified coder"
    assert [(e.step, e.agent, e.ok) for e in trace] == [
        (1, "coder", True), (2, "verifier", False), (3, "coder", True), (4, "verifier", False)]
    for entry in trace:
        assert entry.started_at is not None and entry.duration_s >= 0
    coders = [e for e in trace if e.agent == "coder"]
    assert all(e.prompt and e.output and e.artifact and e.tokens.total == 140 for e in coders)
    assert trace[1].report is not None and trace[1].report.mismatches
    assert (result.tokens.total_tokens, result.tokens.calls) == (2 * 140, 2)
    assert "no room for coder" in result.failure.message


@pytest.mark.slow
async def test_unusable_analysis_decisions_fall_back_to_the_deterministic_rule(temporal_env, tmp_path, file_store):
    script = [design_answer(), code_answer(MASKING_BUG), decision("banana", "peel it"), decision("banana", "peel it"),
              code_answer(GOOD)]
    with ScriptedOpenAIServer(script) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, "first_verified", max_step=5)

    assert [e.agent for e in trace] == ["designer", "coder", "verifier", "coder", "verifier"]
    rerouted = trace[3]
    assert rerouted.fallback, "the trace marks the fallback"
    assert rerouted.routing.startswith("fallback: 2 LLM answer(s) refused; the last: decision 'banana' not in ['coder']"), \
        rerouted.routing
    assert "decision 'banana' not in ['coder']" in prompt_of(server.requests[3]), "the analysis was asked to repair"
    assert result.outcome is KernelOutcome.VERIFIED, "never a silent finish: the fallback chose the coder"


@pytest.mark.slow
async def test_parallel_candidates_first_verified_one_wins(temporal_env, tmp_path, file_store):
    with ScriptedOpenAIServer([code_answer(MASKING_BUG), code_answer(GOOD)]) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, "coder_only", num_candidates=2)

    assert result.outcome is KernelOutcome.VERIFIED and result.steps == 2
    coder, verifier = trace
    assert len(coder.candidates) == 2 and coder.tokens.total == 280
    assert verifier.ok and verifier.candidates == coder.candidates
    assert file_store.get_bytes(result.best_candidate).decode() == GOOD
    assert len(server.requests) == 2, "both attempts were asked for in the same round"


async def test_unusable_llm_endpoint_falls_back_to_the_offline_templates(temporal_env, tmp_path, file_store):
    with ScriptedOpenAIServer([error(401, "bad key")]) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, "coder_only")

    assert result.outcome is KernelOutcome.VERIFIED
    coder = trace[0]
    assert coder.provider == "offline" and coder.provenance is not None
    assert coder.provenance.source is AnswerSource.FALLBACK
    assert coder.provenance.fallback_reason.startswith("the LLM call failed: [LLM_AUTH]"), coder.provenance.fallback_reason
    assert len(server.requests) == 1


TORCH_WRAPPER = GOOD.replace("        x = x.contiguous()\n", "        x = torch.relu(x).contiguous()\n").replace(
    "tl.where(x > 0, x, 0.0)", "x")
"""torch computes the relu; the kernel only copies it into the output (numbers match, a kernel wrote it)."""
SIZE_BAKED_IN = GOOD.replace("relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)",
                             "relu_kernel[(7,)](x, out, 7000, BLOCK=1024)")
"""Right at the task's 7 x 1000 only."""


@pytest.mark.slow
async def test_a_torch_wrapper_and_a_size_baked_in_kernel_are_rejected_and_the_coder_told_why(
        temporal_env, tmp_path, file_store):
    script = [design_answer(), code_answer(TORCH_WRAPPER), decision("Coder"), code_answer(SIZE_BAKED_IN),
              decision("Coder"), code_answer(GOOD)]
    with ScriptedOpenAIServer(script) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, "first_verified")

    assert result.outcome is KernelOutcome.VERIFIED, [e.summary for e in trace]
    assert [(e.agent, e.ok) for e in trace] == [
        ("designer", True), ("coder", True), ("verifier", False), ("coder", True), ("verifier", False),
        ("coder", True), ("verifier", True)]
    wrapper, baked = trace[2].report, trace[4].report
    assert wrapper is not None and baked is not None
    line = 1 + TORCH_WRAPPER.splitlines().index("        x = torch.relu(x).contiguous()")
    assert wrapper.reason.startswith("torch did the work, not the Triton kernel: the reference's relu ran as torch "
                                     f"op aten.relu.default at candidate.py:{line}"), wrapper.reason
    assert [(u.op, u.line, u.in_reference) for u in wrapper.torch_ops] == [("relu", line, True)]
    assert trace[2].summary.startswith("FAILED: torch did the work"), "the trace (and Web UI) shows it"
    assert wrapper.reason in prompt_of(server.requests[3]), "the rejection reached the coder as feedback"
    assert "must not assume the sample's sizes" in prompt_of(server.requests[1])

    assert baked.reason.startswith("at the held-out sizes (batch_size=9, dim=1125): trial 0"), baked.reason
    assert baked.reason in prompt_of(server.requests[5])
    assert result.report is not None and result.report.held_out == {"batch_size": 9, "dim": 1125}
    assert result.shapes == "also verified at held-out sizes batch_size=9, dim=1125"
    assert trace[6].summary.startswith("PASSED (also verified at held-out sizes batch_size=9, dim=1125")


SLOW = GOOD.replace("        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)\n",
                    "        for _ in range(10**7):\n"
                    "            relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)\n")
"""Right, but ten million launches per forward: far slower than its time limit."""


@pytest.mark.slow
async def test_a_candidate_slower_than_its_limit_is_a_verdict_and_the_same_worker_verifies_the_next(
        temporal_env, tmp_path, file_store):
    assert SLOW != GOOD
    # a 30 s floor: the right candidate's child (torch's import included) took over 10 s once beside a heavy test
    # file on 2 cores, timed out and the offline coder's kernel was delivered; SLOW needs minutes at any floor
    limit = TimeLimit(multiple=2, floor_s=30, ceiling_s=120)
    script = [design_answer(), code_answer(SLOW), decision("Coder", "make it fast"), code_answer(GOOD)]
    task_id = f"relu-slow-{uuid.uuid4().hex[:6]}"
    with ScriptedOpenAIServer(script) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, "first_verified",
                                         request_kw={"time_limit": limit}, task_id=task_id)

    assert result.outcome is KernelOutcome.VERIFIED and file_store.get_bytes(result.best_candidate).decode() == GOOD
    assert [(e.agent, e.ok) for e in trace] == [
        ("designer", True), ("coder", True), ("verifier", False), ("coder", True), ("verifier", True)]
    slow = trace[2].report
    assert slow is not None and slow.time_limit_s == limit.for_reference(slow.reference_s) < limit.ceiling_s
    assert slow.reason.startswith(f"candidate timed out after {slow.time_limit_s:g}s (killed), before its first forward "
                                  "call ended: its time limit is 2x the reference's time, at least 30 s, at most 120 s, "
                                  "and the reference took "), slow.reason
    assert slow.reason in prompt_of(server.requests[3]), "the coder is told its candidate was too slow"
    assert trace[4].report is not None and trace[4].report.time_limit_s == slow.time_limit_s
    history = await temporal_env.client.get_workflow_handle(f"kernel/{task_id}").fetch_history()
    attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                if e.HasField("activity_task_started_event_attributes")]
    assert attempts and set(attempts) == {1}, "no activity failed, timed out or was retried: the worker stayed healthy"


@pytest.mark.slow
async def test_with_an_llm_the_offline_optimizers_rewrite_goes_first_and_the_llm_is_asked_once_none_is_left(
        temporal_env, tmp_path, file_store):
    """The LLM writes nothing usable here (designer and coder fall back to the offline agents): the first optimizer
    round is the offline rows rewrite, asked before the LLM and shown as the offline agent's by policy; the LLM's
    first optimizer prompt comes in the round where no rewrite is left, and it sees the rewrite's verdict."""
    softmax = (EXAMPLES / "kernels" / "softmax.py").read_text()
    task_id = f"softmax-llm-{uuid.uuid4().hex[:6]}"
    with ScriptedOpenAIServer([answer(BROKEN)] * 9) as server:
        result, trace = await run_llm_conductor(temporal_env.client, tmp_path, file_store, server, "default",
                                                source=softmax, task_id=task_id)
    assert result.outcome is KernelOutcome.VERIFIED and result.finish_reason is FinishReason.VERIFIED
    assert [(e.agent, e.ok) for e in trace] == [("designer", True), ("coder", True), ("verifier", True),
                                                ("optimizer", True), ("verifier", True), ("optimizer", False)]
    rows = trace[3].provenance
    assert trace[3].summary == "rewrite rows: candidate written (offline, before the LLM)" and rows is not None
    assert (rows.source, rows.llm_answers) == (AnswerSource.OFFLINE, 0) and "go first" in rows.fallback_reason
    assert result.best_candidate == trace[3].artifact
    assert [e.split(":")[0] for e in result.fallbacks] == ["step 1 designer", "step 2 coder"], "policy is no fallback"
    roles = [prompt_of(r).split(" of a team")[0] for r in server.requests]
    assert roles == ["You are the designer"] * 3 + ["You are the coder"] * 3 + ["You are the optimizer"] * 3
    assert "def rows_" in prompt_of(server.requests[6]), "the LLM optimizes the rewrite's kernel, the best one"
    last = trace[5].provenance
    assert last is not None and last.llm_answers == 3 and "every applicable rewrite was tried" in last.fallback_reason
    history = await temporal_env.client.get_workflow_handle(f"kernel/{task_id}").fetch_history()
    code = [e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name == "code"]
    # 6 LLM answers (coder, optimizer) + the offline coder's fallback + the rows rewrite + the offline optimizer's
    # "no rewrite left", asked once: it stands as the last rung of the LLM's round without a second activity
    assert len(code) == 9 and result.tokens.calls == 3 + 1 + len(code), [e.event_id for e in code]
