"""What the CLI prints, without a server: progress that reads right, the jobs table."""

from __future__ import annotations

import io
from datetime import datetime, timezone

import pytest
from rich.console import Console

from client import out
from client.cli import jobs_table
from client.jobs import JobSummary, fleet_step
from contracts.fleet_job import FleetProgress


def test_fleet_progress_says_rows_tested_of_rows_to_test():
    fp = FleetProgress(total=7, skipped=1, done=3, passed=2, failed=1, running=2)
    assert fleet_step(fp) == "3/6 rows tested: 2 passed, 1 failed, 2 running, 1 skipped"
    assert fleet_step(FleetProgress()) == "reading the manifest"


def test_a_terminal_shows_a_rich_progress_bar_with_done_of_total_and_its_label():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=80, color_system=None)
    with out.progress("fleet-test/f1", bar=True, console=console) as live:
        live.bar(3, 6, "rows tested: 2 passed, 1 failed, 2 running")
    text = buf.getvalue()
    assert "3/6 rows tested: 2 passed, 1 failed, 2 running" in text and "fleet-test/f1" in text


def test_a_log_gets_one_timeline_line_per_new_step():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=120)
    with out.progress("convert/r1", console=console) as live:
        for step in ("resolve", "resolve", "run context_binary", ""):
            live.step(step)
        live.bar(1, 2, "rows tested: 1 passed, 0 failed, 1 running")
    lines = [ln.split("s  ", 1)[1] for ln in buf.getvalue().splitlines()]
    assert lines == ["convert/r1: resolve", "convert/r1: run context_binary",
                     "convert/r1: 1/2 rows tested: 1 passed, 0 failed, 1 running"]


def test_the_jobs_table_has_a_header_and_one_line_per_job_with_its_target():
    jobs = [JobSummary(workflow_id="convert/r1", kind="convert", status="COMPLETED", model="tiny.onnx", target="SM8550",
                       start_time=datetime(2026, 11, 22, 14, 5, tzinfo=timezone.utc)),
            JobSummary(workflow_id="fleet-test/f1", kind="fleet-test", status="RUNNING", model="models.csv", target="docker")]
    buf = io.StringIO()
    Console(file=buf, width=1000).print(jobs_table(jobs))
    lines = buf.getvalue().splitlines()
    assert lines[0].split() == ["JOB", "KIND", "STATUS", "MODEL", "TARGET", "STARTED"]
    assert len(lines) == 3
    assert lines[1].split()[:5] == ["convert/r1", "convert", "COMPLETED", "tiny.onnx", "SM8550"]


def test_a_kernel_result_says_what_the_reference_is_its_sizes_and_every_fallback(capsys):
    from client.cli import show_kernel
    from contracts.common import JobStatus
    from contracts.kernel_job import KernelOutcome, KernelResult, TraceEntry

    result = KernelResult(outcome=KernelOutcome.VERIFIED, status=JobStatus.COMPLETED, steps=4,
                          op_family="elementwise(relu)", aten_ops=["aten.relu.default"], overrides={"dim": 4096},
                          fallbacks=["step 2 coder: 3 LLM answers refused (syntax error)"], duplicates_refused=1)
    trace = [TraceEntry(step=1, agent="coder", summary="candidate written", ok=True),
             TraceEntry(step=2, agent="verifier", summary="FAILED: elements differ", ok=False)]
    show_kernel(result, trace, "http://127.0.0.1:8233/x")
    shown = capsys.readouterr()
    assert "    1 coder      ok  candidate written" in shown.out and "    2 verifier   err FAILED: elements differ" in shown.out
    assert "reference: elementwise(relu) (aten: aten.relu.default)" in shown.out and "sizes: dim=4096" in shown.out
    assert "1 candidate(s) identical to a rejected one" in shown.out
    assert "fallback: step 2 coder: 3 LLM answers refused" in shown.err


def test_a_verified_job_says_which_gpu_its_kernels_compile_for_and_its_optimizer_end_reads_end_not_err(capsys):
    from client.cli import show_kernel
    from contracts.common import JobStatus
    from contracts.kernel_job import KernelOutcome, KernelResult, TraceEntry

    trace = [TraceEntry(step=3, agent="verifier", summary="PASSED", ok=True),
             TraceEntry(step=4, agent="optimizer", summary="no candidate: every applicable rewrite was tried", ok=False)]
    from contracts.kernel import StaticReport
    from contracts.kernel_job import GpuCompileCheck, VerifierReport

    report = VerifierReport(passed=True, reason="", static=StaticReport(ok=True), gpu_compile=GpuCompileCheck(
        target="sm_90 (H100 SXM5 80GB)", compiles=True, kernels=["rows_1"], max_shared_bytes=1500),
        special_values="differs from torch on NaN/Inf inputs: trial 0 (nan_inf inputs) output 0: 3 unexpected NaN")
    show_kernel(KernelResult(outcome=KernelOutcome.VERIFIED, status=JobStatus.COMPLETED, steps=4, report=report),
                trace, "u")
    shown = capsys.readouterr().out
    assert "    4 optimizer  end no candidate: every applicable rewrite was tried" in shown
    assert "gpu: compiles for sm_90 (H100 SXM5 80GB) (1 kernel(s), at most 2 KB shared memory a program)" in shown
    assert "nan/inf: differs from torch on NaN/Inf inputs: trial 0 (nan_inf inputs) output 0: 3 unexpected NaN" in shown
    show_kernel(KernelResult(outcome=KernelOutcome.FAILED, status=JobStatus.FAILED, steps=4), trace, "u")
    assert "    4 optimizer  err no candidate" in capsys.readouterr().out  # a job without a kernel: it did fail


def test_a_kernel_result_shows_the_measured_speed_first_the_modeled_beside_it_and_the_precision(capsys):
    from client.cli import show_kernel
    from contracts.common import JobStatus
    from contracts.kernel_job import KernelOutcome, KernelResult, KernelTiming, ModeledSpeed

    modeled = ModeledSpeed(gpu="h100", sol_ms=0.003, modeled_ms=0.006, eager_ms=0.009, speedup=1.5, sol_fraction=0.5,
                           score=0.67, traffic_ratio=1.2, launches=2)
    timing = KernelTiming(candidate_ms=0.01, eager_ms=0.012, baseline="eager", ref_ms=0.012)
    result = KernelResult(outcome=KernelOutcome.VERIFIED, status=JobStatus.COMPLETED, modeled=modeled, timing=timing,
                          speed=timing.summary, precision_used="kernelbench")
    show_kernel(result, [], "http://127.0.0.1:8233/x")
    lines = capsys.readouterr().out.splitlines()
    speed = next(i for i, line in enumerate(lines) if line.startswith("speed: "))
    assert lines[speed].startswith("speed: speedup 1.20x over eager")
    assert lines[speed + 1].strip().startswith("modeled on H100 (strict): 1.50x over eager")
    assert "precision: kernelbench" in lines


def test_an_unknown_roofline_gpu_is_bad_input_naming_the_known_ones(tmp_path):
    from client.kernel import kernel_request
    from contracts.errors import Err, FleetforgeError

    with pytest.raises(FleetforgeError) as e:
        kernel_request(tmp_path / "task.py", run_id="r1", roofline_gpu="rtx9090")
    assert e.value.code == Err.BAD_INPUT and "h100, a100, l40s, b200" in e.value.message


def test_upload_bar_in_a_log_says_each_big_file_once_and_on_a_terminal_draws_then_goes():
    import io

    from rich.console import Console

    from client.out import UploadBar

    log = io.StringIO()
    bar = UploadBar(Console(file=log, force_terminal=False, width=200))
    for done in (10, 20, 30):
        bar("m.onnx.data", done, 30)
    assert log.getvalue().count("uploading m.onnx.data (30 bytes)") == 1

    tty = UploadBar(Console(file=io.StringIO(), force_terminal=True, width=80))
    tty("m.onnx.data", 10, 30)
    assert tty._live is not None  # a bar while bytes go
    tty("m.onnx.data", 30, 30)
    assert tty._live is None  # gone when the file is in, so the job's own progress display can start


def test_the_cli_starts_without_the_workflow_and_activity_modules():
    # `--help`, `--version`, `list` and every shell-completion TAB pay the CLI's imports; the workflow
    # classes pull in the activities' modules (0.6 s), so only starting or querying a job imports them.
    import subprocess
    import sys

    probe = ("import sys, client.cli\n"
             "print(' '.join(m for m in sys.modules if m.split('.')[0] in ('workflows', 'activities', 'torch')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    heavy = [m for m in loaded if m.startswith(("workflows.conductor", "workflows.converter", "workflows.fleet",
                                                "workflows.model_test", "torch"))
             or m.endswith(".activities")]
    assert heavy == [], heavy
