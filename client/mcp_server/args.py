"""What each tool takes. A job tool's input is what the job's CLI command takes (client/job_options.py:
the contract fields, their types, defaults, bounds and help, so a tool cannot accept what the SDK would
refuse) plus what names the job's input on the server's machine."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, create_model

from client.job_options import CONVERT, FLEET_TEST, KERNEL, JobOptions
from contracts.common import JobKind, JobStatus
from contracts.convert_job import ProvideInput
from contracts.inspect import InspectRequest

_MODEL = "path on the server's machine, file:// or s3:// URI, or catalog name"


class InspectArgs(BaseModel):
    """Resolve, record and store a model (a path on the server's machine, file:// or s3:// URI, catalog name)."""

    model: str = Field(InspectRequest.model_fields["model"].default, min_length=1, description=_MODEL)


class _ConvertInput(BaseModel):
    """Convert a model for a Qualcomm SoC and precision. Leave soc or precision out and the job asks
    (a form elicitation, the task's input_required, or the `answer` tool)."""

    model: str = Field(min_length=1, description=_MODEL)


class _KernelInput(BaseModel):
    """Write and verify a Triton kernel for a KernelBench-format task file on the server's machine."""

    task_file: str = Field(min_length=1, description="path of the task .py (class Model, get_inputs, get_init_inputs)")
    sets: dict[str, str] = Field(default_factory=dict, description="module-level constants of the task to change, "
                                                                  'e.g. {"batch_size": "16", "dim": "4096"}')


class _FleetTestInput(BaseModel):
    """Test every model of a manifest CSV (on the server's machine) in a container."""

    manifest: str = Field(min_length=1, description="path of the models CSV")


def tool_input(base: type[BaseModel], job: JobOptions) -> type[BaseModel]:
    """`base` (what names the job's input) plus the job's options, as the contracts declare them."""
    fields: dict[str, Any] = {
        r.option.key: (r.constrained, r.field())
        for r in job.resolved()}
    return create_model(base.__name__.strip("_").replace("Input", "Args"), __base__=base, __doc__=base.__doc__,
                        **fields)


ConvertArgs = tool_input(_ConvertInput, CONVERT)
KernelArgs = tool_input(_KernelInput, KERNEL)
FleetTestArgs = tool_input(_FleetTestInput, FLEET_TEST)


class AnswerArgs(ProvideInput):
    """Answer a convert job waiting for input (NEEDS_INPUT): the questions' facts."""

    job_id: str = Field(min_length=1, description="the job's id, e.g. convert/20261124-101500-ab12")


class ListArgs(BaseModel):
    kind: JobKind | None = None
    status: JobStatus | None = None
    limit: int = Field(20, ge=1, le=500)
