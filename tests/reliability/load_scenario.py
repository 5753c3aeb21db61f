"""Many jobs at once on one real worker process held to a few cores: 20 kernel jobs (offline agents,
Triton interpreter) and 2 conversions, submitted together through the SDK, as a user with a queue of
work would. Shared by tests/reliability/test_worker_load.py (the verdicts) and bench/bench_load.py
(the waiting times).

Each kernel task's verdict is the one it gets alone (tests/integration/test_conductor_kernelbench.py,
bench_kernel): load may make a job wait, never change its verdict.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client

from activities.kernels.task_source import apply_overrides, op_name_for
from activities.storage import open_store
from client.jobs import JobFailed, JobHandle
from client.sdk import FleetforgeClient
from examples.tiny_model import build_tiny_cnn
from tests.reliability.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"batch_size": 5, "dim": 301}
KERNEL_JOBS: list[tuple[str, dict[str, int], str]] = [
    # (task file, --set sizes, verdict: VERIFIED or the finish reason)
    *[(f"examples/kernels/{op}.py", {}, "VERIFIED")
      for op in ("relu", "leaky_relu", "gelu", "softmax", "log_softmax", "sum_dim", "rmsnorm", "matmul")],
    *[(f"examples/kernelbench/{name}.py", SMALL, "VERIFIED")
      for name in ("01_ReLU", "03_Sigmoid", "04_Tanh", "07_Swish", "09_ELU", "13_Softplus", "14_Softsign")],
    ("examples/kernelbench/02_LeakyReLU.py", SMALL, "VERIFIED"),
    ("examples/kernelbench/26_LayerNorm.py", {"batch_size": 3, "features": 4, "dim": 33}, "VERIFIED"),
    ("examples/kernelbench/32_MatmulTransposedB.py", {"M": 19, "K": 40, "N": 23}, "VERIFIED"),
    ("examples/kernelbench/35_MatrixScalar.py", {"M": 9, "N": 70}, "VERIFIED"),
    ("examples/kernelbench/36_Cumsum.py", {"batch_size": 4, "length": 12}, "VERIFIED"),  # lowered since issue 24
]
CONVERSIONS = [("sm8550", "int8"), ("sm8650", "fp16")]


@dataclass
class JobEnd:
    """How one job ended and how long it took (seconds from the moment every job had been submitted)."""

    job_id: str
    kind: str
    expected: str
    verdict: str
    failure_code: str
    ended_s: float
    failure_message: str = ""
    slot_wait_s: float = 0.0
    """The longest any of its activities waited between being scheduled and being started."""
    retried: tuple[str, ...] = ()
    """Activities that needed more than one attempt (a heartbeat timeout under load would show here)."""


@dataclass
class LoadRun:
    jobs: list[JobEnd]
    cpus: int
    submit_s: float
    """How long submitting every job took."""

    @property
    def last_end_s(self) -> float:
        return max(j.ended_s for j in self.jobs)


def task_files(folder: Path) -> list[tuple[Path, str]]:
    """Each kernel task as a file the SDK can read (sizes applied like `--set`), with its verdict."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for rel, sets, verdict in KERNEL_JOBS:
        src = ROOT / rel
        path = folder / src.name
        path.write_text(apply_overrides(src.read_text(), dict(sets), src.name))
        out.append((path, verdict))
    return out


def pin(pid: int, cpus: int) -> int:
    """Hold a process (and the children it starts later) to its first `cpus` allowed cores."""
    allowed = sorted(os.sched_getaffinity(pid))[:cpus]
    os.sched_setaffinity(pid, allowed)
    return len(allowed)


async def run_load(client: Client, workdir: Path, *, cpus: int = 2, cpu_slots: int | None = None) -> LoadRun:
    """Start one `python worker.py --queues all` held to `cpus` cores, submit every job at once, wait
    for each to end. The worker sizes its CPU-heavy queues from its own affinity unless `cpu_slots`
    (FLEETFORGE_CPU_SLOTS) says otherwise."""
    state = workdir / "state"
    env = {"FLEETFORGE_LLM": "offline"} | ({"FLEETFORGE_CPU_SLOTS": str(cpu_slots)} if cpu_slots else {})
    async with WorkerProcess(client, state, env=env) as wp:
        assert wp.proc is not None
        held = pin(wp.proc.pid, cpus)
        settings = wp.settings.model_copy(update={"llm": "offline"})
        ff = FleetforgeClient(client, settings, open_store(settings))
        model = str(build_tiny_cnn(workdir / "hub" / "tiny.onnx"))
        tasks = task_files(workdir / "tasks")
        t0 = time.monotonic()
        kernels = await asyncio.gather(*(ff.start_kernel(path, arch="cpu", op_name=op_name_for(path.stem)) for path, _ in tasks))
        converts = await asyncio.gather(*(ff.start_convert(model, soc=soc, precision=p, synthetic_calibration=p == "int8")
                                          for soc, p in CONVERSIONS))  # int8 on no data: synthetic, or it asks
        submitted = time.monotonic()
        ends = await asyncio.gather(
            *(_end(client, h, "kernel", verdict, submitted) for h, (_, verdict) in zip(kernels, tasks)),
            *(_end(client, h, "convert", "COMPLETED", submitted) for h in converts))
    return LoadRun(jobs=list(ends), cpus=held, submit_s=submitted - t0)


async def _end(client: Client, handle: JobHandle, kind: str, expected: str, t0: float) -> JobEnd:
    try:
        result = await handle.result()
    except JobFailed as e:
        result = e.result
    ended = time.monotonic() - t0
    failure = getattr(result, "failure", None)
    if kind == "kernel":
        verdict = result.outcome.value if result.outcome.value == "VERIFIED" else str(result.finish_reason or result.outcome)
    else:
        verdict = str(result.status)
    wait, retried = await _activity_waits(client, handle.id)
    return JobEnd(job_id=handle.id, kind=kind, expected=expected, verdict=verdict,
                  failure_code=str(failure.code) if failure is not None else "", ended_s=ended,
                  failure_message=failure.message[:400] if failure is not None else "",
                  slot_wait_s=wait, retried=retried)


async def _activity_waits(client: Client, workflow_id: str) -> tuple[float, tuple[str, ...]]:
    """From the real history: the longest scheduled → started wait, and the activities started more than once."""
    scheduled: dict[int, tuple[str, float]] = {}
    longest, retried = 0.0, []
    async for ev in client.get_workflow_handle(workflow_id).fetch_history_events():
        t = ev.event_time.ToDatetime().timestamp()
        if ev.HasField("activity_task_scheduled_event_attributes"):
            scheduled[ev.event_id] = (ev.activity_task_scheduled_event_attributes.activity_type.name, t)
        if ev.HasField("activity_task_started_event_attributes"):
            started = ev.activity_task_started_event_attributes
            name, t_sched = scheduled[started.scheduled_event_id]
            if started.attempt == 1:
                longest = max(longest, t - t_sched)
            else:
                why = started.last_failure.message if started.HasField("last_failure") else "?"
                retried.append(f"{name} (attempt {started.attempt}, after: {why[:160]})")
    return longest, tuple(retried)
