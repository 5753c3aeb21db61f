"""static_check: pure-ast screening of candidate Triton sources (nothing is executed)."""

from __future__ import annotations

import pytest

from activities.kernels.static_checks import static_check

GOOD = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n = x.numel()
        grid = (triton.cdiv(n, 1024),)
        relu_kernel[grid](x, y, n, BLOCK=1024)
        return y
'''

GOOD_VIA_HELPER = '''
import torch
import triton
import triton.language as tl
from triton import jit


@triton.autotune(configs=[], key=["n"])
@jit
def add_kernel(a, b, out, n, BLOCK: tl.constexpr):
    pass


def launch(a, b):
    out = torch.empty_like(a)
    add_kernel[lambda meta: (triton.cdiv(a.numel(), meta["BLOCK"]),)](a, b, out, a.numel())
    return out


class ModelNew(torch.nn.Module):
    def _run(self, a, b):
        return launch(a, b)

    def forward(self, a, b):
        return self._run(a, b)
'''

TORCH_ONLY = '''
import torch
import triton


@triton.jit
def unused_kernel(x_ptr):
    pass


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
'''


def test_accepts_a_correct_triton_source():
    report = static_check(GOOD)
    assert report.ok and report.reasons == []


def test_accepts_a_launch_through_a_helper_and_bare_jit_import():
    assert static_check(GOOD_VIA_HELPER).ok


PASSED_LAUNCHER = '''
import torch
import triton
import triton.language as tl


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def _steps(x):
    add_one[(1,)](x, x.numel(), BLOCK=1024)


def _each_layer(x, layers, run):
    for _ in range(layers):
        run(x)
    return x


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return _each_layer(x.clone(), 2, {run})
'''


def test_accepts_a_launch_through_a_function_passed_to_a_helper_and_rejects_a_passed_one_that_launches_nothing():
    """A launcher passed as a callback is a launch: the check must not refuse a candidate written that way."""
    assert static_check(PASSED_LAUNCHER.format(run="_steps")).ok
    assert static_check(PASSED_LAUNCHER.format(run="run=_steps")).ok
    report = static_check(PASSED_LAUNCHER.format(run="torch.relu"))
    assert any("launches no @triton.jit kernel" in r for r in report.reasons)


def test_rejects_torch_only_model_new_even_with_an_unused_kernel():
    report = static_check(TORCH_ONLY)
    assert not report.ok
    assert any("launches no @triton.jit kernel" in r for r in report.reasons)


def test_rejects_a_source_without_any_triton_kernel():
    src = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
    report = static_check(src)
    assert not report.ok and any("no '@triton.jit' kernel" in r for r in report.reasons)


def test_rejects_missing_model_new_and_missing_forward():
    assert static_check(GOOD.replace("class ModelNew", "class Model")).reasons == ["no top-level 'class ModelNew'"]
    no_forward = GOOD.replace("def forward(", "def run(")
    assert static_check(no_forward).reasons == ["ModelNew has no 'forward' method"]


def test_rejects_syntax_errors_with_the_line():
    report = static_check("def broken(:\n    pass\n")
    assert not report.ok and report.reasons[0].startswith("syntax error at line 1")


@pytest.mark.parametrize(
    ("snippet", "needle"),
    [
        ("import os", "import 'os' is not allowed"),
        ("import subprocess", "import 'subprocess' is not allowed"),
        ("import os.path as osp", "import 'os.path' is not allowed"),
        ("from subprocess import run", "import 'subprocess' is not allowed"),
        ("import socket", "import 'socket' is not allowed"),
        ("import ctypes", "import 'ctypes' is not allowed"),
        ("import sys", "import 'sys' is not allowed"),
        ("import shutil", "import 'shutil' is not allowed"),
        ("from importlib import import_module", "import 'importlib' is not allowed"),
        ("import builtins", "import 'builtins' is not allowed"),
        ("import pathlib", "import 'pathlib' is not allowed"),
        ("import io", "import 'io' is not allowed"),
        ("import numpy as np", "import 'numpy' is not allowed"),
        ("import pickle", "import 'pickle' is not allowed"),
        ("import urllib.request", "import 'urllib.request' is not allowed"),
        ("from . import helper", "import '.' is not allowed"),
        ("from torch.utils.cpp_extension import load_inline", "import 'torch.utils.cpp_extension' is not allowed"),
        ("from torch import hub", "import 'torch.hub' is not allowed"),
        ("import torch.multiprocessing", "import 'torch.multiprocessing' is not allowed"),
        ("torch.save(torch.ones(1), 'x.pt')", "'torch.save' is not allowed"),
        ("t = torch.load('x.pt', weights_only=False)", "'torch.load' is not allowed"),
        ("torch.ops.load_library('evil.so')", "'torch.ops.load_library' is not allowed"),
        ("m = __import__('os')", "forbidden call '__import__()'"),
        ("eval('1')", "forbidden call 'eval()'"),
        ("exec('x = 1')", "forbidden call 'exec()'"),
        ("data = open('/etc/passwd').read()", "forbidden call 'open()'"),
        ("torch.allclose = lambda *a, **k: True", "forbidden assignment to 'torch.allclose'"),
        ("torch.testing.assert_close = print", "forbidden assignment to 'torch.testing.assert_close'"),
        ("torch.allclose, x = (lambda *a: True), 1", "forbidden assignment to 'torch.allclose'"),
        ("setattr(torch, 'allclose', lambda *a, **k: True)", "forbidden setattr() on 'torch'"),
        ("__builtins__['len'] = lambda x: 0", "'__builtins__'"),
    ],
)
def test_rejects_forbidden_imports_calls_and_monkeypatching(snippet, needle):
    report = static_check(f"{snippet}\n{GOOD}")
    assert not report.ok
    assert any(needle in r for r in report.reasons), report.reasons


@pytest.mark.parametrize("snippet", ["import math", "from typing import Optional", "from __future__ import annotations",
                                     "import triton.language as tl", "from torch import nn", "import torch.nn.functional as F"])
def test_the_allowlist_admits_what_a_kernel_module_needs(snippet):
    report = static_check(f"{snippet}\n{GOOD}")
    assert report.ok, report.reasons


def test_forbidden_call_inside_forward_is_found_too():
    src = GOOD.replace("        y = torch.empty_like(x)\n", "        y = torch.empty_like(x)\n        eval('0')\n")
    report = static_check(src)
    assert not report.ok and any("eval()" in r for r in report.reasons)


def test_ordinary_attribute_and_subscript_assignments_are_allowed():
    src = GOOD.replace("        return y\n", "        self.cache = y\n        y[0] = 1.0\n        return y\n")
    assert static_check(src).ok


def test_a_module_the_task_imports_may_be_imported_by_its_candidate():
    """A whole-model candidate carries the task's model code, imports included (einops, transformers)."""
    candidate = f"from einops import rearrange\n{GOOD}"
    task = "import torch\nfrom einops import rearrange\nclass Model: pass\n"
    assert static_check(candidate, task).ok
    assert "import 'einops' is not allowed" in static_check(candidate).reasons[0]
    assert not static_check(f"import torch.hub\n{GOOD}", "import torch.hub\n").ok, "forbidden submodules stay forbidden"
