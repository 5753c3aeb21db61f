"""One script-runner test run (ScriptRunner with the row markers) in a process of its own, for the kill
tests: `python -m tests.reliability.script_row_process REQUEST.json SCRIPT MARKERS STORE`."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from activities.containers.runners import ScriptRunner
from activities.storage import FileStore
from contracts.fleet_job import RunTestRequest


async def main(request: Path, script: Path, markers: Path, store: Path) -> None:
    req = RunTestRequest.model_validate_json(request.read_text())
    outcome = await ScriptRunner(FileStore(store), script, marker_dir=markers).run(req, lambda m: print(m, flush=True))
    print(f"OUTCOME {outcome.model_dump_json()}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])))
