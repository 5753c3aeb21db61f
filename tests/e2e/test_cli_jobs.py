"""`fleetforge convert/answer/list` as a user runs them, against a dedicated `fleetforge dev` stack
(the fixtures of test_cli.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


from tests.e2e.test_cli import Stack, assert_one_line_error, ff
from tests.e2e.test_cli import model, stack  # noqa: F401  (module fixtures)
from tests.helpers import SELF_TESTS_CLI, wait_until


def test_convert_wait_json_compiles_the_tiny_model_for_sm8550_int8_then_reruns_it_at_fp16(stack: Stack, model: Path,  # noqa: F811
                                                                                         tmp_path: Path):
    own = Path(shutil.copy(model, tmp_path / "tiny8.onnx"))  # file names of its own: no cache hits across tests
    done = ff("convert", str(own), "--soc", "sm8550", "--precision", "int8", "--synthetic-calibration", "--wait", "--json",
              env=stack.env, timeout=120)

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # the whole stdout is one JSON object
    assert result["status"] == "COMPLETED", result.get("failure")
    assert result["artifacts"] and all(len(a["sha256"]) == 64 for a in result["artifacts"])
    assert result["evaluation"]["samples"] == 32 and result["accuracy"]["verdict"] == "unverified"
    assert result["requested_precision"] == result["delivered_precision"] == "int8"
    assert {"report/conversion_report.md", "report/conversion_report.json"} <= {a["name"] for a in result["artifacts"]}
    assert result["executed_steps"] == ["quantize", "context_binary"] and result["tokens"]["calls"] == 1

    # the issue's own example: the int8 plan at fp16 drops the quantizer (no planner call)
    fp16 = ff("convert", "--rerun", result["run_id"], "--set", "precision=fp16", "--wait", "--json",
              env=stack.env, timeout=120)
    assert fp16.returncode == 0, fp16.stderr
    rerun = json.loads(fp16.stdout)
    assert rerun["status"] == "COMPLETED" and rerun["executed_steps"] == ["context_binary"], rerun
    assert rerun["tokens"]["calls"] == 0 and not any("synthetic" in w for w in rerun["warnings"]), rerun
    assert "converted/tiny8_fp16_sm8550_ctx_qnn.bin" in {a["name"] for a in rerun["artifacts"]}
    assert rerun["evaluation"]["cosine"] > result["evaluation"]["cosine"], "fp16 is closer to fp32 than int8"


def test_convert_without_soc_needs_input_then_answer_completes_it(stack: Stack, model: Path):  # noqa: F811
    started = ff("convert", str(model), "--wait", env=stack.env, timeout=120)
    assert started.returncode == 0, started.stderr
    assert "fleetforge answer convert/" in started.stderr
    wid = started.stderr.split("fleetforge answer ", 1)[1].split()[0]

    listed = ff("list", "--status", "needs_input", "--kind", "convert", "--json", env=stack.env)
    assert listed.returncode == 0, listed.stderr
    wait_until(lambda: wid in ff("list", "--status", "NEEDS_INPUT", "--json", env=stack.env).stdout,
               timeout=30, message="NEEDS_INPUT job not listed")

    bad = ff("answer", wid, "soc=sm9999", "precision=int8", env=stack.env)
    assert_one_line_error(bad, 2, "sm9999")

    good = ff("answer", wid, "soc=sm8550", "precision=int8", "synthetic_calibration=yes", "--wait", "--json",
              env=stack.env, timeout=120)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["status"] == "COMPLETED"


def test_convert_wait_shows_progress_and_a_result_table_then_rerun_with_overrides(stack: Stack, model: Path):  # noqa: F811
    done = ff("convert", str(model), "--soc", "sm8550", "--precision", "fp16", "--wait", env=stack.env, timeout=120)

    assert done.returncode == 0, done.stderr
    # live progress: the job's step as it changes (polled, so a fast step may be skipped), in order
    steps = [line.split(": ", 1)[1] for line in done.stderr.splitlines() if " convert/" in line and ": " in line]
    order = ["resolve", "create run", "workspace", "plan", "compile", "run context_binary", "evaluate", "report", "attach",
             "completed"]
    assert "run context_binary" in steps and set(steps) <= set(order), done.stderr
    assert steps == sorted(steps, key=order.index), done.stderr
    table = done.stdout.splitlines()
    run_id = table[0].split()[1].rstrip(":")
    assert table[0] == f"run {run_id}: COMPLETED"
    assert table[1].split() == ["step", "source", "max_abs", "mean_abs", "cosine"]
    assert table[2].split()[0] == "context_binary" and table[3].split()[0] == "evaluate"
    assert float(table[3].split()[-1]) > 0.999, "the cosine of the fp16 binary against fp32"
    assert table[4].split() == ["accuracy", "passed", ">=", "0.99"] and table[5].split() == ["offload", "100%", "on", "HTP"]
    assert "converted/tiny_fp16_sm8550_ctx_qnn.bin" in done.stdout and "sha256 " in done.stdout

    rerun = ff("convert", "--rerun", run_id, "--set", "soc=sm8650", "--wait", "--json", env=stack.env, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    result = json.loads(rerun.stdout)
    assert result["status"] == "COMPLETED" and result["executed_steps"] == ["context_binary"], result
    assert result["run_id"] != run_id
    same = ff("convert", "--rerun", run_id, "--set", "precision=fp16", "--wait", "--json", env=stack.env, timeout=120)
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["cached_steps"] == ["context_binary"], "the same plan again: nothing runs"
    # overrides no step of the earlier plan takes, or no plan can satisfy: exit 2 before a job starts
    assert_one_line_error(ff("convert", "--rerun", run_id, "--set", "turbo=1", "--wait", env=stack.env), 2, "turbo")
    assert_one_line_error(ff("convert", "--rerun", run_id, "--set", "soc=sm1", "--wait", env=stack.env), 2, "sm8650")
    assert_one_line_error(ff("convert", str(model), "--set", "soc=sm8650", env=stack.env), 2, "--rerun")
    assert_one_line_error(ff("convert", "--rerun", "no-such-run", env=stack.env), 2, "no-such-run")


def test_convert_a_relative_path_from_another_directory(stack: Stack, model: Path, tmp_path: Path):  # noqa: F811
    import subprocess

    from tests.e2e.test_cli import FLEETFORGE

    shutil.copy(model, tmp_path / "rel.onnx")
    done = subprocess.run([FLEETFORGE, "convert", "rel.onnx", "--soc", "sm8550", "--precision", "fp16", "--wait", "--json"],
                          env=stack.env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "COMPLETED" and result["model"]["source"] == str(tmp_path / "rel.onnx"), result


def test_inspect_a_relative_path_from_another_directory(stack: Stack, model: Path, tmp_path: Path):  # noqa: F811
    """One path rule for every command (issue 23): inspect resolves `sub/m.onnx` like convert does, from the
    caller's directory (it used to go to the worker as written and fail MODEL_NOT_FOUND there)."""
    import subprocess

    from tests.e2e.test_cli import FLEETFORGE

    (tmp_path / "sub").mkdir()
    shutil.copy(model, tmp_path / "sub" / "m.onnx")
    done = subprocess.run([FLEETFORGE, "inspect", "sub/m.onnx", "--wait", "--json"], env=stack.env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "COMPLETED" and result["model"]["source"] == str(tmp_path / "sub" / "m.onnx"), result


def test_convert_impossible_combinations_exit_2_before_starting(model: Path, tmp_path: Path):  # noqa: F811
    from tests.e2e.test_cli import stack_env

    env = stack_env(tmp_path / "state").env
    assert_one_line_error(ff("convert", str(model), "--soc", "sm8550", "--precision", "w8a16", "--output", "ort", env=env),
                          2, "w8a16")
    assert_one_line_error(ff("convert", str(model), "--precision", "fp16", "--output", "onnx_qdq", env=env), 2, "onnx_qdq")
    assert_one_line_error(ff("convert", str(model), "--soc", "sm8550", "--precision", "int8", "--calibration",
                             str(tmp_path / "none.npz"), env=env), 2, "none.npz")
    assert_one_line_error(ff("convert", str(model), "--precision", "int8", "--min-cosine", "1.5", env=env), 2, "--min-cosine")


def test_answer_to_unknown_job_and_bad_pair_exit_2(stack: Stack):  # noqa: F811
    assert_one_line_error(ff("answer", "convert/nope-0000", "soc=sm8550", env=stack.env), 2)
    assert_one_line_error(ff("answer", "convert/nope-0000", "soc", env=stack.env), 2, "key=value")


def test_convert_unknown_soc_exits_2_before_starting(model: Path, tmp_path: Path):  # noqa: F811
    from tests.e2e.test_cli import stack_env

    env = stack_env(tmp_path / "state").env
    assert_one_line_error(ff("convert", str(model), "--soc", "sm1", "--precision", "int8", env=env), 2, "sm1")


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_kernel_relu_wait_json_is_verified_and_watch_replays_it(stack: Stack):  # noqa: F811
    done = ff("kernel", str(EXAMPLES / "kernels" / "relu.py"), "--arch", "cpu-interpreter", "--wait", "--json",
              env=stack.env, timeout=120)

    assert done.returncode == 0, done.stdout[-3000:]
    result = json.loads(done.stdout)
    assert result["outcome"] == "VERIFIED" and result["status"] == "COMPLETED", result
    assert result["best_candidate"]["sha256"]

    jobs = json.loads(ff("list", "--kind", "kernel", "--json", env=stack.env).stdout)["jobs"]
    watched = ff("watch", jobs[0]["workflow_id"], env=stack.env)
    assert watched.returncode == 0, watched.stderr
    assert "VERIFIED" in watched.stdout and "Web UI: " in watched.stdout


def test_kernel_bad_workflow_yaml_exits_2(stack: Stack, tmp_path: Path):  # noqa: F811
    bad = tmp_path / "wf.yaml"
    bad.write_text("agents: [\n")
    done = ff("kernel", str(EXAMPLES / "kernels" / "relu.py"), "--workflow", str(bad), env=stack.env)
    assert_one_line_error(done, 2, "wf.yaml")


PASS = 'python -c "print(\'server ready\')"'
FAIL = 'python -c "raise SystemExit(3)"'


def test_fleet_test_process_runner_writes_verdicts_back_keeping_columns(stack: Stack, tmp_path: Path):  # noqa: F811
    import csv as csvmod

    csv_path = tmp_path / "models.csv"
    with csv_path.open("w", newline="") as f:
        w = csvmod.writer(f, lineterminator="\n")
        w.writerow(["owner", "model_name", "status", "note", "command"])
        for owner, name, command in [("team-a", "org/pass-0", PASS), ("team-b", "org/fail-1", FAIL),
                                     ("team-c", "org/pass-2", PASS)]:
            w.writerow([owner, name, "", "", command])
    done = ff("fleet-test", str(csv_path), *SELF_TESTS_CLI, "--concurrency", "2", "--max-attempts", "1",
              "--wait", "--json", env=stack.env, timeout=120)

    assert done.returncode == 1, done.stderr  # one row failed: exit 1 (a fleet gates CI), verdicts still written
    result = json.loads(done.stdout)
    assert (result["total"], result["passed"], result["failed"]) == (3, 2, 1), result
    rows = list(csvmod.DictReader(csv_path.open()))
    assert [r["owner"] for r in rows] == ["team-a", "team-b", "team-c"]
    assert [r["model_name"] for r in rows] == ["org/pass-0", "org/fail-1", "org/pass-2"]
    assert rows[0]["status"] and rows[0]["status"] != rows[1]["status"] and rows[0]["status"] == rows[2]["status"]
    assert all(r["note"] for r in rows)
    assert list(rows[0]) == ["owner", "model_name", "status", "note", "command"]


def test_fleet_test_bad_inputs_exit_2(stack: Stack, tmp_path: Path):  # noqa: F811
    assert_one_line_error(ff("fleet-test", str(tmp_path / "missing.csv"), env=stack.env), 2, "missing.csv")
    hw = tmp_path / "hw.yaml"
    hw.write_text("a: [\n")
    assert_one_line_error(ff("fleet-test", str(EXAMPLES / "models.csv"), "--hardware", str(hw), env=stack.env), 2, "hw.yaml")
    assert_one_line_error(ff("watch", "fleet-test/nope-0000", env=stack.env), 2)
    # the shipped example has no `command` column values: the process runner cannot run it
    no_commands = ff("fleet-test", str(EXAMPLES / "models.csv"), "--runner", "process", env=stack.env)
    assert_one_line_error(no_commands, 2, "line(s) 2, 3, 5")
    assert "--runner docker" in no_commands.stderr
