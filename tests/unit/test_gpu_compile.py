"""bench/gpu_compile.py: a candidate's kernels compiled for a GPU without one. The optimizer's attention kernel at a
head dim of 128 and its persistent GRU compile for an L40S (sm_89, 99 KB of shared memory a program) with the block
sizes their launchers pick on a GPU; a kernel the interpreter runs but the GPU compiler refuses is reported."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

from activities.kernels import compiler
from activities.kernels.optimizer import REWRITES, load
from tests.unit.compiler.cases import TRACED_N, analyse, source
from tests.unit.test_optimizer_rewrites import CASES

ROOT = Path(__file__).resolve().parents[2]
load()
SDPA_128 = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    return [torch.randn(1, 2, 48, 128) for _ in range(3)]


def get_init_inputs():
    return []
'''
LOOP_TYPE_CHANGES = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def widen_kernel(x_ptr, n, BLOCK: tl.constexpr):
    r = tl.arange(0, 32)
    for i in range(0, n, BLOCK):
        r = tl.arange(0, 64)  # a loop-carried value whose type changes: the interpreter runs it, the compiler refuses
    tl.store(x_ptr + r, r.to(tl.float32))


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty(64, device=x.device)
        widen_kernel[(1,)](out, 64, BLOCK=32)
        return out
'''
TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
'''


def _folder(root: Path, name: str, task: str, candidate: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "task.py").write_text(task)
    (folder / "candidate.py").write_text(candidate)
    return folder


def _rewritten(task: str, rewrite: str, folder: Path) -> str:
    graph = REWRITES[rewrite].fn(copy.deepcopy(compiler.lower(analyse(task, folder))))
    assert graph is not None
    return compiler.render(graph, task)


def _check(*folders: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", TRITON_DEFAULT_FP_FUSION="1")
    return subprocess.run([sys.executable, "-m", "bench.gpu_compile", "--arch", "89", *map(str, folders)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_the_attention_and_persistent_rnn_kernels_compile_for_an_l40s(tmp_path):
    gru = source(CASES["recurrent: a 2-layer bidirectional GRU"][1], TRACED_N)
    folders = [_folder(tmp_path, "sdpa", SDPA_128, _rewritten(SDPA_128, "attention", tmp_path / "t1")),
               _folder(tmp_path, "gru", gru, _rewritten(gru, "recurrent", tmp_path / "t2"))]
    done = _check(*folders)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "attention_" in done.stdout and "rnn_persistent_kernel" in done.stdout


def test_a_kernel_the_gpu_compiler_refuses_is_reported(tmp_path):
    done = _check(_folder(tmp_path, "widen", TASK, LOOP_TYPE_CHANGES))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "widen_kernel" in done.stdout and "Loop-carried variable r" in done.stdout
