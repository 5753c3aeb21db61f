"""One docker test run (DockerRunner with the row markers) in a process of its own, for the kill tests:
`python -m tests.reliability.docker_row_process REQUEST.json MARKERS STORE [DOCKER]` prints every
heartbeat on its own line (flushed), so a test can SIGKILL it at a chosen point of the row's start."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from activities.containers.runners import DockerRunner
from activities.storage import FileStore
from contracts.fleet_job import RunTestRequest


def _beat(message: str) -> None:
    print(message, flush=True)


async def main(request: Path, markers: Path, store: Path, docker: str) -> None:
    req = RunTestRequest.model_validate_json(request.read_text())
    runner = DockerRunner(FileStore(store), docker=docker, poll_s=0.2, marker_dir=markers)
    outcome = await runner.run(req, _beat)
    print(f"OUTCOME {outcome.model_dump_json()}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "docker"))
