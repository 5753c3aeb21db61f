"""The convert job: its request and result, the human-input update, and the toolchain activities'
request/result models (STYLE G4: one request and one result model per call)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from contracts.agents import AgentProvenance
from contracts.common import ArtifactRef, Failure, JobStatus, TaskQueues, TokenTotals
from contracts.convert import CompiledStep, ConversionPlan, OutputKind, Precision, Toolchain
from contracts.models import ModelRef
from contracts.runs import WorkspaceRef

NEEDS_INPUT_TIMEOUT_S = 7 * 24 * 3600
DEFAULT_MIN_COSINE: dict[Precision, float] = {
    Precision.FP32: 0.99, Precision.FP16: 0.99, Precision.INT8: 0.95, Precision.W8A16: 0.95, Precision.W4A16: 0.9,
}
"""The accuracy gate's default (ConversionRequest.min_cosine None): the worst output's cosine to the fp32
model, per requested precision. 4-bit weights keep 16 levels per output channel: a decoder's logits move
further than with 8 bits (a 2-layer LLaMA with seeded weights: 0.93 on the CPU's fake quantization), so
w4a16's floor is lower; --min-cosine raises it."""


def _gate_defaults() -> str:
    """DEFAULT_MIN_COSINE in words for the help, "0.99 fp32/fp16, 0.95 int8/w8a16" (written once, there)."""
    by_value: dict[float, list[str]] = {}
    for precision, cosine in DEFAULT_MIN_COSINE.items():
        by_value.setdefault(cosine, []).append(precision.value)
    return ", ".join(f"{cosine:g} {'/'.join(names)}" for cosine, names in by_value.items())
INPUT_DTYPES = ("float32", "float16", "int64", "int32", "bool")


class InputShape(BaseModel, frozen=True):
    """One model input's static shape (and, for a PyTorch model, its dtype): `--input-shape NAME=1,3,224,224`."""

    dims: list[int] = Field(min_length=0)
    dtype: Literal["float32", "float16", "int64", "int32", "bool"] = "float32"

    def spec(self, name: str) -> str:
        """The canonical `NAME=d1,d2:dtype` form tool steps take."""
        return f"{name}={','.join(map(str, self.dims))}:{self.dtype}"


def parse_input_shape(text: str) -> tuple[str, InputShape]:
    """"pixel_values=1,3,224,224" or "input_ids=1,128:int64" -> (name, InputShape); ValueError says what is wrong."""
    name, eq, rest = text.partition("=")
    dims_text, _, dtype = rest.partition(":")
    if not eq or not name.strip():
        raise ValueError(f"--input-shape {text!r}: expected NAME=d1,d2,... (e.g. pixel_values=1,3,224,224)")
    try:
        dims = [int(d) for d in dims_text.split(",") if d.strip()]
    except ValueError:
        raise ValueError(f"--input-shape {text!r}: dims must be integers separated by commas") from None
    if any(d < 1 for d in dims):
        raise ValueError(f"--input-shape {text!r}: every dim must be >= 1")
    if dtype and dtype not in INPUT_DTYPES:
        raise ValueError(f"--input-shape {text!r}: dtype must be one of {', '.join(INPUT_DTYPES)}")
    return name.strip(), InputShape(dims=dims, dtype=dtype or "float32")  # type: ignore[arg-type]


class ConversionRequest(BaseModel, frozen=True):
    """A conversion job. A field's `description` is its help in every front door (client/job_options.py:
    the CLI option, the MCP tool's input schema); the docstrings below it say what a reader of the code
    needs on top."""

    model: str = Field(min_length=1, description="model path, file:// or s3:// URI, or catalog name")
    """upload:// reference (a local model the SDK uploaded), s3:// URI, catalog name, or a path on the workers' disk."""
    target_soc: str | None = Field(None, description='target SoC, e.g. "sm8550" (omitted: the job asks)')
    """Case-insensitive; None: the job asks (NEEDS_INPUT)."""
    precision: Precision | None = Field(None, description="precision of the converted model (omitted: the job asks)")
    output: OutputKind = Field(OutputKind.QNN_CONTEXT_BINARY, description="what to build")
    toolchain: Toolchain = Field(Toolchain.AUTO, description="which tools (auto: the best installed)")
    calibration: str | None = Field(
        None, description="real inputs to calibrate on: an .npz (input name -> [N, *shape]) or a folder of them")
    """As an upload:// reference (the SDK uploads local data: contracts/uploads.py), an s3:// URI, or an
    absolute path on the workers' disk. The job copies it into the workspace, content-addressed; None:
    seeded synthetic calibration."""
    min_cosine: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description=f"accuracy gate: worst output cosine to the fp32 model (default {_gate_defaults()}; "
                    "0 accepts a lossy result explicitly)")
    """None: the precision's default (DEFAULT_MIN_COSINE, read by converter_policy)."""
    preset: Literal["fast", "balanced", "max_perf"] = Field("balanced", description="how hard to try")
    """activities/toolchains/presets.py maps it to concrete tool args."""
    max_replans: int = Field(default=2, ge=0, le=10, description="new plans after a failed attempt")
    planner_max_tool_iters: int = Field(default=8, ge=1, le=64)
    user_id: str = "local"
    run_id: str = ""
    """Readable id chosen by the client; the workflow derives one when empty."""
    queues: TaskQueues = TaskQueues()
    needs_input_timeout_s: int = Field(default=NEEDS_INPUT_TIMEOUT_S, ge=1)
    rerun_of: str | None = None
    """Run id of an earlier conversion whose plan.json is reused (the planner is skipped)."""
    overrides: dict[str, str] = Field(default_factory=dict)
    """For a rerun: step args to change, e.g. {"soc": "sm8650"}; every step having that arg gets the value."""
    llm: Literal["offline", "openai"] = "offline"
    """Who plans: the deterministic offline planner, or the LLM (ReAct loop over planner tools)."""
    input_shapes: dict[str, InputShape] = Field(
        default_factory=dict, description='static input shapes, e.g. {"pixel_values": {"dims": [1, 3, 224, 224]}}: '
                                          "a PyTorch model's export shapes; an ONNX model's symbolic dims (others become 1)")
    """`--input-shape NAME=1,3,224,224` on the CLI; fix_input_dims applies them to an ONNX model."""
    eval_data: str | None = Field(
        None, description="evaluation inputs kept apart from the calibration data (default: a held-out part of "
                          "the calibration data, or synthetic inputs)")
    """Same format as `calibration`. Never a sample the quantizer calibrated on: without it, synthetic inputs of
    other families and seeds than the calibration's."""
    eval_samples: int = Field(default=32, ge=1, le=4096, description="samples the accuracy gate grades (at most "
                                                                     "half of the calibration data is held out)")
    synthetic_calibration: bool = Field(
        False, description="int8/w8a16 without calibration data: calibrate on synthetic inputs (the verdict says: "
                           "unverified on real data); without it the job asks for calibration data")
    precision_fallback: bool = Field(
        False, description="let the planner deliver a wider precision (int8 -> w8a16) to meet the accuracy gate; "
                           "without it the precision is the requested one and a fallback is only proposed")


class ProvideInput(BaseModel, frozen=True):
    """Answers to a NEEDS_INPUT job's questions (the `provide_input` update). Omitted = unchanged."""

    soc: str | None = Field(default=None, description='target SoC, e.g. "sm8550"')
    precision: str | None = Field(default=None, description="fp32, fp16, int8, w8a16 or w4a16")
    calibration: str | None = Field(default=None, description="calibration .npz or folder (optional)")
    eval_data: str | None = Field(default=None, description="held-out .npz the accuracy gate scores (optional)")
    synthetic_calibration: bool | None = Field(
        default=None, description="calibrate int8 on synthetic inputs: the verdict then says unverified on real data (optional)")

    def is_empty(self) -> bool:
        return self.synthetic_calibration is None and not any(
            (v or "").strip() for v in (self.soc, self.precision, self.calibration, self.eval_data))


class AttemptRecord(BaseModel, frozen=True):
    """One plan → compile → execute → evaluate attempt and why it ended."""

    attempt: int
    outcome: str
    """"compile_rejected", "execution_failed", "repeated_plan", "below_threshold", "not_offloaded" or "succeeded"."""
    feedback: str = ""
    remedies: list[str] = Field(default_factory=list)
    """The remedies the attempt's plan applied."""


class OutputFigures(BaseModel, frozen=True):
    """One graph output of the converted model against the fp32 model: per-sample cosines and their
    spread, errors over every sample."""

    name: str
    cosine: float
    """The gate's figure: the lowest per-sample cosine (before per-sample figures: the pooled cosine)."""
    max_abs: float
    mean_abs: float
    sqnr_db: float
    """Signal-to-quantization-noise ratio (onnxruntime.quantization.qdq_loss_debug's formula)."""
    nonfinite_mismatches: int = 0
    """Positions where exactly one of the two models gave NaN/Inf (counted as wrong)."""
    samples: int = 0
    """Samples the per-sample figures are over (0: a report from before them)."""
    cosine_p05: float | None = None
    """5th percentile of the per-sample cosines (the lower of two neighbours: a value some sample had)."""
    cosine_median: float | None = None
    cosine_mean: float | None = None
    cosine_std: float | None = None
    """Spread of the per-sample cosines."""
    cosine_pooled: float | None = None
    """Cosine over every sample concatenated. It hides a single bad sample but sees what per-sample
    cosines cannot: outputs of the right direction and the wrong size (a clipped large sample)."""
    top1_agreement: float | None = None
    """For a classifier-like output (one axis of 2+ classes): share of samples whose argmax equals the
    fp32 model's. None: not a classifier output."""

    def misses(self, threshold: float) -> bool:
        """Below the accuracy gate: a sample's output points elsewhere (per-sample cosine), the sizes
        are off across samples (pooled cosine), or NaN/Inf where the fp32 model has none."""
        pooled = self.cosine_pooled if self.cosine_pooled is not None else 1.0
        return min(self.cosine, pooled) < threshold or self.nonfinite_mismatches > 0


class OffloadReport(BaseModel, frozen=True):
    """Where the nodes of a QNN context model run: inside the HTP context binary, or on the CPU."""

    nodes_total: int
    """Nodes of the model the compiler was given."""
    context_nodes: int
    """EPContext nodes (HTP partitions) in the context model."""
    cpu_nodes: int
    """Nodes left outside every partition (they run on the CPU EP), not counting the boundary
    QuantizeLinear/DequantizeLinear that convert float graph inputs/outputs."""
    cpu_ops: list[str] = Field(default_factory=list)
    """Op types of those CPU nodes, sorted, each once."""
    io_nodes: int = 0
    """The boundary QuantizeLinear/DequantizeLinear of `nodes_total` that convert a QDQ model's float inputs and
    outputs on the CPU: its interface, not its compute, so neither inside the binary nor in `cpu_nodes`."""

    @property
    def model_nodes(self) -> int:
        """The nodes that do the model's work: `nodes_total` less the boundary conversions."""
        return self.nodes_total - self.io_nodes

    @computed_field  # type: ignore[prop-decorator]
    @property
    def share(self) -> float:
        """Share of the model's nodes (`model_nodes`) that run inside the context binary (1.0 = fully offloaded)."""
        if self.model_nodes <= 0:
            return 0.0
        return max(0.0, 1.0 - self.cpu_nodes / self.model_nodes) if self.context_nodes else 0.0

    def io_note(self) -> str:
        """"; N more convert its float inputs/outputs on the CPU", or "" for a model without them."""
        return f"; {self.io_nodes} more convert its float inputs/outputs on the CPU" if self.io_nodes else ""

    @property
    def full(self) -> bool:
        return self.context_nodes > 0 and self.cpu_nodes == 0


class SensitiveLayer(BaseModel, frozen=True):
    """A layer kept at 16-bit activations in an otherwise 8-bit model, and why."""

    node: str
    op_type: str
    tensor: str
    """Its output activation (quantized at 16 bits)."""
    cosine_gain: float
    """What quantizing this layer's output in float instead of 8 bits gave back alone (mean per-sample
    cosine of the worst output to the fp32 model, on the calibration samples): its share of the error."""


class MixedPrecisionReport(BaseModel, frozen=True):
    """The mixed-precision search's choice (activities/toolchains/mixed_precision.py): the fewest most
    sensitive layers at 16 bits whose model reached the target on the calibration samples."""

    layers_total: int
    """Layers whose activation precision could be chosen (compute nodes with quantized outputs)."""
    sixteen_bit: list[SensitiveLayer] = Field(default_factory=list)
    """The layers at 16-bit activations, most sensitive first."""
    cosine_int8: float
    """The gate's figure of the all-8-bit model on the calibration samples (CPU, fake quantization)."""
    cosine_mixed: float
    """The same figure with `sixteen_bit` at 16 bits."""
    target: float
    """What the search aimed at (between the gate's threshold and 1: a margin for the HTP and unseen samples)."""
    samples: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def share(self) -> float:
        """Share of the layers at 16 bits."""
        return len(self.sixteen_bit) / self.layers_total if self.layers_total else 0.0


class EvaluationReport(BaseModel, frozen=True):
    """The converted model against the fp32 original on the same inputs (calibration data when
    given, else seeded synthetic inputs that respect each input's dtype and role)."""

    reference: str
    candidate: str
    samples: int
    max_abs: float
    mean_abs: float
    cosine: float
    """The worst output's cosine (the figure the accuracy gate reads)."""
    candidate_provider: str
    seconds: float
    cached: bool = False
    """True when these figures were restored from the evaluation cache (same reference and candidate
    content, samples and seed) instead of running both models again."""
    outputs: list[OutputFigures] = Field(default_factory=list)
    inputs: Literal["synthetic", "calibration", "held_out", "eval_data"] = "synthetic"
    """Where the evaluation inputs came from: synthetic (seeded, other families than the calibration's),
    held_out (a part of the user's calibration data the quantizer never saw), eval_data (the user's
    separate evaluation set). "calibration": a run from before held-out evaluation (in-sample)."""
    sqnr_db: float | None = None
    """The worst output's SQNR."""
    families: list[str] = Field(default_factory=list)
    """The synthetic input families the evaluation drew from (empty for user data)."""
    calibration: Literal["none", "data", "synthetic", "unknown"] = "none"
    """What the candidate was calibrated on (read from the steps that built it)."""
    calibration_samples: int = 0
    """Calibration samples checked against the evaluation samples: none of them is graded."""


Verdict = Literal["passed", "unverified", "accepted_lossy", "below_threshold", "not_offloaded", "unevaluated",
                  "not_evaluable"]
"""`passed`: the figures reach the threshold on at least the gate's minimum of real (held-out) samples, or
a float conversion on synthetic inputs; `unverified`: figures that reach it only on synthetic inputs (a
quantized model: accuracy unverified on real data) or on fewer samples than the minimum, never the same
word as a verified pass."""


class AccuracyVerdict(BaseModel, frozen=True):
    """What the accuracy gate decided, with the figures it decided on."""

    verdict: Verdict
    min_cosine: float
    """The threshold applied (the request's, or the precision's default)."""
    cosine: float | None = None
    sqnr_db: float | None = None
    offload_share: float | None = None
    """Share of nodes inside the HTP context binary (None: not a context binary)."""
    cpu_ops: list[str] = Field(default_factory=list)
    remedies: list[str] = Field(default_factory=list)
    """The planner's remedies applied to reach this result (e.g. "w8a16"), in order."""
    note: str = ""
    samples: int | None = None
    """Samples the gate graded (per-sample criterion: the lowest per-sample cosine of every output)."""
    inputs: str = ""
    """Where those samples came from (EvaluationReport.inputs)."""
    min_samples: int | None = None
    """The gate's minimum of graded samples (converter_policy.MIN_GRADED_SAMPLES); fewer: `unverified`."""
    hint: str = ""
    """What would verify an `unverified` result, for this job's precision and inputs."""


class ConversionProgress(BaseModel):
    """What the `status` query answers while the job runs."""

    status: JobStatus = JobStatus.RUNNING
    step: str = "starting"
    attempt: int = 0
    replans: int = 0
    questions: list[str] = Field(default_factory=list)
    last_error: str = ""
    steps_done: list[str] = Field(default_factory=list)


class ConversionResult(BaseModel):
    status: JobStatus
    run_id: str
    model: ModelRef | None = None
    workspace: WorkspaceRef | None = None
    artifacts: list[ArtifactRef] = Field(default_factory=list)
    evaluation: EvaluationReport | None = None
    accuracy: AccuracyVerdict | None = None
    """The accuracy gate's verdict and figures (None: a run from before the gate, or no output to judge)."""
    offload: OffloadReport | None = None
    """For a QNN context binary: which nodes run inside it and which ops fell back to the CPU."""
    mixed_precision: MixedPrecisionReport | None = None
    """The layers an int8 build keeps at 16-bit activations to meet the gate, and why (None: none)."""
    questions: list[str] = Field(default_factory=list)
    failure: Failure | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    cached_steps: list[str] = Field(default_factory=list)
    """Step ids whose outputs came from the step cache (no tool ran)."""
    executed_steps: list[str] = Field(default_factory=list)
    """Step ids whose tool actually ran."""
    warnings: list[str] = Field(default_factory=list)
    tokens: TokenTotals = Field(default_factory=TokenTotals)
    """Every planner answer, LLM or offline (an offline answer is a call with zero tokens)."""
    transcripts: list[ArtifactRef] = Field(default_factory=list)
    """The planner answers' transcripts in the store, in order (provider "offline" or the LLM's)."""
    planner: list[AgentProvenance] = Field(default_factory=list)
    """How each plan was decided (LLM, offline, or the offline fallback after refused LLM answers)."""
    finished_at: datetime | None = None
    requested_precision: Precision | None = None
    delivered_precision: Precision | None = None
    """What the artifacts compute in (read from the steps that built them): the requested precision
    unless the request allowed a fallback (precision_fallback), or the HTP has no such math (fp32)."""
    report: ConversionReport | None = None
    """The deployment report (also stored as `report/conversion_report.md` and `.json` artifacts)."""


# ---- toolchain activities -------------------------------------------------------------------


class PlanFeedback(BaseModel, frozen=True):
    """Why the previous plan's result was not good enough, in figures the offline planner can act on."""

    kind: Literal["accuracy", "offload", "compile"]
    """accuracy: below the gate; offload: nodes left on the CPU; compile: a step failed naming an op or a
    code a graph pass fixes (`failing_ops`, `code`)."""
    remedies: list[str] = Field(default_factory=list)
    """Remedies the previous plan already applied."""
    failed: list[str] = Field(default_factory=list)
    """Remedies whose plan could not run (tried, not applied again)."""
    float_outputs: list[str] = Field(default_factory=list)
    """Outputs the previous plan kept in float."""
    evaluation: EvaluationReport | None = None
    offload: OffloadReport | None = None
    min_cosine: float = 0.0
    failing_ops: list[str] = Field(default_factory=list)
    """For kind "compile": the op types the failure names."""
    code: str = ""
    """For kind "compile": the failing step's error code."""


class PlanRequest(BaseModel, frozen=True):
    request: ConversionRequest
    """The job's request with any human answers merged in."""
    model: ModelRef
    attempt: int = 0
    feedback: str = ""
    """Why the previous attempt failed (compiler rejections, executor error, accuracy figures)."""
    remedy: PlanFeedback | None = None
    """Accuracy/offload feedback: the offline planner answers with its next remedy, or the same plan."""


class CompileRequest(BaseModel, frozen=True):
    plan: ConversionPlan
    workspace: WorkspaceRef
    attempt: int = 0


class ExecuteStepRequest(BaseModel, frozen=True):
    step: CompiledStep
    workspace: WorkspaceRef


class StepResult(BaseModel, frozen=True):
    step_id: str
    tool_name: str
    cached: bool
    cache_key: str
    outputs: dict[str, ArtifactRef]
    """Workspace-relative path → artifact of every file the step wrote."""
    seconds: float = 0.0
    offload: OffloadReport | None = None
    """For a QNN context binary step: which nodes run inside the binary."""
    mixed_precision: MixedPrecisionReport | None = None
    """For a quantizer that searched for the layers to keep at 16 bits: which, and why."""
    confinement: str = ""
    """Empty when the tool's child ran in the sandbox; the operator's opt-out (FLEETFORGE_SANDBOX=off) otherwise."""


class RerunRequest(BaseModel, frozen=True):
    run_id: str
    overrides: dict[str, str] = Field(default_factory=dict)


class PlannerToolRequest(BaseModel, frozen=True):
    """One planner tool call (list_tools, get_tool_spec, dry_run) as the LLM made it."""

    name: str
    arguments: str = ""
    """The JSON text exactly as the model produced it."""
    workspace: WorkspaceRef


class PlannerToolResult(BaseModel, frozen=True):
    content: str
    is_error: bool = False


class CalibrationSource(BaseModel, frozen=True):
    """What one step of the plan calibrated on: a workspace .npz, or seeded synthetic samples."""

    step_id: str
    model: str
    """Workspace-relative model the step read (synthetic samples are generated for its inputs)."""
    data: str | None = None
    samples: int = 0
    seed: int = 0


class EvaluateRequest(BaseModel, frozen=True):
    workspace: WorkspaceRef
    reference: str
    candidate: str
    samples: int = 4
    seed: int = 1234
    calibration: str | None = None
    """Before held-out evaluation: the calibration .npz whose samples were the evaluation inputs."""
    source: str | None = None
    """Workspace-relative PyTorch model (.pt/.pt2) the `reference` ONNX was exported from: the reference
    outputs then come from the torch module itself, so the export is judged too."""
    evaluation: str | None = None
    """Workspace-relative .npz of evaluation samples (held out, or the user's --eval-data); None:
    synthetic inputs of the evaluation families."""
    held_out: bool = False
    """`evaluation` is a held-out part of the calibration data (else the user's separate set)."""
    calibrated_on: list[CalibrationSource] | None = None
    """What the candidate was calibrated on; the evaluation refuses to grade any of those samples.
    None: a request from before the check."""


class CalibrationRequest(BaseModel, frozen=True):
    """Copy the user's calibration data into the run's workspace (content-addressed) and check it
    against the model's inputs."""

    workspace: WorkspaceRef
    source: str
    """Absolute path, file:// or s3:// URI of an .npz or a folder of .npz files."""
    model: str
    """Workspace-relative model whose inputs the data must feed."""
    eval_source: str | None = None
    """The user's separate evaluation data (like `source`); None: hold out part of `source`."""
    eval_samples: int = 0
    """0: keep every sample for calibration (a request from before held-out evaluation); else hold
    out up to this many samples (at most half) for the accuracy gate, unless `eval_source` is given."""


class CalibrationRef(BaseModel, frozen=True):
    path: str
    """Workspace-relative canonical .npz (`input/calibration_<sha256 prefix>.npz`)."""
    sha256: str
    samples: int
    inputs: list[str]
    evaluation: str | None = None
    """Workspace-relative .npz of the evaluation samples (`input/evaluation_<sha256 prefix>.npz`)."""
    evaluation_samples: int = 0
    held_out: bool = False
    """The evaluation samples are held out of the user's calibration data (not a separate set)."""


class RecordFailureRequest(BaseModel, frozen=True):
    """Write logs/last_error.json for a failed job (whatever failed: compiler, tool, evaluation, gate)."""

    workspace: WorkspaceRef
    failure: Failure
    attempts: list[AttemptRecord] = Field(default_factory=list)


class PlacementRow(BaseModel, frozen=True):
    """One op type of a compiled model: how many nodes, and where they run."""

    op_type: str
    nodes: int
    htp: int = 0
    """Inside the HTP context binary."""
    cpu: int = 0
    """On the CPU, outside every HTP partition (a NOT_FULLY_OFFLOADED artifact has some)."""
    io: int = 0
    """On the CPU converting the float graph inputs/outputs (QuantizeLinear/DequantizeLinear at the
    boundary of a QDQ model; the offload share does not count them)."""


class ArtifactReport(BaseModel, frozen=True):
    name: str
    """Workspace-relative name."""
    sha256: str
    size: int
    role: str
    """What it is: "QNN context model", "HTP context binary", "QDQ ONNX model", ..."""
    placement: list[PlacementRow] = Field(default_factory=list)
    """Per op type (models only): where the nodes run."""


class ConversionReport(BaseModel, frozen=True):
    """What a deployment engineer reads about a finished conversion: per artifact where its ops run,
    the toolchain that built it, and the accuracy per output with its sample count and spread."""

    run_id: str
    model: str
    target_soc: str | None = None
    requested_precision: Precision | None = None
    delivered_precision: Precision | None = None
    artifacts: list[ArtifactReport] = Field(default_factory=list)
    toolchain: dict[str, str] = Field(default_factory=dict)
    evaluation: EvaluationReport | None = None
    accuracy: AccuracyVerdict | None = None
    mixed_precision: MixedPrecisionReport | None = None
    """The layers kept at 16-bit activations in an int8 build, and why."""
    warnings: list[str] = Field(default_factory=list)


class ReportRequest(BaseModel, frozen=True):
    workspace: WorkspaceRef
    report: ConversionReport
    """The facts the workflow knows (artifacts, verdict, figures); the activity adds placement and versions."""
    context_sources: dict[str, str] = Field(default_factory=dict)
    """Context model → the model its compile step was given (placement is counted against it)."""


class ReportResult(BaseModel, frozen=True):
    report: ConversionReport
    files: list[ArtifactRef] = Field(default_factory=list)
    """`report/conversion_report.md` and `report/conversion_report.json` in the store."""


ConversionResult.model_rebuild()
