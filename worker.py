"""Start fleetforge worker(s): `python worker.py --queues all|workflows,llm,...` (= `fleetforge worker`).

One process may poll every queue (the default); scaling out means more workers on the queues
that need them. This is the only module that registers workflows and activities.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import os
import signal
import sys
from typing import Any
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from activities.connection import connect
from activities.containers.activities import ContainerActivities
from activities.experiments import RunActivities
from activities.interceptors import FleetforgeInterceptor
from activities.kernels.activities import KernelActivities
from activities.llm.activity import LLMActivities
from activities.logs import configure_logging, get_logger
from activities.modelhub import ModelHub, ModelHubActivities
from activities.scratch import sweep
from activities.storage import ArtifactStore, open_store
from activities.toolchains.activities import ToolchainActivities
from contracts.common import TaskQueues
from contracts.settings import Settings
from workflows.conductor import ConductorWorkflow
from workflows.converter import ConverterWorkflow
from workflows.fleet import FleetTestWorkflow, ModelTestWorkflow
from workflows.inspect import InspectModelWorkflow

QUEUE_KINDS = ("workflows", "llm", "toolchain", "kernels", "containers")

WORKFLOWS: list[type] = [InspectModelWorkflow, ConverterWorkflow, FleetTestWorkflow, ModelTestWorkflow, ConductorWorkflow]


WORKFLOW_SOURCES = Path(__file__).resolve().parent / "workflows"


def cache_bytecode(*paths: Path) -> None:
    """Write the bytecode of the workflow modules (or of `paths`) beside their source, as pip does at
    install; an up-to-date .pyc is left alone. The workflow sandbox imports a workflow's module afresh
    for every run, a fleet's every row; without a .pyc (PYTHONDONTWRITEBYTECODE=1, as on these hosts and
    in our Dockerfile, whose image compiles at build) each run compiled it again: 2.4 ms per fleet row,
    15 % of the worker's GIL time in a profile of bench_fleet. A folder it cannot write is left as it is."""
    for path in paths or (WORKFLOW_SOURCES,):
        if path.is_dir():
            compileall.compile_dir(path, maxlevels=0, quiet=2)
        else:
            compileall.compile_file(path, quiet=2)


@dataclass
class Registry:
    """Activities per queue kind, built once with their dependencies (STYLE G8)."""

    by_kind: dict[str, list[Callable]] = field(default_factory=lambda: {k: [] for k in QUEUE_KINDS})


def build_registry(settings: Settings, store: ArtifactStore) -> Registry:
    reg = Registry()
    runs = RunActivities(store, settings)
    hub = ModelHubActivities(ModelHub(store, settings))
    reg.by_kind["toolchain"] += [runs.create_run, runs.update_run_status, runs.attach_artifacts,
                                 runs.prepare_workspace, hub.resolve_model]
    tools = ToolchainActivities(store, settings)
    reg.by_kind["toolchain"] += [tools.planner_tool, tools.load_plan, tools.compile_plan, tools.execute_step, tools.evaluate]
    reg.by_kind["toolchain"] += [tools.offline_planner_answer, tools.prepare_calibration, tools.record_failure, tools.write_report]
    llm = LLMActivities(settings, store)
    reg.by_kind["llm"] += [llm.complete_chat]
    kernels = KernelActivities(store, settings, llm)
    reg.by_kind["llm"] += [kernels.design, kernels.code, kernels.analyze]  # kernel agents: offline templates or the LLM
    reg.by_kind["kernels"] += [kernels.trace_reference, kernels.verify, kernels.record_trace]
    containers = ContainerActivities(store, settings)
    reg.by_kind["containers"] += containers.all()
    reg.by_kind["workflows"] += containers.local()  # local activities run on the workflow's own worker
    return reg


def parse_queue_kinds(spec: str) -> list[str]:
    if spec == "all":
        return list(QUEUE_KINDS)
    kinds = [k.strip() for k in spec.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in QUEUE_KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown queue kind(s) {unknown or spec!r}; choose from all, {', '.join(QUEUE_KINDS)}")
    return kinds


CPU_KINDS = frozenset({"toolchain", "kernels"})
"""Queue kinds whose activities keep cores busy: conversion steps and evaluations, the kernel reference
probe and the verifier's reference and candidate children (each child imports torch and runs on a core)."""
IO_SLOTS = 32
"""Activities at once on the other queues: LLM calls, container tests and bookkeeping mostly wait."""


def host_cpus() -> int:
    """The cores this process may run on (its affinity, so `taskset` and container CPU sets count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def activity_slots(kinds: Sequence[str], cpus: int) -> int:
    """How many activities one worker runs at once on a queue that serves `kinds` (pure).

    A queue of CPU-heavy kinds only gets one slot per core: more would make 20 verifiers share 2 cores,
    so every child runs 10x slower, a candidate can time out (a false "no") and heartbeats lag; the
    server keeps the rest queued (no start-to-close time passes there). A queue that mixes in other
    kinds (tests' single queue) keeps IO_SLOTS: capping it would queue LLM calls, container tests and
    bookkeeping behind CPU work."""
    if set(kinds) <= CPU_KINDS:
        return max(1, cpus)
    return IO_SLOTS


def activity_executor(cpus: int | None = None) -> ThreadPoolExecutor:
    """The thread pool the workers share: a thread for every slot of the busiest queue (with fewer,
    activities would wait for a thread and temporalio warns)."""
    return ThreadPoolExecutor(max_workers=max(IO_SLOTS, cpus or host_cpus()), thread_name_prefix="activity")


@dataclass(frozen=True)
class WorkerPlan:
    """One Worker: its queue, the kinds it serves there, what it registers and how many activities at once."""

    task_queue: str
    kinds: tuple[str, ...]
    workflows: tuple[type, ...]
    activities: tuple[Callable, ...]
    max_concurrent_activities: int


def plan_workers(
    registry: Registry, queues: TaskQueues, kinds: Sequence[str], *, cpus: int,
    workflows: Sequence[type] = WORKFLOWS,
) -> list[WorkerPlan]:
    """One Worker per distinct task queue (pure); kinds sharing a queue (tests: one queue) are merged,
    their activities registered once."""
    per_queue: dict[str, tuple[list[str], list[type], list[Callable]]] = {}
    for kind in kinds:
        q = getattr(queues, kind)
        ks, wfs, acts = per_queue.setdefault(q, ([], [], []))
        ks.append(kind)
        if kind == "workflows":
            wfs += [w for w in workflows if w not in wfs]
        acts += [a for a in registry.by_kind[kind] if a not in acts]  # kinds sharing a queue share activities
    return [
        WorkerPlan(q, tuple(ks), tuple(wfs), tuple(acts), activity_slots(ks, cpus))
        for q, (ks, wfs, acts) in per_queue.items()
        if wfs or acts
    ]


def build_workers(
    client: Client, registry: Registry, queues: TaskQueues, kinds: Sequence[str], executor: ThreadPoolExecutor,
    workflows: Sequence[type] = WORKFLOWS, cpus: int | None = None,
) -> list[Worker]:
    """The Workers of `plan_workers`, on the cores this process may use unless `cpus` says otherwise."""
    plans = plan_workers(registry, queues, kinds, cpus=cpus or host_cpus(), workflows=workflows)
    return [
        Worker(
            client, task_queue=p.task_queue, workflows=list(p.workflows), activities=list(p.activities),
            activity_executor=executor, interceptors=[FleetforgeInterceptor()],
            graceful_shutdown_timeout=timedelta(seconds=10), max_concurrent_activities=p.max_concurrent_activities,
        )
        for p in plans
    ]


@contextlib.asynccontextmanager
async def running_workers(workers: Sequence[Worker]) -> AsyncIterator[None]:
    """Run workers for the duration of the block; always shut them down explicitly (a worker left
    running at interpreter exit can abort in finalisation)."""
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield
    finally:
        await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
        await asyncio.gather(*tasks, return_exceptions=True)


async def serve(settings: Settings, kinds: Sequence[str], stop: asyncio.Event, client: Client | None = None) -> None:
    store = open_store(settings)
    client = client or await connect(settings, store)
    log = get_logger("fleetforge.worker")
    confine_children(settings, store, log)
    cache_bytecode()
    swept, freed = await asyncio.to_thread(sweep)
    if swept:
        log.info("removed scratch folders left by killed workers", folders=swept, mib=round(freed / 2**20, 1))
    with activity_executor(settings.cpu_slots) as executor:
        workers = build_workers(client, build_registry(settings, store), settings.queues, kinds, executor,
                                cpus=settings.cpu_slots)
        async with running_workers(workers):
            log.info("worker started", queues=sorted({w.task_queue for w in workers}), store=store.url,
                     temporal=settings.temporal_address, cpu_slots=settings.cpu_slots or host_cpus())
            await stop.wait()
            log.info("worker stopping")


def confine_children(settings: Settings, store: ArtifactStore, log: Any) -> None:
    """Children never see the state dir or a filesystem store; a worker that cannot sandbox says so at
    start (each untrusted child it would start then fails SANDBOX_UNAVAILABLE, never runs unconfined)."""
    from activities import sandbox
    from activities.storage import FileStore

    hidden = [settings.state_dir] + ([store.root] if isinstance(store, FileStore) else [])
    sandbox.configure(settings.sandbox, hidden=hidden)
    if settings.sandbox == "off":
        log.warning("sandbox off", note=sandbox.confinement_note())
    elif problem := sandbox.unavailable():
        log.error("sandbox unavailable: untrusted children will be refused", problem=problem,
                  remedy="apt-get install bubblewrap, or FLEETFORGE_SANDBOX=off to run them unconfined")


def install_stop_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def _main(kinds: list[str]) -> None:
    stop = asyncio.Event()
    install_stop_handlers(stop)
    await serve(Settings(), kinds, stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run fleetforge workers.")
    parser.add_argument("--queues", default="all", help=f"all, or a comma list of {', '.join(QUEUE_KINDS)}")
    args = parser.parse_args(argv)
    try:
        kinds = parse_queue_kinds(args.queues)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    configure_logging()
    from contracts.errors import FleetforgeError, remedy

    try:
        asyncio.run(_main(kinds))
    except FleetforgeError as e:
        print(f"error: {e.message}" + (f" ({remedy(e.code)})" if remedy(e.code) else ""), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
