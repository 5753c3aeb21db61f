"""docs/fleet-verdicts.md's examples, run as a user runs them (issue 40): each example's files are written as
the page shows them, its `fleetforge` commands run (a real worker.py, the real docker engine and sandbox),
and the CSV they leave must be the page's, up to what differs per run (ports, latencies). A page whose examples drift from what fleetforge does fails here.

An example is a run of fenced blocks, each after a marker `<!-- example NAME: WHAT -->`: WHAT is a file
name (written before the next run), `run` (a command line, run in the example's folder), or `FILE after`
(what FILE must hold once the runs before it are done)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.doubles import model_server
from tests.helpers import free_port_range
from tests.integration.test_fleet_tiers import tiers_image  # noqa: F401  (the fixture)
from tests.reliability.worker_process import WorkerProcess

pytestmark = pytest.mark.docker

DOC = Path(__file__).resolve().parents[2] / "docs" / "fleet-verdicts.md"
FLEETFORGE = str(Path(sys.executable).parent / "fleetforge")
EXAMPLE_IMAGE = "example/openai-server:1"
"""The page's name for the test suite's stand-in server image (test_fleet_tiers.py builds it)."""
EXAMPLE_FOLDER = "/tmp/llm"
"""The page's folder of the stand-in server script (tests/doubles/model_server.py)."""
_MARKER = re.compile(r"<!-- example (?P<name>[\w-]+): (?P<what>[^>]+?) -->\s*```[a-z]*\n(?P<body>.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Step:
    what: str
    body: str


def examples(text: str) -> dict[str, list[Step]]:
    found: dict[str, list[Step]] = {}
    for m in _MARKER.finditer(text):
        found.setdefault(m["name"], []).append(Step(m["what"].strip(), m["body"]))
    return found


def normal(text: str) -> str:
    """What may differ between runs made equal: ports, latencies, trailing space."""
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
    text = re.sub(r"\bport \d+", "port PORT", text)
    text = re.sub(r"slowest \d+\.\ds", "slowest N.Ns", text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


@contextlib.contextmanager
def example_folder() -> Iterator[Path]:
    """The page's /tmp/llm itself (a note's length, and so where a long one is cut, depends on the path), made
    readable by others like a folder a user makes, one test at a time (a lock), and removed afterwards."""
    folder = Path(EXAMPLE_FOLDER)
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if folder.exists() and not (folder / MARK).exists():
            pytest.fail(f"{folder} exists and is not this test's: move it away to run the page's examples")
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(mode=0o755)
        (folder / MARK).touch()
        shutil.copy(model_server.__file__, folder / "fake_llm.py")
        (folder / "fake_llm.py").chmod(0o644)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)


MARK = ".fleetforge-example"


def test_the_page_has_the_examples_this_test_runs():
    assert set(examples(DOC.read_text())) == {"docker", "process", "self-test"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["docker", "process", "self-test"])
async def test_each_example_of_the_page_leaves_the_csv_the_page_shows(temporal_env, tmp_path: Path, name: str,
                                                                       tiers_image: str):  # noqa: F811
    subprocess.run(["docker", "tag", tiers_image, EXAMPLE_IMAGE], check=True, capture_output=True, timeout=60)
    work = tmp_path / "work"
    work.mkdir()
    worker = WorkerProcess(temporal_env.client, tmp_path / "state", env={"FLEETFORGE_LLM": "offline"})
    ran = 0
    with example_folder():
        async with worker:
            for step in examples(DOC.read_text())[name]:
                if step.what == "run":
                    argv = shlex.split(step.body.strip())
                    assert argv[0] == "fleetforge", step.body
                    done = await asyncio.to_thread(subprocess.run, [FLEETFORGE, *argv[1:]], cwd=work, env=worker.env,
                                                   capture_output=True, text=True, timeout=300)
                    assert done.returncode in (0, 1), done.stderr  # 1: a row is No or Error
                    ran += 1
                elif step.what.endswith(" after"):
                    actual = (work / step.what.removesuffix(" after")).read_text()
                    assert normal(actual) == normal(step.body), f"{step.what} after run {ran}:\n{actual}"
                elif step.what == "ports.yaml":  # the page's ports, moved to ports free on this machine
                    low, high = free_port_range(4)
                    (work / step.what).write_text(re.sub(r"port_range: \[\d+, \d+\]", f"port_range: [{low}, {high}]", step.body))
                else:
                    (work / step.what).write_text(step.body)
    assert ran, f"example {name} runs nothing"


def test_the_pages_curl_asks_a_server_for_what_a_reference_cell_takes(tmp_path: Path):
    """The page's `curl` (how to read a model's greedy answer) run as written against the stand-in server of
    the model it names, on a free port instead of 8000: its choices[0].text is the answer to copy."""
    [block] = [b for b in re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.DOTALL) if b.startswith("curl ")]
    model = re.search(r'"model": "([^"]+)"', block)[1]
    port = free_port_range(1)[0]
    server = subprocess.Popen([sys.executable, model_server.__file__, "--model", model, "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None and "serving" in server.stdout.readline(), "the stand-in server started"
        done = subprocess.run(["bash", "-c", block.replace("127.0.0.1:8000", f"127.0.0.1:{port}")],
                              capture_output=True, text=True, timeout=60)
    finally:
        server.kill()
        server.wait()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["choices"][0]["text"] == model_server.ANSWERS["capital of France"]
