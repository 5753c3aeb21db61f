"""Whole models through the conductor with the offline agents, as KernelBench Level 3 and users' model code
write them (tests/kernel_tasks: our own files in KernelBench's format): a file whose construction needs its
helper module, helper function, class attribute and helper method; an LSTM. Each must end VERIFIED at its
own and its held-out sizes, and the verified candidate is run again here against the reference."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bench.bench_kernelbench import recheck
from contracts.kernel import KernelTask
from contracts.kernel_job import KernelOutcome
from tests.integration.test_conductor_workflow import run_conductor

TASKS = Path(__file__).resolve().parents[1] / "kernel_tasks"
pytest.importorskip("activities.kernels.compiler", reason="whole-model ModelNew and the LSTM lowering come with the "
                    "offline compiler package (issue 36, landing separately)")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["shuffle_net_block", "lstm"])
async def test_a_whole_model_verifies_offline_at_its_own_and_held_out_sizes(temporal_env, file_store, settings, name,
                                                                            tmp_path):
    source = (TASKS / f"{name}.py").read_text()
    task = KernelTask(op_name=name, task_desc=source, task_id=f"{name}-{uuid.uuid4().hex[:6]}", arch="cpu-interpreter")
    result, _ = await run_conductor(temporal_env.client, file_store, settings, task)

    assert result.outcome is KernelOutcome.VERIFIED, (result.failure, result.report and result.report.reason)
    assert result.shapes.startswith("also verified at held-out sizes"), result.shapes
    note, wrong = recheck(source, file_store.get_bytes(result.best_candidate).decode(), tmp_path)
    assert not wrong, f"the independent re-check (fresh signed-normal inputs, outside the verifier): {note}"
