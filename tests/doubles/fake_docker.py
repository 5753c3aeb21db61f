"""Test double: a `docker` CLI without an engine (none runs here). It appends its argv as one JSON
line to $FAKE_DOCKER_LOG and answers `inspect` with $FAKE_STATE ("<running> <exit code>"),
`logs` with "Killed", `run` with a container id; every other call succeeds silently."""

from __future__ import annotations

import sys
from pathlib import Path

FAKE_DOCKER = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
state = os.environ.get("FAKE_STATE", "false 137")
if args[:1] == ["inspect"]:
    print(state)
elif args[:1] == ["logs"]:
    print("Killed")
elif args[:1] == ["run"]:
    print("c0ffee")
"""


def install_fake_docker(directory: Path) -> Path:
    """Write the fake CLI as `<directory>/docker` (executable) and return its path."""
    exe = directory / "docker"
    exe.write_text(FAKE_DOCKER.replace("{python}", sys.executable))
    exe.chmod(0o755)
    return exe
