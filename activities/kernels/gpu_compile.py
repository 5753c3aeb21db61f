"""Do a candidate's kernels compile for the job's GPU? Answered on a CPU worker, without a GPU.

The verifier runs a candidate under the Triton interpreter, which accepts kernels the GPU compiler refuses (a
loop-carried value whose type changes, a `tl.dot` tile under 16) or the GPU cannot launch (more shared memory than
the SM has): on 2026-11-24, 26 of 39 CPU-verified kernels failed to compile on an H100 for such reasons. So a
candidate is checked here too, at the task's own sizes, in a sandboxed child (`spawn`: the candidate may be an
LLM's) that the verifier starts beside its own children and whose answer counts only for a candidate right on
every run (one that is not is killed with it):

1. its forward runs once on the meta device (shapes, no data) with every launch recorded instead of run, so its
   launchers choose what they would on a GPU;
2. each launched kernel is compiled for the GPU's compute capability (`triton.compile` with a `GPUTarget`: Triton's
   own ptxas makes the cubin, no driver needed), and its shared memory compared with what one program may use.

A compiler error or too much shared memory is the candidate's (`GpuCompileCheck.compiles` False); a forward that
cannot run on the meta device (it reads a tensor's values) or a worker whose compiler cannot start leaves the
question open (None, with why). It says nothing about speed. The candidate's code runs in the child that reports,
so this catches a kernel's mistake, not a candidate written to forge the report (advisory, as the decoy check is).

`python -m activities.kernels.gpu_compile --gpu h100 DIR` is the child (DIR holds task.py and candidate.py; it
writes RESULT_FILE there); `bench/gpu_compile.py` runs it over bench folders.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from activities.kernels.gpus import GPUS, GpuSpec
from contracts.kernel_job import GpuCompileCheck

if TYPE_CHECKING:
    from activities.kernels._proc import Child

RESULT_FILE = "gpu_compile.json"
MEMORY_BYTES = 4 * 1024**3
"""The check's address-space limit (RLIMIT_AS), half the verifier children's: it runs beside them on the meta device,
so it holds no tensor. Measured on 2026-12-07: 310-405 MB peak RSS, and it compiles attention, conv and
GEMM+epilogue kernels under a 1 GiB limit."""
CHILD_TIMEOUT_S = 600.0
"""The whole check's wall-clock limit: a torch import, a meta forward, and ptxas for each kernel (0.3-1 s apiece on
a build machine's core)."""
OPTIONS = ("num_warps", "num_stages")
"""Launch keywords that are compile options, not kernel arguments."""
DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
          "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}
META_FORWARD = "(the candidate's forward on the meta device)"
NOTE_CHARS = 1000
"""The most of a compiler message a report carries (it goes to the coder's prompt and the history)."""


def check(folder: Path, gpu: GpuSpec, beat: Callable[[str], None]) -> GpuCompileCheck:
    """The candidate in `folder` compiled for `gpu`, in the kernels activity's sandboxed child (its scratch dir is
    `folder`)."""
    return result(folder, gpu, start(folder, gpu), beat)


def start(folder: Path, gpu: GpuSpec) -> Child:
    """The check's child for the candidate in `folder` (task.py, candidate.py), started now: the verifier starts it
    beside the verification's own children, since it needs only the sources. `result` waits for it."""
    from activities.kernels._proc import spawn

    (folder / RESULT_FILE).unlink(missing_ok=True)
    return spawn("activities.kernels.gpu_compile", folder, ["--gpu", _name(gpu), "."], gpu=False,
                 timeout_s=CHILD_TIMEOUT_S, memory_bytes=MEMORY_BYTES)


def result(folder: Path, gpu: GpuSpec, child: Child, beat: Callable[[str], None]) -> GpuCompileCheck:
    """The verdict of the check `child` (from `start`) on the candidate in `folder`, waiting for it as long as
    CHILD_TIMEOUT_S from its start."""
    from activities.kernels._proc import wait_all

    done = wait_all({"gpu_compile": child}, CHILD_TIMEOUT_S, beat)["gpu_compile"]
    if done.error or not (folder / RESULT_FILE).is_file():
        why = f"not checked: the compile check's child {done.error or 'wrote no result'}: {done.log_excerpt[-300:]}"
        return GpuCompileCheck(target=target(gpu), compiles=None, note=why.strip(": "))
    try:  # written by a process that ran the candidate's code: read as untrusted
        return summarize(gpu, json.loads((folder / RESULT_FILE).read_text(encoding="utf-8", errors="replace")))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return GpuCompileCheck(target=target(gpu), compiles=None,
                               note=f"not checked: the compile check's result is unreadable ({type(e).__name__})")


def target(gpu: GpuSpec) -> str:
    return f"sm_{gpu.compute_capability} ({gpu.name})"


def summarize(gpu: GpuSpec, results: list[dict]) -> GpuCompileCheck:
    """One verdict from the per-kernel results: the first failing kernel decides; an unchecked one leaves it open."""
    shared = max((r.get("shared_bytes", 0) for r in results), default=0)
    kernels = sorted({r["kernel"] for r in results if r["kernel"] != META_FORWARD})
    for r in results:
        if r["ok"] is False:
            return GpuCompileCheck(target=target(gpu), compiles=False, kernels=kernels, max_shared_bytes=shared,
                                   note=f"kernel {r['kernel']}: {r['error']}"[:NOTE_CHARS])
    unchecked = [r for r in results if r["ok"] is None]
    if unchecked:
        return GpuCompileCheck(target=target(gpu), compiles=None, kernels=kernels, max_shared_bytes=shared,
                               note=f"not checked: {unchecked[0]['kernel']}: {unchecked[0]['error']}"[:NOTE_CHARS])
    if not results:
        return GpuCompileCheck(target=target(gpu), compiles=None, note="not checked: the forward launched no kernel")
    return GpuCompileCheck(target=target(gpu), compiles=True, kernels=kernels, max_shared_bytes=shared)


# --- the child ------------------------------------------------------------------------------


def _name(gpu: GpuSpec) -> str:
    return next(key for key, spec in GPUS.items() if spec == gpu)


def _type(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return "*" + DTYPES[str(value.dtype).removeprefix("torch.")]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"a launch argument of type {type(value).__name__}")


def record(folder: Path) -> list[dict]:
    """Every distinct launch the candidate's forward makes on a GPU, found without one: the model and the task's
    inputs on the meta device (shapes and dtypes, no data), `JITFunction.run` recording each launch instead of
    running it, so the launchers pick their GPU block sizes. Kernel name, signature, constexprs, compile options."""
    import torch
    from triton.runtime.jit import JITFunction

    from activities.kernels._child import _load  # the one way a kernels child imports a task or candidate file

    seen: dict[str, dict] = {}
    original = JITFunction.run

    def run(fn: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        params = inspect.signature(fn.fn).parameters
        values = dict(zip(fn.arg_names, args)) | {k: v for k, v in kwargs.items() if k not in OPTIONS}
        options = {k: v for k, v in kwargs.items() if k in OPTIONS}
        signature, constexprs = {}, {}
        for name, value in values.items():
            if "constexpr" in str(params[name].annotation) or value is None or (type(value) is int and value == 1):
                # an integer argument equal to 1 is specialised as a constant by Triton's launcher too
                signature[name], constexprs[name] = "constexpr", value
            else:
                signature[name] = _type(value)
        key = json.dumps([fn.__name__, signature, constexprs, options], sort_keys=True, default=str)
        seen.setdefault(key, {"kernel": fn.__name__, "signature": signature, "constexprs": constexprs,
                              "options": options})

    JITFunction.run = run
    try:
        task = _load(str(folder / "task.py"), "gpu_task")
        cand = _load(str(folder / "candidate.py"), "gpu_candidate")
        torch.manual_seed(0)
        with torch.device("meta"):  # no data at any size: a task at a GPU's sizes would not fit in host memory
            model = cand.ModelNew(*task.get_init_inputs())
            inputs = task.get_inputs()
        with torch.no_grad():
            model(*inputs)
    finally:
        JITFunction.run = original
    return list(seen.values())


def compile_for(launches: list[dict], gpu: GpuSpec) -> list[dict]:
    """Each recorded launch's kernel compiled for `gpu`, its shared memory checked against the GPU's: one result
    per launch, `ok` True, False (the kernel's fault) or None (the compiler could not start here)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module = sys.modules["gpu_candidate"]
    results = []
    for launch in launches:
        try:
            src = ASTSource(getattr(module, launch["kernel"]), signature=launch["signature"],
                            constexprs=launch["constexprs"])
            compiled = triton.compile(src, target=GPUTarget("cuda", gpu.compute_capability, 32),
                                      options=launch["options"])
        except OSError as e:  # ptxas missing or not executable: the worker's, not the kernel's
            results.append({**launch, "ok": None, "error": f"the GPU compiler could not run here: {e}"})
            continue
        except Exception as e:  # noqa: BLE001 - a compile error is the finding
            results.append({**launch, "ok": False, "error": f"{type(e).__name__}: {str(e).strip()[-600:]}"})
            continue
        shared = compiled.metadata.shared
        fits = shared <= gpu.shared_bytes
        results.append({**launch, "ok": fits, "shared_bytes": shared,
                        **({} if fits else {"error": f"needs {shared:,} bytes of shared memory a program, and "
                                                     f"sm_{gpu.compute_capability} allows {gpu.shared_bytes:,}: "
                                                     "smaller blocks or fewer num_stages"})})
    return results


def _child(folder: Path, gpu: GpuSpec) -> list[dict]:
    os.environ["TRITON_INTERPRET"] = "0"  # the sandbox's CPU children interpret; this one compiles GPU code
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said so it does not warn
    try:
        launches = record(folder)
    except Exception as e:  # noqa: BLE001 - a forward that reads values cannot run on the meta device: open
        return [{"kernel": META_FORWARD, "ok": None, "error": f"{type(e).__name__}: {str(e)[-400:]}"}]
    return compile_for(launches, gpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the sandboxed child of the GPU compile check")
    parser.add_argument("folder", type=Path, help="holds task.py and candidate.py; gets " + RESULT_FILE)
    parser.add_argument("--gpu", choices=sorted(GPUS), required=True)
    args = parser.parse_args(argv)
    results = _child(args.folder, GPUS[args.gpu])
    (args.folder / RESULT_FILE).write_text(json.dumps(results, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
