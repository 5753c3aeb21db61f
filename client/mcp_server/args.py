"""What each job tool takes: the contracts' own fields (their types, defaults and bounds are the
contract's FieldInfo, so a tool cannot accept what the SDK would refuse), plus descriptions an agent
reads. tests/unit/test_mcp_tools.py checks every field against its contract's schema."""

from __future__ import annotations

from pydantic import BaseModel, Field

from contracts.common import JobKind, JobStatus
from contracts.convert import OutputKind, Precision
from contracts.convert_job import ConversionRequest, InputShape, ProvideInput
from contracts.fleet_job import FleetTestRequest, RunnerKind
from contracts.inspect import InspectRequest
from contracts.kernel import KernelTask

_C = ConversionRequest.model_fields
_K = KernelTask.model_fields
_F = FleetTestRequest.model_fields


class InspectArgs(BaseModel):
    """Resolve, record and store a model (a path on the server's machine, file:// or s3:// URI, catalog name)."""

    model: str = InspectRequest.model_fields["model"]


class ConvertArgs(BaseModel):
    """Convert a model for a Qualcomm SoC and precision. Leave soc or precision out and the job asks
    (the task goes input_required; answer with tasks/update or the `answer` tool)."""

    model: str = Field(min_length=1, description="path on the server's machine, file:// or s3:// URI, or catalog name")
    soc: str | None = Field(_C["target_soc"].default, description='target SoC, e.g. "sm8550"; omitted: the job asks')
    precision: Precision | None = Field(_C["precision"].default, description="omitted: the job asks")
    output: OutputKind = _C["output"]
    preset: str = Field(_C["preset"].default, pattern="^(fast|balanced|max_perf)$",
                        description="how hard to try: fast | balanced | max_perf")
    calibration: str | None = Field(_C["calibration"].default,
                                    description="calibration .npz (input name -> [N, *shape]) or a folder of them")
    min_cosine: float | None = Field(_C["min_cosine"].default, ge=0.0, le=1.0,
                                     description="accuracy gate: worst output cosine vs fp32; 0 accepts a lossy result")
    max_replans: int = _C["max_replans"]
    eval_data: str | None = Field(_C["eval_data"].default,
                                  description="held-out .npz the accuracy gate scores, kept apart from calibration")
    synthetic_calibration: bool = Field(_C["synthetic_calibration"].default,
                                        description="int8/w8a16 without calibration data: calibrate on synthetic "
                                                    "inputs (verdict: unverified on real data); false: the job asks")
    precision_fallback: bool = Field(_C["precision_fallback"].default,
                                     description="may deliver a wider precision (int8 -> w8a16) to meet the gate")
    input_shapes: dict[str, InputShape] = Field(default_factory=dict,
                                                description='static input shapes, e.g. {"pixel_values": {"dims": '
                                                            '[1, 3, 224, 224]}}: a PyTorch model\'s export shapes')


class KernelArgs(BaseModel):
    """Write and verify a Triton kernel for a KernelBench-format task file on the server's machine."""

    task_file: str = Field(min_length=1, description="path of the task .py (class Model, get_inputs, get_init_inputs)")
    arch: str = Field("cpu", min_length=1, description="cpu-interpreter (cpu) or a GPU target (a100, h100, ...)")
    workflow: str = Field(_K["workflow"].default, description="default | coder_only | with_optimizer | akg_style")
    num_candidates: int = _K["num_candidates"]
    max_step: int | None = _K["max_step"]
    sets: dict[str, str] = Field(default_factory=dict, description="module-level constants of the task to change, "
                                                                  'e.g. {"batch_size": "16", "dim": "4096"}')


class FleetTestArgs(BaseModel):
    """Test every model of a manifest CSV (on the server's machine) in a container."""

    manifest: str = Field(min_length=1, description="path of the models CSV")
    runner: RunnerKind = _F["runner"]
    concurrency: int = _F["concurrency"]
    require_approval: bool = Field(_F["require_approval"].default,
                                   description="a person approves each command (the `approve` tool)")
    test_timeout_s: float = _F["test_timeout_s"]


class AnswerArgs(ProvideInput):
    """Answer a convert job waiting for input (NEEDS_INPUT): the questions' facts."""

    job_id: str = Field(min_length=1, description="the job's id, e.g. convert/20261124-101500-ab12")


class ListArgs(BaseModel):
    kind: JobKind | None = None
    status: JobStatus | None = None
    limit: int = Field(20, ge=1, le=500)
