"""KernelBench-format task files as they are, through `fleetforge kernel FILE --arch cpu-interpreter --set ...`
(the console script, as a user runs it) against the real dev server and a worker in this test: op names
from file names, sizes shrunk with --set, a task too big for the verifier refused before it starts, an
unknown --arch or --set refused with exit 2, --json printing the result contract."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from activities.storage import open_store
from client.artifacts import kernel_trace
from contracts.kernel_job import KernelResult
from contracts.settings import Settings
from tests.helpers import new_worker
from worker import build_registry
from workflows.conductor import ConductorWorkflow

KERNELBENCH = Path(__file__).resolve().parents[2] / "examples" / "kernelbench"
FLEETFORGE = str(Path(sys.executable).with_name("fleetforge"))


def ff(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLEETFORGE, *args], env=env, capture_output=True, text=True, timeout=timeout)


def cli_env(settings: Settings, address: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFORGE_")}
    env.update(FLEETFORGE_STATE_DIR=str(settings.state_dir), FLEETFORGE_TEMPORAL_ADDRESS=address,
               FLEETFORGE_QUEUE_PREFIX=settings.queue_prefix, FLEETFORGE_LLM="offline")
    return env


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "", "errors go to stderr only"
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_an_unknown_arch_is_exit_2_listing_the_known_targets(tmp_path):
    done = ff("kernel", str(KERNELBENCH / "01_ReLU.py"), "--arch", "cpu_interpeter", "--json",
              env=cli_env(Settings(state_dir=tmp_path), "127.0.0.1:1"))
    one_line_error(done, 2, "--arch: unknown target 'cpu_interpeter'",
                   "known targets: cpu-interpreter (or cpu, interpreter), a10, a100, b200, cuda, h100")


def test_task_sizes_the_verifier_cannot_hold_are_refused_up_front_naming_the_set_names(tmp_path):
    env = cli_env(Settings(state_dir=tmp_path), "127.0.0.1:1")  # nothing listens: refused before connecting
    done = ff("kernel", str(KERNELBENCH / "01_ReLU.py"), "--json", env=env)
    one_line_error(done, 2, "01_ReLU.py: the task's inputs take 2.0 GiB (2048x262144 float32)",
                   "over its 8.0 GiB memory limit", "--set batch_size=N --set dim=N (now batch_size=2048, dim=262144)")
    unknown = ff("kernel", str(KERNELBENCH / "01_ReLU.py"), "--set", "dimm=4", env=env)
    one_line_error(unknown, 2, "--set dimm: 01_ReLU.py has no module-level numeric constant 'dimm'",
                   "(it has: batch_size=2048, dim=262144)")
    not_a_task = tmp_path / "plain.py"
    not_a_task.write_text("import torch\nclass Model: pass\n")
    one_line_error(ff("kernel", str(not_a_task), env=env), 2, "not a KernelBench-format task: no get_inputs, get_init_inputs")


RUNS = {
    # file: (--set pairs, expected outcome, op name, family)
    "02_LeakyReLU.py": (["batch_size=5", "dim=301"], "VERIFIED", "LeakyReLU", "lowered: leaky_relu"),
    "26_LayerNorm.py": (["batch_size=3", "features=4", "dim=33"], "VERIFIED", "LayerNorm", "lowered: native_layer_norm"),
    "32_MatmulTransposedB.py": (["M=19", "K=40", "N=23"], "VERIFIED", "MatmulTransposedB", "lowered: mm"),
    "35_MatrixScalar.py": (["M=9", "N=70"], "VERIFIED", "MatrixScalar", "lowered: mul"),
    "36_Cumsum.py": (["batch_size=4", "length=12"], "VERIFIED", "Cumsum", "lowered: cumsum"),
}


@pytest.mark.slow
async def test_our_kernelbench_tasks_run_unmodified_through_the_cli_with_set(temporal_env, tmp_path):
    settings = Settings(state_dir=tmp_path / "state", queue_prefix=f"kb-{uuid.uuid4().hex[:8]}", llm="offline")
    store = open_store(settings)
    reg = build_registry(settings, store)
    queues = settings.queues
    env = cli_env(settings, temporal_env.client.service_client.config.target_host)
    before = {name: (KERNELBENCH / name).read_text() for name in RUNS}
    client = temporal_env.client
    async with new_worker(client, workflows=[ConductorWorkflow], task_queue=queues.workflows), \
            new_worker(client, activities=reg.by_kind["llm"], task_queue=queues.llm), \
            new_worker(client, activities=reg.by_kind["kernels"], task_queue=queues.kernels):
        runs = await asyncio.gather(*(asyncio.to_thread(
            ff, "kernel", str(KERNELBENCH / name), "--arch", "cpu-interpreter", "--workflow", "first_verified",
            *[a for pair in sets for a in ("--set", pair)], "--wait", "--json", env=env, timeout=600)
            for name, (sets, *_rest) in RUNS.items()))

    for (name, (sets, outcome, op_name, family)), done in zip(RUNS.items(), runs):
        assert done.returncode == (0 if outcome == "VERIFIED" else 1), (name, done.stderr[-2000:])
        result = json.loads(done.stdout)  # the whole stdout is the result contract
        assert result["outcome"] == outcome, (name, result.get("failure"), result.get("report"))
        assert result["op_family"].startswith(family), (name, result["op_family"])
        assert result["overrides"] == {k: int(v) for k, v in (p.split("=") for p in sets)}
        assert result["report"]["families"] == ["task", "signed_normal", "large", "near_zero"]
        trace = kernel_trace(store, KernelResult.model_validate(result))  # the contract names the stored trace
        assert [(e.step, e.agent) for e in trace] == [(1, "designer"), (2, "coder"), (3, "verifier")]
    listed = json.loads(ff("list", "--kind", "kernel", "--json", env=env).stdout)["jobs"]
    ours = {op for _s, _o, op, _f in RUNS.values()}
    started_here = {j["model"] for j in listed if j["target"] == "cpu-interpreter"}  # the session's server is shared
    assert ours <= started_here, "op names come from the file names (the problem number dropped)"
    cumsum = next(j["workflow_id"] for j in listed if j["model"] == "Cumsum" and j["target"] == "cpu-interpreter")
    shown = ff("show", cumsum, env=env)
    steps = [line.split()[:3] for line in shown.stdout.splitlines() if line.startswith("    ")]
    assert steps == [["1", "designer", "ok"], ["2", "coder", "ok"], ["3", "verifier", "ok"]], shown.stdout + shown.stderr
    assert before == {name: (KERNELBENCH / name).read_text() for name in RUNS}, "the task files are never changed"


def test_a_time_limit_that_cannot_be_is_exit_2_before_anything_starts(tmp_path):
    env = cli_env(Settings(state_dir=tmp_path), "127.0.0.1:1")  # nothing listens: refused before connecting
    done = ff("kernel", str(KERNELBENCH / "01_ReLU.py"), "--set", "batch_size=2", "--set", "dim=8",
              "--time-limit-floor", "900", "--time-limit-ceiling", "60", "--json", env=env)
    one_line_error(done, 2, "verifier time limit: floor_s (900) is above ceiling_s (60)")
