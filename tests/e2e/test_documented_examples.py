"""The README's job examples and the docs' "what next" code, run as written against a `fleetforge dev` stack.

Each command is read out of README.md / docs/*.md at test time and run by bash from a scratch folder that
holds what the docs assume a user has (a copy of `examples/`, their own samples): a doc that drifts from the
code fails here. Only the example run id `20261122-140512-3f9a` is replaced by the id the job printed.
tests/unit/test_documented_commands.py checks that every other documented command still parses.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.test_cli import Stack, start_dev, stack_env, stop_dev

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_RUN_ID = "20261122-140512-3f9a"
EXAMPLES = ("__init__.py", "tiny_model.py", "models.csv", "hardware.yaml", "kernelbench/25_RMSNormWeighted.py")


def fenced_blocks(doc: str, tag: str) -> list[str]:
    """The code of every fenced block of this tag in a doc, in order."""
    text = (ROOT / doc).read_text()
    return re.findall(rf"^```{tag}\n(.*?)^```", text, flags=re.M | re.S)


def shell_lines(doc: str, containing: str) -> list[str]:
    """The commands (comments dropped) of the first bash block of `doc` that has a line containing `containing`."""
    for block in fenced_blocks(doc, "bash"):
        if containing in block:
            return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    raise AssertionError(f"{doc} has no bash block with {containing!r}")


def python_block(doc: str, containing: str) -> str:
    found = [b for b in fenced_blocks(doc, "python") if containing in b]
    assert found, f"{doc} has no python block with {containing!r}"
    return found[0]


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    """A stack, and the folder a user runs the README from: a copy of the examples it names."""
    home = tmp_path_factory.mktemp("user")
    for name in EXAMPLES:
        (home / "examples" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "examples" / name, home / "examples" / name)
    s = start_dev(stack_env(tmp_path_factory.mktemp("docs") / "state"))
    s.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{s.env['PATH']}"  # `source .venv/bin/activate`
    s.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), s.env.get("PYTHONPATH", "")) if p)
    try:
        yield s, home
    finally:
        assert stop_dev(s) == 0


def run(line: str, stack: Stack, cwd: Path, run_id: str = "", timeout: float = 600) -> subprocess.CompletedProcess[str]:
    if run_id:
        line = line.replace(EXAMPLE_RUN_ID, run_id)
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=stack.env, capture_output=True, text=True, timeout=timeout)


def printed_run_id(stdout: str) -> str:
    """The run id of the job whose Web UI link a `--wait` command printed last."""
    found = re.findall(r"^Web UI: \S+/workflows/[a-z-]+%2F([^/\s]+)/", stdout, flags=re.M)
    assert found, stdout[-2000:]
    return found[-1]


@pytest.mark.timeout(900)
def test_the_readme_conversion_with_real_inputs_then_running_the_artifact_as_docs_convert_says(user) -> None:
    stack, home = user
    rng = np.random.default_rng(7)  # the user's own samples: [N, 3, 32, 32] for the tiny CNN's 1x3x32x32 input
    np.save(home / "samples.npy", rng.uniform(0, 1, size=(24, 3, 32, 32)).astype(np.float32))
    run_id = ""
    for line in shell_lines("README.md", "fleetforge convert"):
        done = run(line, stack, home, run_id)
        assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr[-2000:])
        if "fleetforge convert" in line:
            run_id = printed_run_id(done.stdout)
            assert "COMPLETED" in done.stdout and "calibration" in done.stdout, done.stdout[-2000:]
    assert (home / "out" / "converted" / "model_int8_sm8550_ctx.onnx").is_file(), sorted(home.rglob("*.onnx"))

    what_next = python_block("docs/convert.md", "backend_type")
    done = subprocess.run([sys.executable, "-c", what_next], cwd=home, env=stack.env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"\[\[\s*-?\d", done.stdout), "the context model ran and printed its logits: " + done.stdout

    for line in shell_lines("README.md", "fleetforge show"):  # following it, as the README shows next
        done = run(line, stack, home, run_id, timeout=120)
        assert done.returncode == 0, (line, done.stderr[-2000:])


@pytest.mark.timeout(900)
def test_the_readme_kernel_then_using_it_in_a_model_as_docs_kernel_says(user) -> None:
    stack, home = user
    (line,) = shell_lines("README.md", "fleetforge kernel")
    done = run(line, stack, home)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "VERIFIED" in done.stdout, done.stdout[-2000:]
    # what the README says of it: the optimizer's one launch at the floor's traffic, from the first kernel's two
    assert "modeled on H100 (strict): 3.02x over eager" in done.stdout and "2 launch(es)" in done.stdout, done.stdout[-3000:]
    speed = next(ln for ln in done.stdout.splitlines() if ln.startswith("speed: "))
    assert "5.88x over eager" in speed and "traffic 1.00x the floor, 1 launch(es)" in speed, speed
    assert "gpu: compiles for sm_90 (H100 SXM5 80GB) (1 kernel(s)" in done.stdout, done.stdout[-3000:]  # as it says
    run_id = printed_run_id(done.stdout)
    (artifacts,) = [cmd for cmd in shell_lines("docs/kernel.md", "fleetforge artifacts kernel/") if "artifacts" in cmd]
    done = run(artifacts, stack, home, run_id, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]

    what_next = python_block("docs/kernel.md", "ModelNew")
    done = subprocess.run([sys.executable, "-c", what_next], cwd=home, env=stack.env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the verified kernel matches the model" in done.stdout


def test_the_readme_fleet_on_a_machine_without_the_gpus_it_asks_for_is_refused_before_it_starts(user) -> None:
    """The README's fleet targets a GPU host (examples/hardware.yaml: 8 GPUs); here it must stop at once, say so
    and leave the CSV as it was."""
    stack, home = user
    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU host: the fleet would really run")  # this machine kind has none
    before = (home / "examples" / "models.csv").read_bytes()
    (line,) = shell_lines("README.md", "fleetforge fleet-test")
    done = run(line, stack, home, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "examples/hardware.yaml says gpu_count" in done.stderr and "GPUs this host has" in done.stderr, done.stderr
    assert (home / "examples" / "models.csv").read_bytes() == before
