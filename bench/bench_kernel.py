"""Kernel benchmark: candidates verified per minute on CPU, and workflow history bytes per agent step.

    .venv/bin/python -m bench.bench_kernel [--workdir DIR]

Starts the embedded Temporal dev server (the `temporal` binary, 127.0.0.1, random port) and one
in-process worker (kernel agents + verifier, file store). Then, in one run:
  1. the 8 example tasks through ConductorWorkflow (offline agents, default workflow.yaml) at once:
     candidates verified per minute = verified candidates / wall minutes, and the verify activity
     times (scheduled → completed, from the histories); with them, the whole-model tasks of
     tests/kernel_tasks (Level 3 style: helper modules and methods, an LSTM), whose bigger sources and
     candidates must not grow the history either (a run counts once a candidate reached the verifier);
  2. one LLM run against the scripted OpenAI-compatible server (tests/doubles): designer, a coder
     answer with a masking bug, the verifier's feedback, the conductor's analysis, the fixed
     candidate, verified. Every answer is padded with 8 KiB of prose, to show that answer size
     does not reach the history;
  3. history bytes per agent step of every run, from the real history (protobuf size of all events
     / agent steps; jobs start as the SDK starts them, with the task's source in the store), with PASS/FAIL against the target <= 10 KiB per step (the largest run counts).
Exit code 0 on PASS, 1 on FAIL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from bench._history import activity_times
from bench._dev_server import dev_server

TARGET_BYTES_PER_STEP = 10 * 1024
EXAMPLES = ["relu", "leaky_relu", "gelu", "softmax", "log_softmax", "sum_dim", "rmsnorm", "matmul"]
WHOLE_MODELS = ["shuffle_net_block", "lstm"]
"""tests/kernel_tasks: our own Level 3 style task files."""
PADDING = "Notes on the approach. " * 360
"""About 8 KiB of prose around every scripted answer."""


async def history_bytes(handle) -> int:
    from temporalio.api.history.v1 import History

    history = await handle.fetch_history()
    return History(events=history.events).ByteSize()


async def main_async(workdir: Path) -> int:
    from activities.kernels.config_loader import load_workflow_config
    from activities.storage import FileStore
    from client.artifacts import kernel_trace
    from client.kernel import with_source_in_store
    from contracts.common import JobKind, TaskQueues
    from contracts.kernel import KernelTask
    from contracts.kernel_job import KernelOutcome, KernelRequest, KernelResult
    from contracts.settings import Settings
    from tests.doubles.openai_server import ScriptedOpenAIServer, text_stream
    from tests.helpers import new_worker, outcome_of
    from tests.integration.test_conductor_llm import GOOD, MASKING_BUG
    from worker import build_registry
    from workflows._visibility import start_attributes
    from workflows.conductor import ConductorWorkflow

    examples = Path(__file__).resolve().parents[1] / "examples" / "kernels"
    whole_models = Path(__file__).resolve().parents[1] / "tests" / "kernel_tasks"

    def answer(text: str):
        text = f"{PADDING}\n\n{text}\n\n{PADDING}"
        return text_stream([text[i:i + 512] for i in range(0, len(text), 512)])

    design = json.dumps({"family": "elementwise", "block_sizes": {"BLOCK": 1024}, "tiling": "flat 1-D tiles",
                         "notes": "mask the tail"})
    script = [answer(design), answer(f"```python\n{MASKING_BUG}```"),
              answer(json.dumps({"decision": "coder", "suggestion": "mask must be offs < n"})),
              answer(f"```python\n{GOOD}```")]

    runs: list[tuple[str, KernelResult, int]] = []
    async with dev_server() as env:
        client = env.client
        store = FileStore(workdir / "artifacts")
        with ScriptedOpenAIServer(script) as server:
            settings = Settings(state_dir=workdir / "state", llm_base_url=server.base_url, llm_model="scripted")
            reg = build_registry(settings, store)
            queues = TaskQueues.single(f"bench-{uuid.uuid4().hex[:8]}")
            async with new_worker(client, workflows=[ConductorWorkflow], activities=reg.by_kind["llm"] + reg.by_kind["kernels"],
                                  task_queue=queues.workflows):
                async def start(task: KernelTask, llm: str):
                    req = KernelRequest(task=task, config=load_workflow_config("default"), queues=queues, llm=llm)
                    req = with_source_in_store(req, store)  # as the SDK starts a job
                    return await client.start_workflow(ConductorWorkflow.run, req, id=f"bench-kernel/{task.task_id}",
                                                       task_queue=queues.workflows,
                                                       search_attributes=start_attributes(JobKind.KERNEL, task.op_name))

                tasks = [KernelTask(op_name=op, task_desc=(examples / f"{op}.py").read_text(),
                                    task_id=f"{op}-{uuid.uuid4().hex[:6]}", arch="cpu-interpreter") for op in EXAMPLES]
                t0 = time.monotonic()
                handles = [await start(t, "offline") for t in tasks]
                results = [await h.result() for h in handles]
                wall = time.monotonic() - t0
                verifies = [s for h in handles for s in [t for name, _, t in await activity_times(h) if name == "verify"]]
                for t, h, r in zip(tasks, handles, results):
                    runs.append((f"offline {t.op_name}", r, await history_bytes(h)))
                models = [KernelTask(op_name=op, task_desc=(whole_models / f"{op}.py").read_text(),
                                     task_id=f"{op}-{uuid.uuid4().hex[:6]}", arch="cpu-interpreter") for op in WHOLE_MODELS]
                model_handles = [await start(t, "offline") for t in models]
                for t, h in zip(models, model_handles):
                    runs.append((f"offline {t.op_name} (whole model, {len(t.task_desc) / 1024:.1f} KiB source)",
                                 await outcome_of(h, KernelResult), await history_bytes(h)))

                llm_task = KernelTask(op_name="relu", task_desc=(examples / "relu.py").read_text(),
                                      task_id=f"relu-llm-{uuid.uuid4().hex[:6]}", arch="cpu-interpreter")
                h = await start(llm_task, "openai")
                runs.append(("llm relu (scripted, 8 KiB answers)", await h.result(), await history_bytes(h)))

    verified = sum(r.outcome is KernelOutcome.VERIFIED for r in results)
    print(f"offline agents, default workflow, 8 example tasks at once on one worker ({len(EXAMPLES)} jobs):")
    print(f"  {verified}/{len(EXAMPLES)} VERIFIED in {wall:.1f} s")
    print(f"  candidates verified per minute on CPU: {verified / (wall / 60):.1f}")
    print(f"  verify activity: median {statistics.median(verifies):.1f} s, max {max(verifies):.1f} s "
          f"(two child processes: reference + candidate under the Triton interpreter)")
    print("workflow history bytes per agent step (protobuf size of every event / agent steps):")
    worst = 0.0
    for label, result, size in runs:
        per_step = size / max(result.steps, 1)
        verified_a_candidate = any(e.agent == "verifier" and e.report is not None for e in kernel_trace(store, result))
        worst = max(worst, per_step if verified_a_candidate else 0.0)
        print(f"  {label:<38} {result.outcome.value:<9} steps={result.steps:<2} history={size / 1024:6.1f} KiB "
              f"per step={per_step / 1024:5.2f} KiB  tokens={result.tokens.total_tokens}"
              + ("" if verified_a_candidate else "  (no candidate reached the verifier: not counted)"))
    ok = worst <= TARGET_BYTES_PER_STEP and verified == len(EXAMPLES) and runs[-1][1].outcome is KernelOutcome.VERIFIED
    print(f"largest history per agent step: {worst / 1024:.2f} KiB (target <= {TARGET_BYTES_PER_STEP // 1024} KiB, issue 24): "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", help="state and artifacts folder (default: a temp dir)")
    args = ap.parse_args()
    if args.workdir:
        raise SystemExit(asyncio.run(main_async(Path(args.workdir))))
    with tempfile.TemporaryDirectory() as d:
        raise SystemExit(asyncio.run(main_async(Path(d))))


if __name__ == "__main__":
    main()
