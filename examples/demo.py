"""The README's demo: start the embedded stack, convert a bundled tiny model for SM8550 int8.

Drives the public CLI only (what a user types), so it doubles as a smoke test of it:
`fleetforge dev` in the background → wait until it answers → `fleetforge inspect MODEL --wait`
→ `fleetforge convert MODEL --soc sm8550 --precision int8 --synthetic-calibration --wait` (run id,
artifacts with sha256, evaluation, the deployment report, Web UI URL) → stop the stack (runs stay in
.fleetforge/ and are listed by the next `fleetforge dev`).

The bundled model has seeded random weights: there are no real inputs to calibrate it on, so the demo
opts in to synthetic calibration and the verdict honestly says `unverified on real data` (with real
inputs, `--calibration FILE.npz` calibrates on part of them and grades the held-out rest).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.tiny_model import build_tiny_cnn  # noqa: E402

FLEETFORGE = str(Path(sys.executable).parent / "fleetforge")


def wait_ready(dev: subprocess.Popen, deadline_s: float = 90) -> None:
    """Poll `fleetforge list` until the stack answers (no fixed sleeps)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if dev.poll() is not None:
            raise SystemExit(f"fleetforge dev exited early with code {dev.returncode}")
        if subprocess.run([FLEETFORGE, "list"], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    raise SystemExit("the embedded stack did not come up within 90 s (see .fleetforge/dev.log)")


def sandbox_problem() -> str | None:
    """Why the conversion's sandboxed children could not start here, before anything starts (`make demo`
    installs bubblewrap as root; this catches a machine where it is missing or cannot create namespaces)."""
    from activities import sandbox
    from contracts.settings import Settings

    if Settings().sandbox == "off":
        return None
    problem = sandbox.unavailable()
    if problem is None:
        return None
    return (f"the demo's conversion runs its tools in the sandbox, which cannot start here: {problem}. "
            "Nothing was started. Install it as root: `apt-get install -y bubblewrap` (make demo does, as root), "
            "then run make demo again; or run the tools unconfined, said in every result: "
            "`FLEETFORGE_SANDBOX=off make demo`")


def main() -> int:
    if problem := sandbox_problem():
        print(problem, file=sys.stderr)
        return 2
    state = ROOT / ".fleetforge"
    state.mkdir(exist_ok=True)
    model = build_tiny_cnn(state / "models" / "tiny_cnn.onnx")
    env = {**os.environ, "FLEETFORGE_STATE_DIR": str(state)}
    with open(state / "dev.log", "ab") as log:
        dev = subprocess.Popen([FLEETFORGE, "dev"], env=env, stdout=log, stderr=log)
    try:
        wait_ready(dev)
        print(f"embedded stack up; logs in {state / 'dev.log'}", flush=True)
        done = subprocess.run([FLEETFORGE, "inspect", str(model), "--wait"], env=env)
        if done.returncode != 0:
            return done.returncode
        print("\nconverting for SM8550 int8 (QNN HTP context binary), calibrated on synthetic inputs "
              "(the model has no real data):", flush=True)
        done = subprocess.run(
            [FLEETFORGE, "convert", str(model), "--soc", "sm8550", "--precision", "int8", "--synthetic-calibration",
             "--wait"], env=env)
        return done.returncode
    finally:
        dev.send_signal(signal.SIGTERM)
        try:
            dev.wait(timeout=60)
        except subprocess.TimeoutExpired:
            dev.kill()


if __name__ == "__main__":
    sys.exit(main())
