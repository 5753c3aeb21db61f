"""The kernel verifier against real Triton-interpreter child processes (relu task, small sizes): every trial
set runs the task's inputs and the same shapes from other distributions; a crash report carries the
candidate's own file/line."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.kernels import llm_agents, offline_coder
from activities.kernels.static_checks import static_check
from activities.kernels.verifier import NOT_KERNEL_DERIVED, compare, profile, verify
from contracts.errors import Err, FleetforgeError
from contracts.kernel import KernelTask
from tests.unit.test_conductor_offline_designer import analyse

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kernels"
RELU = (EXAMPLES / "relu.py").read_text()
TIMEOUT_S = 60.0

HEADER = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n"
KERNEL = '''
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)


def launch(x):
    x = x.contiguous()
    out = torch.empty_like(x)
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out

'''


def candidate(forward_body: str, prelude: str = "") -> str:
    return HEADER + prelude + KERNEL + (
        "\nclass ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
        "    def forward(self, x):\n" + "".join(f"        {line}\n" for line in forward_body.splitlines())
    )


def offline_candidate(task_source: str, tmp_path: Path) -> str:
    task = KernelTask(op_name="op", task_desc=task_source, task_id="t", arch="cpu")
    source = offline_coder.code(task, None, analyse(task_source, tmp_path))
    assert source is not None
    return source


def test_accepts_the_offline_relu_kernel(tmp_path):
    report = verify(RELU, offline_candidate(RELU, tmp_path), timeout_s=TIMEOUT_S)
    assert report.passed, report.reason
    assert report.reason == "" and report.mismatches == [] and report.static.ok
    assert report.families == ["task", "signed_normal", "large", "near_zero"] and report.input_family == ""
    assert report.durations["candidate"] > 0
    assert report.special_values.startswith("as torch on NaN/Inf inputs"), report.special_values


def test_a_relu_that_turns_nan_into_zero_passes_and_the_report_says_how_it_differs_from_torch():
    """`tl.where(x > 0, x, 0)` gives 0 where torch.relu gives NaN: right on finite inputs (the verdict), and
    the special-values run says so (advisory)."""
    report = verify(RELU, candidate("return launch(x)"), timeout_s=TIMEOUT_S)
    assert report.passed, report.reason
    assert report.special_values.startswith("differs from torch on NaN/Inf inputs: trial 0 (nan_inf inputs) "
                                            "output 0: NaN/Inf positions differ"), report.special_values


def test_a_candidate_that_crashes_only_on_nan_inputs_passes_and_says_so():
    crash_on_nan = "assert not torch.isnan(x).any(), 'no NaN please'\nreturn launch(x)"
    report = verify(RELU, candidate(crash_on_nan), timeout_s=TIMEOUT_S, allow_mixed=True)  # isnan is torch's
    assert report.passed, report.reason
    assert report.special_values == ("fails on NaN/Inf inputs, where the reference does not: "
                                     "AssertionError: no NaN please"), report.special_values


def test_on_another_triton_the_interpreter_verdict_is_the_machines_error_not_the_candidates(monkeypatch):
    """Benches call verify() directly: under Triton 3.6 every candidate "crashed" on the lent H100."""
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "3.6.0" if name == "triton" else real(name))
    with pytest.raises(FleetforgeError) as raised:
        verify(RELU, candidate("return launch(x)"), timeout_s=TIMEOUT_S)
    assert raised.value.code is Err.VERIFIER_ERROR and "has Triton 3.6.0" in raised.value.message


def test_a_gpu_verdict_on_a_machine_without_one_is_the_machines_error_not_the_candidates(monkeypatch):
    """The GPU check lives in verify() too, so a bench calling it directly cannot blame the candidate either."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(FleetforgeError) as raised:
        verify(RELU, candidate("return launch(x)"), timeout_s=TIMEOUT_S, gpu=True)
    assert raised.value.code is Err.VERIFIER_ERROR and "needs a GPU" in raised.value.message


NON_NEGATIVE_RELU = RELU.replace("torch.randn(batch_size, dim)", "torch.rand(batch_size, dim)")


def test_an_identity_kernel_for_relu_on_non_negative_task_inputs_is_rejected(tmp_path):
    """KernelBench draws with torch.rand (all >= 0): relu(x) == x there, so only the other families catch it."""
    identity = offline_candidate(NON_NEGATIVE_RELU.replace("torch.relu(x)", "x * 1.0"), tmp_path)
    report = verify(NON_NEGATIVE_RELU, identity, timeout_s=TIMEOUT_S)
    assert not report.passed
    assert report.input_family == "signed_normal", report.reason
    assert report.reason.startswith("trial 0 (signed_normal inputs) output 0: ") and "elements differ" in report.reason
    assert all(m.family == "signed_normal" and float(m.expected) == 0.0 and float(m.got) < 0 for m in report.mismatches)


def test_the_erf_gelu_does_not_pass_the_tanh_gelu_task(tmp_path):
    tanh_task = NON_NEGATIVE_RELU.replace("torch.relu(x)", 'torch.nn.functional.gelu(x, approximate="tanh")')
    erf = offline_candidate(NON_NEGATIVE_RELU.replace("torch.relu(x)", "torch.nn.functional.gelu(x)"), tmp_path)
    report = verify(tanh_task, erf, timeout_s=TIMEOUT_S)
    assert not report.passed and report.input_family in ("signed_normal", "large"), report.reason


def test_a_crash_report_carries_the_candidates_own_file_and_line():
    bad = KERNEL.replace("    tl.store(out_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)",
                         "    y = x + undefined_name\n    tl.store(out_ptr + offs, y, mask=mask)")
    report = verify(RELU, HEADER + bad + "\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
                    "        return launch(x)\n", timeout_s=TIMEOUT_S)
    assert not report.passed and not report.timed_out and report.reason.startswith("candidate crashed: exit code 1"), report.reason
    line = 1 + (HEADER + bad).splitlines().index("    y = x + undefined_name")
    assert f"candidate.py:{line}, in relu_kernel" in report.log, report.log
    assert "y = x + undefined_name" in report.log and "NameError" in report.log
    assert "candidate.py" in report.log.split("relu_kernel", 1)[1], "the launch site in forward is there too"
    assert len(report.log) <= 4000 and "site-packages" not in report.log


def test_rejects_torch_only_model_statically():
    src = HEADER + KERNEL + "class ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
    report = verify(RELU, src, timeout_s=TIMEOUT_S)
    assert not report.passed and not report.static.ok
    assert "launches no @triton.jit kernel" in report.reason
    assert "candidate" not in report.durations, "nothing may run after a static rejection"


def test_rejects_a_decoy_kernel_launched_on_a_scratch_buffer():
    # Passes the static check (forward launches a kernel) and the numbers (torch computed them).
    # One launch only touches scratch; the other reads x, but a buffer a kernel only reads is not
    # kernel-derived, so torch.relu(x) depends on no kernel's writes.
    body = ("scratch = torch.empty_like(x)\nrelu_kernel[(1,)](scratch, scratch, 8, BLOCK=8)\n"
            "relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, scratch, x.numel(), BLOCK=1024)\nreturn torch.relu(x)")
    # Even where a workflow allows mixed kernels (torch ops not rejected as such), an output no kernel
    # wrote is a decoy; by default the torch relu itself is named first.
    report = verify(RELU, candidate(body), timeout_s=TIMEOUT_S, allow_mixed=True)
    assert report.static.ok and report.mismatches == []
    assert not report.passed
    assert report.reason == f"trial 0 (task inputs) output 0: {NOT_KERNEL_DERIVED}"
    assert report.input_family == "task"
    assert [u.op for u in report.torch_ops] == ["relu"]
    default = verify(RELU, candidate(body), timeout_s=TIMEOUT_S)
    assert not default.passed and default.reason.startswith("torch did the work, not the Triton kernel: relu ran")


def test_a_kernel_whose_every_output_is_zero_still_wrote_its_fresh_buffer():
    # An all-negative input: the ReLU writes only zeros, into an empty_like buffer that reuses the memory of a
    # freed zero tensor. No byte changed, and the output counted as written by no kernel: a false "no"
    # (KernelBench L2 9 at its held-out sizes, where every output of its ReLU is 0). Uninitialized allocations
    # now start as all-ones bytes in the candidate's forward.
    task = RELU.replace("torch.randn(batch_size, dim)", "-1.0 - torch.rand(batch_size, dim)")
    assert task.count("-1.0 - torch.rand") == 1
    report = verify(task, candidate("del_me = torch.zeros_like(x)\ndel del_me\nreturn launch(x)"), timeout_s=TIMEOUT_S)
    assert report.passed, report.reason


def test_accepts_a_view_of_the_kernel_written_buffer():
    # The kernel fills a flat buffer; forward returns a reshape of it (same storage, no copy).
    body = "flat = launch(x.reshape(-1))\nreturn flat.view(x.shape)"
    report = verify(RELU, candidate(body), timeout_s=TIMEOUT_S)
    assert report.passed, report.reason


def test_accepts_fp32_accumulation_returned_as_fp16():
    # The kernel stores into an fp32 buffer; forward returns a torch cast of it (a new storage
    # that no launch received, but computed from one).
    task = RELU.replace("torch.randn(batch_size, dim)", "torch.randn(batch_size, dim, dtype=torch.float16)")
    body = ("x = x.contiguous()\nacc = torch.empty(x.shape, dtype=torch.float32)\n"
            "relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, acc, x.numel(), BLOCK=1024)\nreturn acc.to(x.dtype)")
    report = verify(task, candidate(body), timeout_s=TIMEOUT_S)
    assert report.passed, report.reason


PARTIAL_SUMS = HEADER + '''
@triton.jit
def partial_sum_kernel(x_ptr, part_ptr, rows, cols, ROWS: tl.constexpr, COLS: tl.constexpr):
    b, p = tl.program_id(0), tl.program_id(1)
    r = p * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    x = tl.load(x_ptr + (b * rows + r[:, None]) * cols + c[None, :],
                mask=(r[:, None] < rows) & (c[None, :] < cols), other=0.0)
    tl.store(part_ptr + (p * tl.num_programs(0) + b) * cols + c, tl.sum(x, axis=0), mask=c < cols)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        batch, rows, cols = x.shape
        blocks = triton.cdiv(rows, 16)
        part = torch.empty(blocks, batch, cols)
        partial_sum_kernel[(batch, blocks)](x, part, rows, cols, ROWS=16, COLS=64)
        return part.sum(dim=0).unsqueeze(1)
'''


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        ("torch.allclose = lambda *a, **k: True", "forbidden assignment to 'torch.allclose' (monkeypatching)"),
        ("import os\nos.environ['X'] = '1'", "import 'os' is not allowed"),
        ("import subprocess\nsubprocess.run(['true'])", "import 'subprocess' is not allowed"),
        ("from ctypes import CDLL", "import 'ctypes' is not allowed"),
    ],
    ids=["allclose", "os", "subprocess", "ctypes"],
)
def test_rejects_monkeypatching_and_forbidden_imports_statically(patch: str, reason: str):
    report = verify(RELU, candidate("return launch(x)", prelude=patch + "\n"), timeout_s=TIMEOUT_S)
    assert not report.passed and report.reason.startswith("static check:")
    assert reason in report.reason, report.reason
    assert "candidate" not in report.durations, "nothing may run after a static rejection"


def test_editing_the_reference_inside_the_candidate_process_cannot_fake_the_verdict():
    # Through an alias the candidate reaches its own copy of the task module and replaces the
    # reference model and the inputs; the reference runs in another process, so nothing changes there.
    prelude = ("t = torch\nm = t.sys.modules['fleetforge_task']\n"
               "m.get_inputs = lambda: [t.zeros(7, 1000)]\nm.Model.forward = lambda self, x: x * 0\n")
    report = verify(RELU, candidate("return launch(x)", prelude=prelude), timeout_s=TIMEOUT_S)
    assert report.static.ok
    assert not report.passed
    assert "elements differ" in report.reason and report.mismatches
    assert all(m.got == 0.0 and float(m.expected) > 0 for m in report.mismatches)


def test_allclose_patch_that_evades_static_check_cannot_fake_the_verdict():
    # An alias slips past the AST check, but the comparison runs in the verifier's own process.
    prelude = "t = torch\nt.allclose = lambda *a, **k: True\nt.isclose = lambda a, b, **k: a == a\n"
    report = verify(RELU, candidate("return launch(x) + 1.0", prelude=prelude), timeout_s=TIMEOUT_S)
    assert report.static.ok
    assert not report.passed
    assert "elements differ" in report.reason
    assert len(report.mismatches) == 10
    first = report.mismatches[0]
    assert first.got == pytest.approx(float(first.expected) + 1.0)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("return launch(x).reshape(-1)", "wrong shape (7000,), expected (7, 1000)"),
        ("return launch(x).double()", "wrong dtype torch.float64, expected torch.float32"),
    ],
    ids=["shape", "dtype"],
)
def test_rejects_wrong_outputs(body: str, expected: str):
    report = verify(RELU, candidate(body), timeout_s=TIMEOUT_S)
    assert not report.passed
    assert expected in report.reason, report.reason


def test_rejects_nans_and_reports_their_position():
    report = verify(RELU, candidate("out = launch(x)\nout[0, 3] = float('nan')\nreturn out"), timeout_s=TIMEOUT_S)
    assert not report.passed
    assert "1 unexpected NaN" in report.reason, report.reason
    assert [m.index for m in report.mismatches] == [[0, 3]]
    assert report.mismatches[0].got == "nan"


def test_a_segfaulting_kernel_is_a_crash_not_a_worker_death():
    # An unmasked out-of-bounds access: nothing in the AST is forbidden, the child dies of SIGSEGV.
    bad = KERNEL.replace("x = tl.load(x_ptr + offs, mask=mask, other=0.0)", "x = tl.load(x_ptr + offs + 1099511627776)")
    src = HEADER + bad + "\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return launch(x)\n"
    report = verify(RELU, src, timeout_s=TIMEOUT_S)
    assert report.static.ok
    assert not report.passed
    assert report.reason.startswith("candidate crashed: killed by signal SIGSEGV"), report.reason



def test_a_kernel_that_segfaults_only_on_nan_inputs_passes_and_says_so():
    """Killed in the special-values run, after every finite run was written: those are judged."""
    bad = KERNEL.replace("x = tl.load(x_ptr + offs, mask=mask, other=0.0)",
                         "x = tl.load(x_ptr + offs, mask=mask, other=0.0)\n"
                         "    x = tl.load(x_ptr + offs + tl.where(x != x, 1099511627776, 0), mask=mask, other=0.0)")
    src = HEADER + bad + "\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return launch(x)\n"
    report = verify(RELU, src, timeout_s=TIMEOUT_S)
    assert report.passed, report.reason
    assert report.special_values.startswith("fails on NaN/Inf inputs, where the reference does not: the candidate "
                                            "crashed: killed by signal SIGSEGV"), report.special_values


def test_an_out_of_bounds_write_crashes_the_child_not_the_worker():
    bad = KERNEL.replace("tl.store(out_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)",
                         "tl.store(out_ptr + offs + 1099511627776, tl.where(x > 0, x, 0.0))")
    src = HEADER + bad + "\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return launch(x)\n"
    report = verify(RELU, src, timeout_s=TIMEOUT_S)
    assert report.static.ok
    assert not report.passed
    assert report.reason.startswith("candidate crashed: killed by signal SIGSEGV"), report.reason


def test_memory_hog_hits_the_address_space_limit():
    report = verify(RELU, candidate("return launch(x)", prelude="HOG = bytearray(16 * 1024**3)\n"), timeout_s=TIMEOUT_S)
    assert not report.passed
    assert report.reason.startswith("candidate crashed: exit code 1: MemoryError"), report.reason


def test_infinite_loop_times_out_and_is_killed():
    # The reference (torch import, 3-5 s on a loaded 2-CPU machine) must finish inside the same budget.
    report = verify(RELU, candidate("while True:\n    pass\nreturn launch(x)"), timeout_s=12)
    assert not report.passed and report.timed_out
    assert report.reason.startswith("candidate timed out after 12s (killed), before its first forward call ended: its "
                                    "time limit is a fixed 12 s, and the reference took "), report.reason
    assert 12 <= report.durations["candidate"] < 40


ALL_EXAMPLES = sorted(p.stem for p in EXAMPLES.glob("*.py") if p.stem != "__init__")


def test_examples_are_the_eight_kernelbench_tasks():
    assert ALL_EXAMPLES == ["gelu", "leaky_relu", "log_softmax", "matmul", "relu", "rmsnorm", "softmax", "sum_dim"]


@pytest.mark.parametrize("name", ALL_EXAMPLES)
def test_offline_coder_writes_each_example_from_its_trace_and_passes_static_checks(name: str, tmp_path):
    src = (EXAMPLES / f"{name}.py").read_text()
    code = offline_candidate(src, tmp_path)
    assert static_check(code).ok, static_check(code).reasons
    assert llm_agents.parse_code(offline_coder.render_answer(code)) == code
    assert "libdevice" not in code and "mask=" in code


def test_compare_in_process_tolerances_and_inf_positions():
    import torch

    e = torch.tensor([1.0, float("inf"), 3.0])
    assert compare([[e]], [[e + 5e-5]])[0] == ""
    assert "differ beyond rtol=0.0001, atol=0.0003" in compare([[e]], [[e + 1e-3]])[0], "atol scales with max |e| = 3"
    big = torch.tensor([1e4, 0.5])
    assert compare([[big]], [[big + torch.tensor([0.0, 0.5])]])[0] == "", "near-zero values of a 1e4-scale output"
    assert "elements differ" in compare([[big]], [[big + torch.tensor([0.0, 2.0])]])[0]
    assert "unexpected Inf" in compare([[e]], [[torch.tensor([float("inf"), float("inf"), 3.0])]])[0]
    h = e.half()
    assert compare([[h]], [[h + 5e-3]])[0] == "", "fp16 uses 1e-2"
    assert "outputs" in compare([[e]], [[e, e]])[0]


def test_profiler_without_a_gpu_reports_no_number(tmp_path):
    # The GPU profiling child (do_bench on cuda) cannot run here: the result is a note, never a speedup.
    timing, note = profile(RELU, offline_candidate(RELU, tmp_path), timeout_s=TIMEOUT_S)
    assert timing is None
    assert note.startswith("speed not measured: the candidate could not be timed ("), note
    assert "CUDA" in note, note


CANCELLING_SUM = (RELU.split("class Model", 1)[0] + """class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sum(x, dim=1)


batch_size = 8
dim = 4096


def get_inputs():
    a = torch.randn(batch_size, dim // 2) * 1e4
    return [torch.cat([a, -a + torch.randn(batch_size, dim // 2)], dim=1)]


def get_init_inputs():
    return []
""")
"""Row sums of +-1e4 terms that cancel to about +-50: on the task's own inputs the fp32 reference is itself off by
about 0.1 against float64 (the tolerance is 0.009), so a kernel that sums in another order disagreed with it."""


def test_an_ill_conditioned_task_is_judged_against_float64_and_a_wrong_kernel_still_fails(tmp_path):
    right = offline_candidate(CANCELLING_SUM, tmp_path)
    report = verify(CANCELLING_SUM, right, timeout_s=TIMEOUT_S)
    assert report.passed, report.reason
    assert report.accuracy_note.startswith("checked against the reference in float64: the fp32 reference is itself off")
    assert "trial 0 (task inputs) output 0" in report.accuracy_note and "elements differ beyond" in report.accuracy_note

    assert right.count("res = tl.sum(acc, axis=1)") == 1
    wrong = right.replace("res = tl.sum(acc, axis=1)", "res = tl.sum(acc, axis=1) * 1.001")
    report = verify(CANCELLING_SUM, wrong, timeout_s=TIMEOUT_S)
    assert not report.passed and "elements differ beyond" in report.reason, report.reason
    assert report.accuracy_note.startswith("the float64 reference agrees with the fp32 one")
    assert "against float64, trial 0 (signed_normal inputs) output 0: " in report.accuracy_note, report.accuracy_note



def test_an_output_whose_fp32_reference_is_off_by_over_a_percent_judges_nothing():
    import torch

    truth = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    fp32_close, fp32_off = truth.float() + 1e-6, truth.float() + torch.tensor([0.0, 0.05, 0.0])
    unjudged, judged = [], [0]
    # output 1's fp32 reference is off by 2.5 % of its scale (2): skipped, whatever the candidate says there
    reason, _ = compare([[truth, truth]], [[truth.float(), torch.zeros(3)]], widen=[[fp32_close, fp32_off]],
                        unjudged=unjudged, judged=judged)
    assert reason == "" and unjudged == ["trial 0 (task inputs) output 1"] and judged == [1]
    # a judged output still fails beyond the tolerance plus twice the reference's own error (2e-6)
    reason, _ = compare([[truth]], [[truth.float() + 1e-3]], widen=[[fp32_close]], unjudged=[], judged=[0])
    assert "elements differ beyond" in reason
