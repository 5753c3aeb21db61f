"""activities/kernels/gpu_compile.py: a candidate's kernels compiled for a GPU without one. Through bench/gpu_compile:
the optimizer's attention kernel at a head dim of 128 and its persistent GRU compile for an L40S (sm_89, 99 KB of
shared memory a program) with the block sizes their launchers pick on a GPU; a kernel the interpreter runs but the GPU
compiler refuses is reported. Through the verifier: such a kernel is rejected, one that compiles says for which GPU,
and a forward the meta device cannot run leaves the question open, not the verdict."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

from activities.kernels import compiler
from activities.kernels.gpus import GPUS
from activities.kernels.optimizer import REWRITES, load
from activities.kernels.verifier import verify
from tests.unit.compiler.cases import analyse

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
GRU_256 = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(128, 256, 2, bidirectional=True)

    def forward(self, x, h0):
        return self.gru(x, h0)[0]


def get_inputs():
    return [torch.randn(4, 2, 128), torch.randn(4, 2, 256)]


def get_init_inputs():
    return []
'''
"""KernelBench Level 3's hidden size: h @ W_hh^T as one register tile needed 272 KB of shared memory a program."""
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
    return subprocess.run([sys.executable, "-m", "bench.gpu_compile", "--gpu", "l40s", *map(str, folders)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_the_attention_and_persistent_rnn_kernels_compile_for_an_l40s(tmp_path):
    folders = [_folder(tmp_path, "sdpa", SDPA_128, _rewritten(SDPA_128, "attention", tmp_path / "t1")),
               _folder(tmp_path, "gru", GRU_256, _rewritten(GRU_256, "recurrent", tmp_path / "t2"))]
    done = _check(*folders)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "attention_" in done.stdout and "rnn_stack_" in done.stdout


def test_a_kernel_the_gpu_compiler_refuses_is_reported(tmp_path):
    done = _check(_folder(tmp_path, "widen", TASK, LOOP_TYPE_CHANGES))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "widen_kernel" in done.stdout and "Loop-carried variable r" in done.stdout


COPY_WITH_A_TYPE_CHANGE = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.int32)
    for _ in range(0, 1):
        acc = tl.load(x_ptr + offs, mask=offs < n)  # int32 -> float32 in the loop: right on the interpreter only
    tl.store(y_ptr + offs, OUTPUT, mask=offs < n)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        copy_kernel[(triton.cdiv(n, 64),)](x, out, n, BLOCK=64)
        if READS_A_VALUE:
            float(x[0])  # a value read on the host: cannot run on the meta device
        return out
'''


def copy_kernel(*, type_change: bool, reads_a_value: bool = False, relu: bool = False) -> str:
    """A copy (or ReLU) candidate; `type_change`: right on the interpreter, refused by the GPU compiler."""
    src = COPY_WITH_A_TYPE_CHANGE.replace("READS_A_VALUE", str(reads_a_value))
    src = src.replace("OUTPUT", "tl.maximum(acc, 0.0)" if relu else "acc")
    return src if type_change else src.replace("acc = tl.zeros((BLOCK,), tl.int32)", "acc = tl.zeros((BLOCK,), tl.float32)")


def test_the_verifier_rejects_a_kernel_right_on_the_interpreter_that_the_gpu_compiler_refuses():
    report = verify(TASK, copy_kernel(type_change=True), timeout_s=120, compile_for=GPUS["h100"])
    assert not report.passed
    assert report.reason.startswith("does not compile for sm_90 (H100 SXM5 80GB): kernel copy_kernel: ")
    assert "Loop-carried variable acc" in report.reason and "the interpreter accepts" in report.reason
    assert report.gpu_compile is not None and report.gpu_compile.compiles is False
    assert verify(TASK, copy_kernel(type_change=True), timeout_s=120).passed  # the interpreter alone accepts it


def test_a_kernel_that_compiles_is_verified_and_says_for_which_gpu():
    report = verify(TASK, copy_kernel(type_change=False), timeout_s=120, compile_for=GPUS["a100"])
    assert report.passed, report.reason
    check = report.gpu_compile
    assert check is not None and check.compiles is True and check.kernels == ["copy_kernel"]
    assert check.summary.startswith("compiles for sm_80 (A100 SXM4 80GB) (1 kernel(s)")
    assert verify(TASK, copy_kernel(type_change=False), timeout_s=120).gpu_compile is None  # asked for no GPU


def test_a_forward_that_reads_values_leaves_the_question_open_not_the_verdict():
    report = verify(TASK, copy_kernel(type_change=True, reads_a_value=True), timeout_s=120, compile_for=GPUS["h100"])
    assert report.passed, report.reason  # the meta device cannot run it: not the candidate's failure
    assert report.gpu_compile is not None and report.gpu_compile.compiles is None
    assert "not checked" in report.gpu_compile.summary and "meta" in report.gpu_compile.summary


def test_a_result_the_child_could_have_forged_into_nonsense_leaves_the_question_open(tmp_path, monkeypatch):
    """The child ran the candidate's code, so its result file is read as untrusted: garbage is 'not checked'."""
    from activities.kernels import gpu_compile

    class Done:
        error, log_excerpt = None, ""

    def fake_spawn(*_args, **_kwargs):  # the child "ran" and left this behind
        (tmp_path / gpu_compile.RESULT_FILE).write_text('[{"no kernel": 1}]')

    monkeypatch.setattr("activities.kernels._proc.spawn", fake_spawn)
    monkeypatch.setattr("activities.kernels._proc.wait_all", lambda children, *_a: {"gpu_compile": Done()})
    check = gpu_compile.check(tmp_path, GPUS["h100"], lambda _msg: None)
    assert check.compiles is None and "unreadable (KeyError)" in check.note


def test_the_check_runs_beside_the_verification_and_dies_with_a_wrong_candidate(monkeypatch):
    """The check needs only the sources, so it starts before the verifier waits for its children; a candidate that
    is wrong gets no compile verdict, and nothing of its check is left running."""
    from activities.kernels import gpu_compile, verifier

    events: list[str] = []
    started: list = []
    start, wait_all = gpu_compile.start, verifier.wait_all

    def recorded_start(folder, gpu):
        events.append("compile check started")
        started.append(start(folder, gpu))
        return started[-1]

    def recorded_wait(children, *args, **kwargs):
        events.append("waited for " + "+".join(sorted(children)))
        return wait_all(children, *args, **kwargs)

    monkeypatch.setattr(gpu_compile, "start", recorded_start)
    monkeypatch.setattr(verifier, "wait_all", recorded_wait)
    fresh = f"\n# {os.getpid()}-{id(events)}: not in the verifier's reference and compile caches\n"
    task = TASK + fresh
    right = verify(task, copy_kernel(type_change=False) + fresh, timeout_s=120, compile_for=GPUS["h100"])
    assert right.passed and right.gpu_compile is not None and right.gpu_compile.compiles is True, right.reason
    assert events == ["compile check started", "waited for candidate+reference"], events
    assert started[-1].limits.memory_bytes == gpu_compile.MEMORY_BYTES < verifier.MEMORY_LIMIT_BYTES, \
        "the twin holds no tensor: less address space than the verification's children"

    events.clear()
    wrong = verify(task, copy_kernel(type_change=False, relu=True) + fresh, timeout_s=120, compile_for=GPUS["h100"])
    assert not wrong.passed and "differ" in wrong.reason and wrong.gpu_compile is None, wrong.reason
    assert events[:2] == ["compile check started", "waited for candidate"], events  # the task's reference: cached
    assert started[-1].proc.poll() is not None, "the wrong candidate's compile check outlived its verdict"


def test_a_check_stopped_for_a_reference_run_alone_is_started_again_when_its_answer_is_owed(tmp_path):
    """A reference that failed beside the candidate's check is run again alone (the check stopped: a hostile twin
    could have starved it); when the reference then passes and the candidate is right, the check is still owed."""
    from activities.kernels.verifier import _CompileCheck

    fresh = f"\n# {os.getpid()}-{id(tmp_path)}: not in the verifier's compile cache\n"
    check = _CompileCheck.start(tmp_path, GPUS["h100"], TASK, copy_kernel(type_change=False) + fresh)
    first = check.child
    check.stop()
    assert first is not None and first.proc.poll() is not None and check.stopped
    answer = check.result(lambda _msg: None)
    assert answer.compiles is True and check.child is not first, answer.note
    check.stop()  # the verifier's exit stops it again: nothing left to kill
