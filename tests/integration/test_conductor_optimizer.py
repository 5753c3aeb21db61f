"""The offline optimizer through ConductorWorkflow (real dev server, real verifier children, offline agents): a
two-pass softmax is rewritten to one pass and stays VERIFIED; a rewrite that breaks correctness is discarded, and
the verified candidate before it is the one delivered."""

from __future__ import annotations

import json
import uuid

from activities.kernels import optimizer
from activities.kernels.optimizer import Rewrite
from contracts.kernel import FinishReason, KernelTask, TimeLimit
from contracts.kernel_job import KernelOutcome
from tests.integration.test_conductor_workflow import run_conductor, task_for
from tests.unit.test_gpu_compile import copy_kernel
from workflows import conductor_policy


async def test_a_two_pass_softmax_is_rewritten_to_one_launch_and_stays_verified(temporal_env, file_store, settings):
    result, trace = await run_conductor(temporal_env.client, file_store, settings, task_for("softmax"), "default")

    assert result.outcome is KernelOutcome.VERIFIED and result.finish_reason is FinishReason.VERIFIED
    assert [(e.agent, e.ok) for e in trace] == [("designer", True), ("coder", True), ("verifier", True),
                                                ("optimizer", True), ("verifier", True), ("optimizer", False)]
    coder_modeled, optimized = trace[2].modeled, trace[4].modeled
    assert coder_modeled is not None and optimized is not None
    assert coder_modeled.launches == 3 and optimized.launches == 1  # amax, sum(exp), div -> one online row kernel
    assert optimized.modeled_ms < coder_modeled.modeled_ms and optimized.traffic_ratio < coder_modeled.traffic_ratio
    assert trace[3].summary.startswith("rewrite rows: candidate written")
    assert trace[4].summary.startswith("kept as the best: PASSED")
    assert "every applicable rewrite was tried (rows=kept)" in trace[5].summary
    assert result.best_candidate == trace[3].artifact and result.modeled == optimized
    source = file_store.get_bytes(result.best_candidate).decode()
    assert source.count("[grid](*args, **meta)") == 1 and "def rows_" in source
    assert result.report is not None and result.report.passed


MLP_BLOCK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


batch, tokens, dim, hidden = 2, 5, 12, 24


def get_inputs():
    return [torch.randn(batch, tokens, dim)]


def get_init_inputs():
    return [dim, hidden]
"""


async def test_a_transformer_mlp_block_gets_its_epilogues_through_the_token_views(temporal_env, file_store, settings):
    """A Linear on [batch, tokens, features] traces as view -> matmul -> view: the epilogue rewrite follows the views,
    so GELU and the residual add run in the two matmuls' kernels (9 launches -> 3: the layer norm's row kernel and
    one per matmul), verified at the held-out sizes too, where dim (both Linears' features) changes."""
    task = KernelTask(op_name="mlp_block", task_desc=MLP_BLOCK, task_id=f"mlp-{uuid.uuid4().hex[:6]}",
                      arch="cpu-interpreter")
    result, trace = await run_conductor(temporal_env.client, file_store, settings, task, "default")

    assert result.outcome is KernelOutcome.VERIFIED and result.finish_reason is FinishReason.VERIFIED
    assert [(e.agent, e.ok) for e in trace] == [("designer", True), ("coder", True), ("verifier", True),
                                                ("optimizer", True), ("verifier", True), ("optimizer", False)]
    assert trace[3].summary.startswith("rewrite rows+epilogue:"), trace[3].summary
    coder_modeled, optimized = trace[2].modeled, trace[4].modeled
    assert coder_modeled is not None and optimized is not None
    assert (coder_modeled.launches, optimized.launches) == (9, 3)
    assert optimized.traffic_ratio < coder_modeled.traffic_ratio and optimized.modeled_ms < coder_modeled.modeled_ms
    assert result.best_candidate == trace[3].artifact and result.report is not None and result.report.passed
    assert "dim" in result.report.held_out, result.report.held_out  # the Linears' features changed too
    source = file_store.get_bytes(result.best_candidate).decode()
    assert source.count("_epilogue(_matmul(") == 2 and source.count("[grid](*args, **meta)") == 3


CAUSAL_SDPA = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


batch, heads, seq, dim = 2, 2, 40, 8


def get_inputs():
    return [torch.randn(batch, heads, seq, dim) for _ in range(3)]


def get_init_inputs():
    return []
"""


async def test_causal_attention_becomes_one_kernel_whose_scores_never_reach_memory(temporal_env, file_store, settings):
    """scaled_dot_product_attention's scores, softmax and second matmul become one flash-attention kernel, verified
    at the held-out sizes too (another sequence length: the causal mask and the key blocks change)."""
    task = KernelTask(op_name="sdpa", task_desc=CAUSAL_SDPA, task_id=f"sdpa-{uuid.uuid4().hex[:6]}",
                      arch="cpu-interpreter")
    result, trace = await run_conductor(temporal_env.client, file_store, settings, task, "default")

    assert result.outcome is KernelOutcome.VERIFIED and result.finish_reason is FinishReason.VERIFIED
    assert trace[3].agent == "optimizer" and trace[3].summary.startswith("rewrite attention"), trace[3].summary
    assert trace[4].summary.startswith("kept as the best: PASSED"), trace[4].summary
    coder_modeled, optimized = trace[2].modeled, trace[4].modeled
    assert coder_modeled is not None and optimized is not None
    assert optimized.launches < coder_modeled.launches and optimized.traffic_ratio < coder_modeled.traffic_ratio
    assert result.best_candidate == trace[3].artifact and result.report is not None and result.report.passed
    assert "seq" in result.report.held_out, result.report.held_out
    source = file_store.get_bytes(result.best_candidate).decode()
    assert source.count("= _attention(") == 1 and "def attention_" in source


async def test_a_rewrite_that_breaks_correctness_is_discarded_and_never_delivered(temporal_env, file_store, settings,
                                                                                    monkeypatch):
    def divides_by_multiplying(graph):  # noqa: ANN001, ANN202 - the compiler's Graph
        wrong = [n for n in graph.nodes if n.op == "pw" and n.attrs.get("fn") == "div"]
        for node in wrong:
            node.attrs["fn"] = "mul"
        return graph if wrong else None

    optimizer.load()  # the real rewrites register now, before the registry is replaced for this test
    monkeypatch.setattr(optimizer, "REWRITES", {"broken": Rewrite("broken", 1, "a wrong rewrite", divides_by_multiplying)})
    result, trace = await run_conductor(temporal_env.client, file_store, settings, task_for("softmax"), "default")

    assert result.outcome is KernelOutcome.VERIFIED and result.finish_reason is FinishReason.VERIFIED
    assert [(e.agent, e.ok) for e in trace] == [("designer", True), ("coder", True), ("verifier", True),
                                                ("optimizer", True), ("verifier", False), ("optimizer", False)]
    assert trace[3].summary.startswith("rewrite broken:") and "elements differ" in trace[4].summary
    assert result.best_candidate == trace[1].artifact  # the coder's verified kernel, not the broken rewrite
    assert result.report is not None and result.report.passed and result.modeled == trace[2].modeled
    assert "every applicable rewrite was tried (broken=wrong)" in trace[-1].summary


async def test_a_rewrite_over_the_optimizers_time_budget_is_reverted_and_the_job_keeps_its_kernel(
        temporal_env, file_store, settings, monkeypatch):
    """The rounds improve a kernel the job already has: a rewrite that runs longer than its budget (a few times the
    verified candidate's own run; here shrunk to 1 s, less than a child's start) is reverted, not called wrong."""
    monkeypatch.setattr(conductor_policy, "OPTIMIZER_TIME_MULTIPLE", 0.01)
    monkeypatch.setattr(conductor_policy, "OPTIMIZER_TIME_FLOOR_S", 1.0)
    histories: list = []
    result, trace = await run_conductor(temporal_env.client, file_store, settings, task_for("softmax"), "default",
                                        histories=histories)

    assert result.outcome is KernelOutcome.VERIFIED and result.finish_reason is FinishReason.VERIFIED
    assert [(e.agent, e.ok) for e in trace] == [("designer", True), ("coder", True), ("verifier", True),
                                                ("optimizer", True), ("verifier", False),  # rows
                                                ("optimizer", False)]  # no other rewrite applies
    assert trace[4].summary.startswith("over the optimizer's time budget"), trace[4].summary
    assert "candidate timed out" in trace[4].summary and "a fixed 1 s" in trace[4].summary, trace[4].summary
    assert trace[3].summary.startswith("rewrite rows:") and "every applicable rewrite was tried" in trace[5].summary
    assert result.best_candidate == trace[1].artifact and result.modeled == trace[2].modeled
    limits = [json.loads(e.activity_task_scheduled_event_attributes.input.payloads[0].data)["time_limit"]
              for e in histories[0].events if e.activity_task_scheduled_event_attributes.activity_type.name == "verify"]
    assert [TimeLimit.model_validate(lim).ceiling_s for lim in limits] == [1800.0, 1.0]  # the job's limit, then the round's


async def test_a_rewrite_right_on_the_interpreter_that_the_gpu_compiler_refuses_is_reverted(
        temporal_env, file_store, settings, monkeypatch):
    """The optimizer's candidate (here standing in for a rewrite's emitter bug) is right on every CPU run, but its
    kernel does not compile for the H100 the job is modeled on: rejected with the compiler's message, never
    delivered; the coder's kernel, which compiles, stays."""
    def offline_answer(task_source, reference, tried, *, tf32=False):  # noqa: ANN001, ANN202, ARG001
        if tried:
            return "every rewrite was tried"
        return optimizer.Proposal(copy_kernel(type_change=True, relu=True), "bad")

    monkeypatch.setattr(optimizer, "offline_answer", offline_answer)
    monkeypatch.setattr(conductor_policy, "SOL_STOP", 1.01)  # the coder's relu is at SOL: have the rounds run anyway
    result, trace = await run_conductor(temporal_env.client, file_store, settings, task_for("relu"), "default")

    assert result.outcome is KernelOutcome.VERIFIED and result.finish_reason is FinishReason.VERIFIED
    assert [(e.agent, e.ok) for e in trace] == [("designer", True), ("coder", True), ("verifier", True),
                                                ("optimizer", True), ("verifier", False), ("optimizer", False)]
    assert "does not compile for sm_90 (H100 SXM5 80GB): kernel copy_kernel" in trace[4].summary, trace[4].summary
    assert "Loop-carried variable acc" in trace[4].summary
    assert result.best_candidate == trace[1].artifact and result.report is not None and result.report.passed
    assert result.report.gpu_compile is not None and result.report.gpu_compile.compiles is True
