"""The child-process runner every native toolchain call goes through: a crash, a hang, a memory blow-up
or a cancellation is a typed failure in the caller, which lives on."""

from __future__ import annotations

import os
import time

import pytest

from activities.toolchains.isolate import ChildLimits, log_tail, run_isolated, tidy
from contracts.errors import Err, FleetforgeError

HERE = "tests.unit.test_isolate"


# ---- child targets (imported by the child: PYTHONPATH is the repo) ----------------------------

def echo(value: int) -> dict:
    return {"value": value, "pid": os.getpid()}


def segfault() -> None:
    import ctypes

    print("loading the native library", flush=True)
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def hang(pid_file: str) -> None:
    from pathlib import Path

    Path(pid_file).write_text(os.getcwd())  # its own folder: what identifies it from outside its PID namespace
    time.sleep(600)


def raise_coded() -> None:
    raise FleetforgeError(Err.UNSUPPORTED_OP, "op Det has no HTP implementation")


def raise_library_error() -> None:
    raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : /onnxruntime_src/core/session.cc:42 onnxruntime::Status "
                       "onnxruntime::Init() graph finalize failed")


def allocate() -> None:
    bytearray(2 * 1024**3)


# ---- tests ------------------------------------------------------------------------------------

def run(target: str, limits: ChildLimits = ChildLimits(timeout_s=60), writable: tuple = (), **args: object) -> object:
    return run_isolated(f"{HERE}:{target}", dict(args), what=f"target {target}", crash_code=Err.TOOL_CRASHED,
                        fallback_code=Err.EXECUTOR_ERROR, limits=limits, writable=writable)


def host_processes_in(folder: str) -> list[int]:
    """Host pids whose working directory is `folder` (the child's own pid is another one in its PID namespace)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/cwd").removesuffix(" (deleted)") == folder:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def test_the_reply_comes_back_from_another_process():
    reply = run("echo", value=3)
    assert reply["value"] == 3 and reply["pid"] != os.getpid()


def test_a_segfault_is_tool_crashed_naming_the_signal_and_the_last_log_lines():
    with pytest.raises(FleetforgeError) as e:
        run("segfault")
    assert e.value.code is Err.TOOL_CRASHED and not e.value.retryable
    assert "signal SIGSEGV" in e.value.message and "target segfault crashed" in e.value.message
    assert "loading the native library | Fatal Python error: Segmentation fault" in e.value.message
    assert "in string_at" in e.value.message, "the innermost Python frame says where"


def test_a_hang_is_killed_at_the_timeout(tmp_path):
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    with pytest.raises(FleetforgeError) as e:
        run("hang", ChildLimits(timeout_s=3), writable=(tmp_path,), pid_file=str(pid_file))
    assert e.value.code is Err.TOOL_TIMEOUT and "3s" in e.value.message
    assert time.monotonic() - started < 30
    assert host_processes_in(pid_file.read_text()) == [], "nothing of the child is left"


def test_a_cancellation_kills_the_child_at_once(tmp_path):
    from temporalio.exceptions import CancelledError

    pid_file = tmp_path / "pid"
    started = time.monotonic()
    with pytest.raises(CancelledError):
        run_isolated(f"{HERE}:hang", {"pid_file": str(pid_file)}, what="hang", crash_code=Err.TOOL_CRASHED,
                     fallback_code=Err.EXECUTOR_ERROR, cancelled=lambda: pid_file.exists(), writable=[tmp_path])
    assert time.monotonic() - started < 30
    assert host_processes_in(pid_file.read_text()) == []


def test_a_coded_error_keeps_its_code_and_a_library_error_is_one_clean_line():
    with pytest.raises(FleetforgeError) as coded:
        run("raise_coded")
    assert coded.value.code is Err.UNSUPPORTED_OP and coded.value.message == "op Det has no HTP implementation"
    with pytest.raises(FleetforgeError) as library:
        run("raise_library_error")
    assert library.value.code is Err.EXECUTOR_ERROR and library.value.message == "graph finalize failed"


def test_the_memory_limit_holds():
    with pytest.raises(FleetforgeError) as e:
        run("allocate", ChildLimits(timeout_s=60, memory_bytes=1024**3))
    assert e.value.code is Err.EXECUTOR_ERROR and "ran out of memory (limit 1 GiB)" in e.value.message


def test_tidy_strips_runtime_noise():
    assert tidy("Load model from /tmp/ort.quant.ab12/augmented_model.onnx failed:Fatal error: x:Nope(-1) is not a "
                "registered function/op") == "x:Nope(-1) is not a registered function/op"
    assert tidy("a\n  b") == "a b"
    long = "Failed to finalize QNN graph for node layer_" + "x" * 10 + " " + "word " * 200
    cut = tidy(long, limit=60)
    assert len(cut) <= 60 and cut.endswith("…") and cut[:-1] == cut[:-1].rstrip() and long.startswith(cut[:-1])
    assert not cut[:-1].endswith("wor"), "never cut mid-word"


def test_log_tail_prefers_the_crash_frame(tmp_path):
    log = tmp_path / "child.log"
    log.write_text("noise\nFatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n"
                   '  File "/x/onnxruntime/capi/session.py", line 406 in run\n  File "/x/evaluate.py", line 90 in evaluate\n')
    assert log_tail(log) == ["noise", "Fatal Python error: Segmentation fault",
                             'File "/x/onnxruntime/capi/session.py", line 406 in run']


def reach_out(port: int, hidden: str) -> dict:
    """What a crafted model parsed in the child could try: the network, the worker's files, processes, secrets."""
    import socket

    found: dict = {"uid": os.getuid(), "env": sorted(os.environ),
                   "processes": len([p for p in os.listdir("/proc") if p.isdigit()])}
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3)
        found["network"] = "connected"
    except OSError as e:
        found["network"] = type(e).__name__
    found["hidden"] = os.listdir(hidden) if os.path.isdir(hidden) else "absent"
    return found


def test_a_converter_child_is_sandboxed(monkeypatch):
    """The toolchain's children go through the one sandbox: no network, no view of the worker's processes,
    files or secrets, not root."""
    import shutil
    import socket
    import uuid
    from pathlib import Path

    from activities import sandbox

    monkeypatch.setenv("FLEETFORGE_LLM_API_KEY", "sk-planted-isolate")
    state = Path(__file__).resolve().parents[2] / "test-artifacts" / f"state-{uuid.uuid4().hex[:8]}"
    (state / "artifacts").mkdir(parents=True)
    (state / "artifacts" / "model.onnx").write_bytes(b"x")
    listener = socket.create_server(("127.0.0.1", 0))
    sandbox.configure("bwrap", hidden=[state])
    try:
        found = run("reach_out", port=listener.getsockname()[1], hidden=str(state / "artifacts"))
    finally:
        sandbox.configure("bwrap")
        listener.close()
        shutil.rmtree(state)
    assert found["network"] == "ConnectionRefusedError"
    assert found["hidden"] in ("absent", []), "the state dir and the store are not visible"
    assert found["processes"] <= 3, "its own PID namespace"
    assert found["uid"] != 0 and "FLEETFORGE_LLM_API_KEY" not in found["env"]
