"""One declaration of each job's options (client/job_options.py): the CLI's flags and the MCP tools'
input schemas are the contract fields (types, defaults, bounds, enums, help), and what either front
door hands the SDK builds the contract with those values."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pytest
import typer
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from client.cli import app
from client.cli.options import Opts, with_options
from client.convert import convert_request
from client.job_options import CONVERT, FLEET_TEST, KERNEL, JobOptions, Option
from client.kernel import kernel_request
from client.mcp_server.args import ConvertArgs, FleetTestArgs, KernelArgs
from contracts.convert_job import DEFAULT_MIN_COSINE
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn

ROOT = Path(__file__).resolve().parents[2]
JOBS = [("convert", CONVERT, ConvertArgs), ("kernel", KERNEL, KernelArgs), ("fleet-test", FLEET_TEST, FleetTestArgs)]


def _bare(schema: dict) -> dict:
    return {k: v for k, v in schema.items() if k not in ("title", "description", "default")}


@pytest.mark.parametrize(("command", "job", "args"), JOBS)
def test_every_option_is_a_tool_property_with_its_contracts_type_bounds_and_help(command, job, args):
    tool = args.model_json_schema()
    for r in job.resolved():
        contract = next(c for c in job.contracts if r.option.field in c.model_fields)
        theirs = contract.model_json_schema()["properties"][r.option.field]
        ours = tool["properties"][r.option.key]
        assert ours.get("description") == r.help != "", r.option
        if r.contract_default:
            assert _bare(ours) == _bare(theirs) and ours.get("default") == theirs.get("default"), (r.option, ours, theirs)


@pytest.mark.parametrize(("command", "job", "args"), JOBS)
def test_every_cli_option_shows_the_contracts_help_in_the_commands_help(command, job, args):
    shown = " ".join(CliRunner().invoke(app, [command, "--help"], terminal_width=400).output.split())
    for r in job.resolved():
        if r.option.cli:
            assert r.option.cli_flag in shown and " ".join(r.help.split()[1:5]) in shown, r.option


def test_the_gate_thresholds_are_written_once_and_the_help_reads_them():
    help_text = CONVERT.resolved()[[o.key for o in CONVERT.options].index("min_cosine")].help
    for precision, cosine in DEFAULT_MIN_COSINE.items():
        assert f"{cosine:g}" in help_text and precision.value in help_text


def test_a_new_contract_field_is_one_line_and_reaches_the_cli_and_the_tool_schema():
    class Request(BaseModel):
        share: bool = Field(False, description="share the GPU between rows")
        rounds: int = Field(3, ge=1, le=9, description="rounds to run")

    job = JobOptions((Request,), (Option("share"), Option("rounds", metavar="N")))
    got: dict = {}
    cli = typer.Typer()

    @cli.command()
    @with_options(job)
    def go(name: Annotated[str, typer.Argument()], opts: Opts = {}) -> None:
        got.update(opts, name=name)

    assert CliRunner().invoke(cli, ["x", "--share", "--rounds", "4"]).exit_code == 0
    assert got == {"name": "x", "share": True, "rounds": 4}
    refused = CliRunner().invoke(cli, ["x", "--rounds", "10"])
    assert refused.exit_code == 2 and "less than or equal to 9" in refused.output  # the contract's bound, in the CLI

    from client.mcp_server.args import tool_input

    class _ShareInput(BaseModel):
        """A job."""

    props = tool_input(_ShareInput, job).model_json_schema()["properties"]
    assert props["rounds"] == {"default": 3, "description": "rounds to run", "maximum": 9, "minimum": 1,
                               "title": "Rounds", "type": "integer"}
    assert props["share"]["description"] == "share the GPU between rows"


def test_what_the_convert_tool_takes_builds_the_request_the_sdk_starts(tmp_path):
    model = build_tiny_cnn(tmp_path / "tiny.onnx")
    args = ConvertArgs(model=str(model), soc="sm8550", precision="int8", min_cosine=0.9, max_replans=1,
                       eval_samples=8, synthetic_calibration=True, precision_fallback=True, preset="fast")
    given = args.model_dump()
    request = convert_request(given.pop("model"), settings=Settings(), **given)
    assert (request.target_soc, request.precision.value, request.min_cosine, request.max_replans) == ("sm8550", "int8",
                                                                                                       0.9, 1)
    assert (request.eval_samples, request.synthetic_calibration, request.precision_fallback, request.preset) == (
        8, True, True, "fast")


def test_what_the_kernel_tool_takes_builds_the_request_the_sdk_starts():
    args = KernelArgs(task_file=str(ROOT / "examples/kernels/relu.py"), num_candidates=2, max_step=5,
                      op_name="MyRelu", max_llm_answers=2, llm_rejections_before_fallback=4)
    given = args.model_dump()
    start = kernel_request(given.pop("task_file"), run_id="r1", sets=given.pop("sets"), **given)
    task = start.request.task
    assert (task.arch, task.num_candidates, task.max_step, task.op_name) == ("cpu-interpreter", 2, 5, "MyRelu")
    assert (start.request.max_llm_answers, start.request.llm_rejections_before_fallback) == (2, 4)
