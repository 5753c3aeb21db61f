"""The QAIRT SDK toolchain: find the SDK (QAIRT_SDK_ROOT), read its version from the SDK folder,
build the environment its CLIs expect, and run one compiled argv (no shell) in the workspace.

Version detection, in order: `sdk.yaml` (`version: 2.31.0...`), then the folder name
(`.../qairt/2.31.0.250130`). The version picks which tool specs apply (flags differ by version).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from contracts.convert import CompiledStep, StepOutput
from contracts.errors import Err, FleetforgeError

HOST = "x86_64-linux-clang"
TAIL = 2000
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*")


@dataclass(frozen=True)
class QairtSdk:
    root: Path
    version: str
    """major.minor.patch as found in the SDK folder."""

    @property
    def spec_version(self) -> str:
        """major.minor: the tool-spec version family."""
        return ".".join(self.version.split(".")[:2])

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin" / HOST

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment the SDK's envsetup.sh would give: PATH, LD_LIBRARY_PATH, PYTHONPATH."""
        env = dict(os.environ if base is None else base)

        def prepend(var: str, path: Path) -> None:
            env[var] = str(path) + (os.pathsep + env[var] if env.get(var) else "")

        prepend("PATH", self.bin_dir)
        prepend("LD_LIBRARY_PATH", self.root / "lib" / HOST)
        prepend("PYTHONPATH", self.root / "lib" / "python")
        env["QAIRT_SDK_ROOT"] = env["SNPE_ROOT"] = env["QNN_SDK_ROOT"] = str(self.root)
        return env


def detect_sdk(root: Path | str | None) -> QairtSdk:
    """The SDK at `root`, or TOOLCHAIN_UNAVAILABLE saying what is missing."""
    if not root:
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, "the qairt toolchain needs QAIRT_SDK_ROOT set to a QAIRT SDK "
                                                         "folder on the toolchain worker; or use toolchain auto/ort-qnn")
    root = Path(root)
    if not (root / "bin" / HOST).is_dir():
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, f"QAIRT_SDK_ROOT={root} has no bin/{HOST}; point it at the SDK's top folder")
    version = None
    meta = root / "sdk.yaml"
    if meta.is_file():
        m = re.search(r"^\s*version\s*:\s*['\"]?([0-9][0-9.]*)", meta.read_text(), re.MULTILINE)
        version = m.group(1) if m else None
    if version is None:
        m = _VERSION.search(root.name)
        version = m.group(0) if m else None
    if version is None:
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, f"cannot tell the QAIRT SDK version of {root} (no sdk.yaml "
                                                         "version and no version in the folder name)")
    return QairtSdk(root=root, version=version.strip("."))


def run_argv(step: CompiledStep, workspace_root: Path, sdk: QairtSdk, timeout_s: float = 3600.0) -> StepOutput:
    """Run the step's argv with the SDK's environment, cwd = workspace; a non-zero exit is an error."""
    assert step.argv
    program = sdk.bin_dir / step.argv[0]
    if not program.is_file():
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, f"{step.argv[0]} is not in {sdk.bin_dir} (SDK {sdk.version}); "
                                                         "install an SDK that has it or pick another tool")
    for rel in step.outputs:  # outputs' folders exist before the tool runs
        target = workspace_root / rel
        (target if not Path(rel).suffix else target.parent).mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        proc = subprocess.run([str(program), *step.argv[1:]], cwd=workspace_root, env=sdk.env(), capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise FleetforgeError(Err.EXECUTOR_ERROR, f"{step.argv[0]} did not finish within {timeout_s:.0f}s") from e
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        raise FleetforgeError(Err.EXECUTOR_ERROR, f"{step.argv[0]} exited with {proc.returncode}; stderr tail: "
                                                  f"{proc.stderr[-TAIL:].strip() or '(empty)'}")
    return StepOutput(outputs=list(step.outputs), seconds=seconds,
                      details={"argv": step.argv, "exit_code": proc.returncode, "stdout_tail": proc.stdout[-TAIL:],
                               "stderr_tail": proc.stderr[-TAIL:], "sdk_version": sdk.version})
