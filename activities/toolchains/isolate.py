"""Native-runtime work in a child process: a crash is a typed failure, never a dead worker.

Everything that loads a model into onnxruntime / the QNN HTP backend (compile, quantize, evaluate,
inspect a context model) runs as `python -m activities.toolchains.isolate REQUEST.json`: a fresh
interpreter in the one sandbox (activities/sandbox: a user's model is parsed by native code, so no
network, no other processes, read-only filesystem but its own folder and the run workspace), with an
address-space limit, no core files, a wall-clock timeout, and the worker's death taking it along. The
parent waits in short slices, so a Temporal cancellation raised into the activity thread kills it at once.

Outcomes, as FleetforgeError codes:
* the target returned → its JSON reply;
* the target raised FleetforgeError → that code and message (e.g. UNSUPPORTED_OP);
* the target raised anything else → `fallback_code` with the exception's one-line message;
* the child died by a signal (SIGSEGV in libQnnHtp.so, SIGABRT from std::bad_alloc) → `crash_code`
  (TOOL_CRASHED / EVALUATION_CRASHED) naming the signal and the last log lines; non-retryable;
* past the timeout → TOOL_TIMEOUT.

The reply travels in a file, not on stdout: native libraries print there.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from activities.lifeline import die_with_parent, exit_now
from activities.sandbox import Limits, SandboxPolicy, exit_description, scrub, spawn_child, wait_children
from activities.scratch import Scratch
from contracts.errors import Err, FleetforgeError

LOG_LINES = 3
LOG_CHARS = 400
MEMORY_SIGNALS = frozenset({signal.SIGABRT, signal.SIGKILL, signal.SIGBUS})
"""How a native allocation failure under the address-space limit usually ends."""


@dataclass(frozen=True)
class ChildLimits:
    timeout_s: float = 3600.0
    memory_bytes: int = 16 * 1024**3
    """RLIMIT_AS of the child (0: none). The HTP emulator maps a few GiB of address space."""


DEFAULT_LIMITS = ChildLimits()


def run_isolated(target: str, args: dict[str, Any], *, what: str, crash_code: Err, fallback_code: Err,
                 limits: ChildLimits = DEFAULT_LIMITS, cancelled: Callable[[], bool] | None = None,
                 writable: Sequence[Path] = ()) -> Any:
    """Run `module:function(**args)` in a sandboxed child (activities/sandbox: it parses a user's model)
    and return its (JSON) result; see the module doc. `writable`: the run workspace the target writes."""
    with Scratch("tool") as work:
        (work / "request.json").write_text(json.dumps({"target": target, "args": args, "fallback": fallback_code.value}))
        log = work / "child.log"
        box = Limits(timeout_s=limits.timeout_s, memory_bytes=limits.memory_bytes, cpu_s=int(limits.timeout_s) + 10)
        # cwd = the child's own folder: libraries drop debug files into the cwd (sym_shape_infer_temp.onnx)
        child = spawn_child([sys.executable, "-m", "activities.toolchains.isolate", str(work)], scratch=work, limits=box,
                            policy=SandboxPolicy(writable=tuple(writable)), env=_child_env(limits), log=log)
        wait_children({"tool": child}, timeout_s=limits.timeout_s, cancelled=cancelled)
        code = child.exit_code
        if code is None:
            raise FleetforgeError(Err.TOOL_TIMEOUT, f"{what} did not finish within {limits.timeout_s:.0f}s (killed)"
                                  + _tail_suffix(log))
        reply_path = work / "reply.json"
        reply = json.loads(reply_path.read_text()) if reply_path.is_file() else None
        if code < 0 or reply is None:
            memory = f", memory limit {_gib(limits.memory_bytes)}" if -code in MEMORY_SIGNALS else ""
            described = exit_description(code) + ("" if code < 0 else " without a reply")
            raise FleetforgeError(crash_code, f"{what} crashed ({described}{memory})" + _tail_suffix(log))
        if "error" in reply:
            raise FleetforgeError(_code(reply["error"]["code"], fallback_code), scrub(reply["error"]["message"]))
        return reply["ok"]


def log_tail(log: Path, lines: int = LOG_LINES) -> list[str]:
    """What a child printed last: for a native crash, faulthandler's "Fatal Python error" line and the
    innermost Python frame (where it happened); else the last non-empty lines."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    kept = [ln.strip() for ln in text.splitlines() if ln.strip() and "libnative_tls" not in ln]
    fatal = next((i for i, ln in enumerate(kept) if ln.startswith("Fatal Python error")), None)
    if fatal is not None:
        before = kept[max(0, fatal - lines + 1):fatal]
        frame = next((ln for ln in kept[fatal:] if ln.startswith("File ")), "")
        return [scrub(ln[-LOG_CHARS:]) for ln in [*before, kept[fatal], frame] if ln]
    return [scrub(ln[-LOG_CHARS:]) for ln in kept[-lines:]]


def _tail_suffix(log: Path) -> str:
    tail = log_tail(log)
    return f"; last log lines: {' | '.join(tail)}" if tail else ""


_ORT_PREFIX = re.compile(r"\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*[A-Z_]+\s*:\s*")
_CPP_LOCATION = re.compile(r"(?:/|\b)[\w./-]+\.(?:cc|cpp|cxx|h|hpp):\d+\s*"
                           r"(?:(?:[\w:<>*&]+\s+)?[\w:~<>]+\([^)]*\)\s*(?:const\s*)?)?")


_TEMP_MODEL = re.compile(r"Load model from \S*/ort\.quant\.\w+/\S+ failed:\s*(?:Fatal error:\s*)?")


def tidy(text: str, limit: int = 600) -> str:
    """A library's error as one readable line: no "[ONNXRuntimeError] : 1 : FAIL :" prefix, no C++
    source locations, no temporary file names of the quantizer, whitespace collapsed, and cut at a word
    boundary (with an ellipsis) when longer than `limit`."""
    text = " ".join(_TEMP_MODEL.sub("", _CPP_LOCATION.sub("", _ORT_PREFIX.sub("", text))).split())
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    return (cut[:cut.rindex(" ")] if " " in cut else cut) + "…"


def _gib(n: int) -> str:
    return f"{n / 1024**3:g} GiB" if n else "no"


def _code(value: str, fallback: Err) -> Err:
    try:
        return Err(value)
    except ValueError:
        return fallback


def _child_env(limits: ChildLimits) -> dict[str, str]:
    """Besides the sandbox's minimal environment: the memory limit (for the child's own message) and the
    native libraries' search path. No secrets of the worker reach a tool."""
    env = {"FLEETFORGE_CHILD_MEMORY_BYTES": str(limits.memory_bytes)}
    if "LD_LIBRARY_PATH" in os.environ:
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return env


# ---- the child side ---------------------------------------------------------------------------


def _child_main(work: Path) -> NoReturn:
    import faulthandler

    faulthandler.enable()  # a native crash prints the Python frame that was running (log_tail keeps it)
    die_with_parent()
    request = json.loads((work / "request.json").read_text())
    fallback = request.get("fallback", Err.EXECUTOR_ERROR.value)
    module_name, _, fn_name = request["target"].partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
        reply: dict[str, Any] = {"ok": fn(**request["args"])}
    except FleetforgeError as e:
        reply = {"error": {"code": e.code.value, "message": e.message}}
    except MemoryError:
        limit = int(os.environ.get("FLEETFORGE_CHILD_MEMORY_BYTES", "0"))
        reply = {"error": {"code": fallback, "message": f"ran out of memory (limit {_gib(limit)})"}}
    except Exception as e:  # a library's own error: one line, the exception type when it has no message
        text = tidy(str(e)) or type(e).__name__
        reply = {"error": {"code": fallback, "message": text}}
    tmp = work / "reply.json.tmp"
    tmp.write_text(json.dumps(reply, default=str))
    tmp.replace(work / "reply.json")
    exit_now(0)


if __name__ == "__main__":
    _child_main(Path(sys.argv[1]))
