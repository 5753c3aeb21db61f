"""The lowering tests' harness: a case is a tiny KernelBench-format task (`Model.forward` returning one expression
over inputs sized by N). Each case is traced at N=7, lowered and rendered, then the candidate runs under the Triton
interpreter against the reference at N=7 and at N=10 (sizes the trace never saw: no traced size may be baked in),
all cases of a test module in one child process (torch and triton imported once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from activities.kernels import compiler
from activities.kernels.compiler.graph import packet
from contracts.kernel_job import ReferenceAnalysis

ROOT = Path(__file__).resolve().parents[3]
TRACED_N, OTHER_N = 7, 10

TASK = '''import math
import torch
import torch.nn as nn
import torch.nn.functional as F

N = {n}
{helpers}

class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, {args}):
        return {body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''


@dataclass(frozen=True)
class Case:
    """`body`: what forward returns; `inputs`: get_inputs' list (sizes written with N); `init`: __init__ lines;
    `helpers`: module-level code before Model (helper modules and functions the model uses); `concrete`: traced
    with concrete sizes, as the probe does when the symbolic trace fails (the lowerings of that trace's ops)."""

    body: str
    inputs: str
    args: str = "x"
    init: tuple[str, ...] = ()
    helpers: str = ""
    concrete: bool = False


def source(case: Case, n: int) -> str:
    init = "\n".join("        " + line for line in case.init) or "        pass"
    return TASK.format(n=n, init=init, args=case.args, body=case.body, inputs=case.inputs,
                       helpers=f"\n\n{case.helpers.strip()}\n\n" if case.helpers else "")


def analyse(src: str, folder: Path, *, concrete: bool = False) -> ReferenceAnalysis:
    """The task traced in this process (the job traces in a sandboxed child)."""
    from activities.kernels._probe import probe

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.py").write_text(src)
    return ReferenceAnalysis.model_validate(probe(str(folder / "task.py"), 0, symbolic=not concrete))


def lowered(case: Case, folder: Path) -> compiler.Graph:
    """The case traced at N=7 and lowered (the test fails where the compiler refuses it)."""
    graph = compiler.lower(analyse(source(case, TRACED_N), folder, concrete=case.concrete))
    assert not isinstance(graph, str), graph
    return graph


def candidate(case: Case, folder: Path) -> str:
    return compiler.render(lowered(case, folder), source(case, TRACED_N))


def traced_ops(case: Case, folder: Path) -> set[str]:
    return {packet(c.op) for c in analyse(source(case, TRACED_N), folder, concrete=case.concrete).calls}


RUNNER = '''
import importlib.util, json, pathlib, sys, torch
from activities.kernels._child import skip_unasserted_overflow_checks
skip_unasserted_overflow_checks()  # as the verifier's candidate child does
results = {}
for folder in sys.argv[1:]:
    def load(p, n):
        s = importlib.util.spec_from_file_location(n, p); m = importlib.util.module_from_spec(s); s.loader.exec_module(m)
        return m
    key = folder.rsplit("/", 1)[1]
    notes = []
    try:
        cand = load(folder + "/candidate.py", "cand_" + key)
        for task_file in ["task.py"] + sorted(f.name for f in pathlib.Path(folder).glob("size_*.py")):
            t = load(folder + "/" + task_file, "task_" + key + task_file[:-3])
            torch.manual_seed(0); ref = t.Model(*t.get_init_inputs())
            torch.manual_seed(0); new = cand.ModelNew(*t.get_init_inputs())
            torch.manual_seed(1); inputs = t.get_inputs()
            with torch.no_grad():
                torch.manual_seed(2); e = ref(*inputs)
                torch.manual_seed(2); g = new(*inputs)
            es, gs = (list(e) if isinstance(e, (tuple, list)) else [e]), (list(g) if isinstance(g, (tuple, list)) else [g])
            for k, (e, g) in enumerate(zip(es, gs)):
                if e.shape != g.shape or e.dtype != g.dtype:
                    notes.append(f"{task_file}[{k}]: {tuple(g.shape)} {g.dtype} vs {tuple(e.shape)} {e.dtype}")
                elif not (torch.allclose(g, e, rtol=1e-4, atol=1e-4, equal_nan=True) if e.is_floating_point() else torch.equal(g, e)):
                    notes.append(f"{task_file}[{k}]: max err {float((g.double() - e.double()).abs().max())}")
            if len(es) != len(gs):
                notes.append(f"{task_file}: {len(gs)} outputs vs {len(es)}")
    except Exception as ex:
        notes.append(f"{type(ex).__name__}: {ex}"[:400])
    results[key] = notes
print(json.dumps(results))
'''


def run(cases: dict[str, Case], root: Path, sizes: tuple[int, ...] = (OTHER_N,), *,
        keyed_by_op: bool = True) -> dict[str, list[str]]:
    """Every case rendered at N=7 and run at N=7 and at `sizes` in one interpreter child: key -> problems ([] = right).
    `keyed_by_op`: a case whose trace does not contain its op (the key up to ':') fails (it would test another
    lowering)."""
    problems: dict[str, list[str]] = {}
    folders = []
    for key, case in cases.items():
        folder = root / key.replace(":", "__")
        try:
            (folder / "candidate.py").parent.mkdir(parents=True, exist_ok=True)
            (folder / "candidate.py").write_text(candidate(case, folder))
        except AssertionError as e:
            problems[key] = [f"not lowered: {e}"]
            continue
        op = key.split(":")[0]
        if keyed_by_op and op not in traced_ops(case, folder):
            problems[key] = [f"the case's trace has no aten.{op}: {sorted(traced_ops(case, folder))}"]
            continue
        for n in sizes:
            (folder / f"size_{n}.py").write_text(source(case, n))
        folders.append(str(folder))
    ran = interpreted(RUNNER, *folders, timeout=1200, cwd=root)
    return {**problems, **{k.replace("__", ":"): v for k, v in ran.items()}}


def interpreted(script: str, *args: str, timeout: float = 300, cwd: Path | None = None) -> Any:
    """What `python -c script *args` prints as JSON on its last line, run in a child under the Triton interpreter
    (no GPU, the repository importable); the child must exit 0."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
