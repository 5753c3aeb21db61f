"""Do a candidate's kernels compile for a GPU? Answered without one: `python -m bench.gpu_compile DIR... [--arch 90]`.

Each DIR holds `task.py` and `candidate.py` (a bench workdir's recheck/ folders, or the rewrite tests' cases). The
candidate's forward runs once on the meta device (shapes, no data) with every launch recorded instead of run, so its
launchers choose what they would on a GPU; each launched kernel is then compiled for the target (`triton.compile`
with a `GPUTarget`: Triton's own ptxas makes the cubin, no driver needed). The interpreter
accepts kernels the GPU compiler refuses (a loop-carried value whose type changes, a `tl.dot` tile under 16) or the
GPU cannot launch (more shared memory than the SM has): on 2026-11-24, 26 of 39 CPU-verified kernels failed to
compile on an H100 for such reasons. This catches those here, at the task's own sizes; it says nothing about speed.

Each folder is checked in the kernels activity's sandboxed child (a candidate may be an LLM's). Prints one line per
kernel and a JSON summary; exit code 1 when any kernel fails to compile.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

from activities.kernels._child import _load  # the one way a kernels child imports a task or candidate file

SHARED_LIMIT = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448, 100: 232_448}
"""Shared memory one program may use, by compute capability (CUDA's opt-in maximum per block): A100, RTX 30xx,
L40S, H100, B200. A kernel that needs more compiles, then fails at launch."""
RESULT_FILE = "gpu_compile.json"
CHILD_TIMEOUT_S = 900.0
OPTIONS = ("num_warps", "num_stages")
"""Launch keywords that are compile options, not kernel arguments."""
DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
          "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


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

    seen: dict[str, dict] = {}
    original = JITFunction.run

    def run(fn: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        params = inspect.signature(fn.fn).parameters
        values = dict(zip(fn.arg_names, args)) | {k: v for k, v in kwargs.items() if k not in OPTIONS}
        options = {k: v for k, v in kwargs.items() if k in OPTIONS}
        signature, constexprs = {}, {}
        for name, value in values.items():
            if "constexpr" in str(params[name].annotation) or value is None:
                signature[name], constexprs[name] = "constexpr", value
            else:
                signature[name] = _type(value)
        key = json.dumps([fn.__name__, signature, constexprs, options], sort_keys=True, default=str)
        seen.setdefault(key, {"kernel": fn.__name__, "signature": signature, "constexprs": constexprs,
                              "options": options})

    JITFunction.run = run
    try:
        task = _load(str(folder / "task.py"), f"task_{folder.name}")
        cand = _load(str(folder / "candidate.py"), f"gpu_{folder.name}")
        torch.manual_seed(0)
        model = cand.ModelNew(*task.get_init_inputs()).to("meta")
        inputs = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
        with torch.no_grad():
            model(*inputs)
    finally:
        JITFunction.run = original
    return list(seen.values())


def compile_for(folder: Path, launches: list[dict], arch: int) -> list[dict]:
    """Compile each recorded launch's kernel for sm_<arch> and check its shared memory against the target's: one
    result per launch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    gpu = sys.modules[f"gpu_{folder.name}"]
    results = []
    for launch in launches:
        try:
            src = ASTSource(getattr(gpu, launch["kernel"]), signature=launch["signature"],
                            constexprs=launch["constexprs"])
            compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=launch["options"])
            shared, limit = compiled.metadata.shared, SHARED_LIMIT.get(arch, 101_376)
            results.append({**launch, "ok": shared <= limit, "shared_bytes": shared,
                            **({} if shared <= limit else {"error": f"needs {shared:,} bytes of shared memory; "
                                                                    f"sm_{arch} allows {limit:,}"})})
        except Exception as e:  # noqa: BLE001 - a compile error is the finding
            results.append({**launch, "ok": False, "error": f"{type(e).__name__}: {str(e).strip()[-600:]}"})
    return results


def check(folder: Path, arch: int) -> list[dict]:
    """The candidate's GPU launches compiled for sm_<arch> (in this process: it must not be interpreting)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("run without TRITON_INTERPRET: the kernels must be GPU code")
    try:
        launches = record(folder)
    except Exception as e:  # noqa: BLE001 - the forward itself failed on the meta device: say so
        return [{"kernel": "(the candidate's forward on the meta device)", "ok": False,
                 "error": f"{type(e).__name__}: {str(e)[-600:]}"}]
    return compile_for(folder, launches, arch)


def in_sandbox(folder: Path, arch: int) -> list[dict]:
    """`check` in the kernels activity's sandboxed child (activities/kernels/_proc.py), the folder its scratch dir:
    the candidate may be an LLM's, and its code runs nowhere else."""
    from activities.kernels._proc import spawn, wait_all

    (folder / RESULT_FILE).unlink(missing_ok=True)
    child = spawn("bench.gpu_compile", folder, ["--child", "--arch", str(arch), "."], gpu=False,
                  timeout_s=CHILD_TIMEOUT_S)
    done = wait_all({"compile": child}, CHILD_TIMEOUT_S, lambda _msg: None)["compile"]
    if done.error:
        return [{"kernel": "(the sandboxed child)", "ok": False, "error": f"{done.error}: {done.log_excerpt[-400:]}"}]
    return json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders holding task.py and candidate.py")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (90: H100, 80: A100)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # the sandboxed child's part
    args = parser.parse_args(argv)
    if args.child:
        os.environ["TRITON_INTERPRET"] = "0"  # the sandbox's CPU children interpret; this one compiles GPU code
        results = check(args.folders[0], args.arch)
        (args.folders[0] / RESULT_FILE).write_text(json.dumps(results, default=str), encoding="utf-8")
        return 0
    summary = {}
    for folder in args.folders:
        results = in_sandbox(folder.resolve(), args.arch)
        summary[folder.name] = [r.get("error", "") for r in results if not r["ok"]]
        for r in results:
            said = " | ".join(r.get("error", "").split("\n"))[:300]
            print(f"{folder.name:50} {r['kernel']:40} {'ok' if r['ok'] else 'FAILED: ' + said}")
    print(json.dumps(summary))
    return 1 if any(summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
