"""A real `python worker.py` in its own process group, so a test can SIGKILL it mid-activity
(no graceful shutdown, no heartbeat goodbye) and start a fresh one: the crash a machine sees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest, DescribeWorkflowExecutionRequest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.client import Client

from contracts.common import TaskQueues
from contracts.settings import Settings
from tests.helpers import assert_eventually

REPO = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """`python worker.py --queues all` against the test's dev server, on a queue prefix of its own.

    Extra environment (an LLM base URL, QAIRT_SDK_ROOT, a store URL) goes in `env`; the state dir
    (file store, caches) is shared by every process of one test, like a shared artifact store."""

    def __init__(self, client: Client, state_dir: Path, env: dict[str, str] | None = None, prefix: str | None = None,
                 wrap: list[str] | None = None):
        self.client = client
        self.wrap = list(wrap or [])
        """argv the worker runs under (e.g. bwrap with the client's folder hidden)."""
        self.prefix = prefix or f"crash-{uuid.uuid4().hex[:8]}"
        self.env = {
            **os.environ,
            "FLEETFORGE_TEMPORAL_ADDRESS": client.service_client.config.target_host,
            "FLEETFORGE_NAMESPACE": client.namespace,
            "FLEETFORGE_QUEUE_PREFIX": self.prefix,
            "FLEETFORGE_STATE_DIR": str(state_dir),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.log = state_dir / f"worker-{self.prefix}.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def settings(self) -> Settings:
        return Settings(queue_prefix=self.prefix, state_dir=Path(self.env["FLEETFORGE_STATE_DIR"]))

    @property
    def queues(self) -> TaskQueues:
        return self.settings.queues

    async def start(self) -> None:
        """Start a worker and return once it polls the workflow queue."""
        assert self.proc is None or self.proc.poll() is not None, "a worker is already running"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with self.log.open("a") as log:
            log.write(f"--- start {self.starts}\n")
            self.proc = subprocess.Popen([*self.wrap, sys.executable, str(REPO / "worker.py"), "--queues", "all"], cwd=REPO,
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        await assert_eventually(self._polling, timeout=60, interval=0.2, message=f"worker polling (log: {self.log})")

    async def _polling(self) -> bool:
        assert self.proc is not None
        assert self.proc.poll() is None, f"worker exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}"
        resp = await self.client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=self.client.namespace, task_queue=TaskQueue(name=self.queues.workflows),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW))
        if self.wrap:  # the worker is a child of the wrapper (its pid differs): any poller on our own queue
            return bool(resp.pollers)
        return any(p.identity.startswith(f"{self.proc.pid}@") for p in resp.pollers)

    def kill(self) -> None:
        """SIGKILL the worker and everything it started (tool and verifier child processes)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Graceful stop (SIGTERM), then SIGKILL if it does not go within 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    async def __aenter__(self) -> "WorkerProcess":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()


async def running_activity(client: Client, workflow_id: str, activity_type: str) -> bool:
    """True while an activity of that type is started (picked up by a worker) for the workflow."""
    desc = await client.workflow_service.describe_workflow_execution(DescribeWorkflowExecutionRequest(
        namespace=client.namespace, execution=WorkflowExecution(workflow_id=workflow_id)))
    from temporalio.api.enums.v1 import PendingActivityState

    return any(a.activity_type.name == activity_type and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
               for a in desc.pending_activities)
