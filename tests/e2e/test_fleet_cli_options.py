"""`fleetforge fleet-test` options that are checked before anything connects (no server needed): the manifest's
allowed values in `--help`, and the process runner's `--share` / `--process-mode` (issue 40)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FLEETFORGE = str(Path(sys.executable).parent / "fleetforge")


def ff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLEETFORGE, *args], capture_output=True, text=True, timeout=60, env={
        **__import__("os").environ, "COLUMNS": "200", "FLEETFORGE_TEMPORAL_ADDRESS": "127.0.0.1:1"})


def test_help_lists_the_manifests_allowed_values_and_the_process_runners_options():
    shown = " ".join(ff("fleet-test", "--help").stdout.split())
    assert "runtime (vllm | tgi | http; default vllm)" in shown, shown
    assert "status: Yes or No is a verdict (the row is skipped); empty, Error or anything else is tested" in shown
    assert "--process-mode <server|self-test>" in shown and "--share DIR" in shown
    assert "not the host's /tmp, not the home" in shown, "what a command does not see, where the option is"


def test_a_share_that_cannot_be_shared_or_is_for_another_runner_is_exit_2_before_anything_starts(tmp_path: Path):
    csv = tmp_path / "models.csv"
    csv.write_text('model_name,status,note,command\nacme/m,,,"python3 -m tests.doubles.model_server --model acme/m"\n')
    missing = ff("fleet-test", str(csv), "--runner", "process", "--share", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such folder" in missing.stderr, missing.stderr
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    refused = ff("fleet-test", str(csv), "--runner", "process", "--share", str(closed))
    assert refused.returncode == 2 and f"chmod o+rx {closed}" in refused.stderr, refused.stderr
    docker = ff("fleet-test", str(csv), "--runner", "docker", "--share", str(tmp_path))
    assert docker.returncode == 2 and "--share is for --runner process" in docker.stderr, docker.stderr
    mode = ff("fleet-test", str(csv), "--process-mode", "self-test")
    assert mode.returncode == 2 and "is for --runner process" in mode.stderr, mode.stderr
