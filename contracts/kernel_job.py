"""The kernel job: its request and result, and the kernel activities' request/result models
(STYLE G4). The task, workflow.yaml model and routing decisions live in contracts.kernel."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, JsonValue, SerializationInfo, SerializerFunctionWrapHandler, model_serializer

from contracts.agents import AgentProvenance
from contracts.common import ArtifactRef, Failure, JobStatus, TaskQueues, TokenTotals
from contracts.kernel import (
    ConductorConfig,
    FinishReason,
    KernelTask,
    LLMDecision,
    Number,
    OutputFormat,
    StaticReport,
    TimeLimit,
)
from contracts.messages import TokenUsage
from pydantic_core import to_jsonable_python

Provider = Literal["offline", "openai"]
"""Who answers the LLM agents (designer, coder, optimizer, conductor analysis)."""


class ActivityMessage(BaseModel, frozen=True):
    """A kernel activity's request or result: it lives in the workflow history only, where it is sent without
    its default fields, its nested models' too (empty strings, lists and refs, zero usage: a third of a whole
    model's history). Validation restores them. Python-mode dumps keep every field. Keep a recorded result's
    defaults as they are: a replay reads the current ones."""

    @model_serializer(mode="wrap")
    def _without_defaults(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        full = handler(self)
        if info.mode != "json":
            return full
        slim = {}
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if name not in full or (not field.is_required() and value == field.get_default(call_default_factory=True)):
                continue
            slim[name] = _dumped_without_defaults(value) if not isinstance(value, ActivityMessage) else full[name]
        return slim


def _dumped_without_defaults(value: Any) -> Any:
    """A field's JSON value, its models dumped without their default fields."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, list) and any(isinstance(v, BaseModel) for v in value):
        return [_dumped_without_defaults(v) for v in value]
    return to_jsonable_python(value)


class Mismatch(BaseModel, frozen=True):
    trial: int
    family: str = ""
    """The input distribution of that run (task, signed_normal, large, near_zero)."""
    output: int
    """Which output tensor of the forward (0 for a single tensor)."""
    index: list[int]
    held_out: bool = False
    """The run used the held-out sizes (VerifierReport.held_out), not the task's own."""
    expected: float | str
    got: float | str
    """Non-finite values as "nan"/"inf"/"-inf" (JSON has no NaN)."""


class TorchOpUse(BaseModel, frozen=True):
    """One aten op a candidate's forward ran as a torch op outside its Triton launches
    (activities/kernels/torch_work.py says which ops are allowed there)."""

    op: str
    """The op's name without overload (`relu`, `addmm`, `_softmax`)."""
    overload: str = ""
    """The aten overload that ran (`aten.relu.default`)."""
    line: int = 0
    """The innermost line of candidate.py on the call stack (0 when no candidate frame was found)."""
    code: str = ""
    """That line's source."""
    in_reference: bool = False
    """The reference's traced graph computes this op: torch did the task's own arithmetic."""


class GpuCompileCheck(BaseModel, frozen=True):
    """Whether a candidate verified on the CPU interpreter compiles for the job's GPU (activities/kernels/gpu_compile:
    Triton's own compiler, no GPU needed). It says nothing about speed."""

    target: str
    """`sm_90 (H100 SXM5 80GB)`: the job's roofline GPU."""
    compiles: bool | None
    """None: not checked (`note` says why: a forward that reads values cannot run on the meta device)."""
    kernels: list[str] = Field(default_factory=list)
    """The kernels the candidate's forward launches."""
    max_shared_bytes: int = 0
    """The most shared memory one of them needs per program."""
    note: str = ""
    """The failing kernel and the compiler's message, or why nothing was checked."""

    @property
    def summary(self) -> str:
        if self.compiles is None:
            return f"GPU compile for {self.target} {self.note}"
        if not self.compiles:
            return f"does not compile for {self.target}: {self.note}"
        shared = (f"at most {-(-self.max_shared_bytes // 1024)} KB shared memory a program" if self.max_shared_bytes
                  else "no shared memory")
        return f"compiles for {self.target} ({len(self.kernels)} kernel(s), {shared})"


AS_TORCH = "as torch on NaN/Inf inputs"
"""How `VerifierReport.special_values` begins when the candidate's outputs there are torch's."""


class VerifierReport(BaseModel, frozen=True):
    passed: bool
    reason: str
    """Empty when passed; otherwise one line a coder can act on."""
    mismatches: list[Mismatch] = Field(default_factory=list)
    """The first 10 differing elements."""
    static: StaticReport
    durations: dict[str, float] = Field(default_factory=dict)
    """Seconds per phase: static, reference, candidate, compare."""
    input_family: str = ""
    """Which input distribution the failing trial used (task, signed_normal, large, near_zero)."""
    families: list[str] = Field(default_factory=list)
    """The input distributions every trial set ran (the task's own get_inputs first)."""
    log: str = ""
    """A bounded excerpt of the candidate's log when it crashed: the traceback frames in the candidate's
    own file (file:line and the source line) and the error, not only the last line."""
    torch_ops: list[TorchOpUse] = Field(default_factory=list)
    """The ops torch computed outside the candidate's Triton launches (at most 10): set when that was the
    rejection, or when the workflow allows mixed kernels (then named, not rejected)."""
    held_out: dict[str, Number] = Field(default_factory=dict)
    """The held-out sizes (task constants) the candidate was also verified at; empty when none ran."""
    shapes_note: str = ""
    """"verified at its own shapes only: <why>" when no held-out size set could run."""
    confinement: str = ""
    """Empty when the candidate ran in the sandbox; the operator's opt-out (FLEETFORGE_SANDBOX=off) otherwise."""
    time_limit_s: float = 0.0
    """The candidate's time limit (TimeLimit.for_reference of the reference's time; 0 when it never ran)."""
    reference_s: float = 0.0
    """The reference child's time on the same runs (measured now, or when its outputs were cached)."""
    accuracy_note: str = ""
    """Set when the fp32 outputs disagreed and the reference ran again in float64 to tell which side is off."""
    special_values: str = ""
    """For a passing candidate: whether its outputs on inputs holding NaN, +Inf and -Inf are torch's (AS_TORCH ...),
    how they differ, or why that was not checked. Advisory: the verdict is about finite inputs."""
    timed_out: bool = False
    """The candidate was killed at its time limit (`reason` says when, and what had finished by then)."""
    gpu_compile: GpuCompileCheck | None = None
    """On the CPU interpreter, for a candidate right on every run: whether its kernels compile for the job's GPU
    (None: a GPU run, a failing candidate, or a report from before the check)."""


# --- the reference, read by tracing it -------------------------------------------------------


class TensorSpec(BaseModel, frozen=True):
    shape: list[int]
    """The traced sizes (a symbolic trace's hints): for decisions, never written into a candidate."""
    dtype: str
    """torch dtype name without the prefix: float32, int64, ..."""
    sizes: list[str] = Field(default_factory=list)
    """A symbolic trace's sizes, one Python expression per dim over the symbols of `ReferenceAnalysis.symbols`
    (`s0*s1`, `(s2//4)`, `64`); empty when every size is a constant or the trace was concrete."""


class InputSpec(BaseModel, frozen=True):
    kind: Literal["tensor", "scalar", "other"]
    tensor: TensorSpec | None = None
    value: float | int | bool | None = None
    """A scalar input's value (the traced get_inputs())."""


class ParamSpec(BaseModel, frozen=True):
    name: str
    """Dotted name on the Model (`ln.weight`); a buffer's too."""
    tensor: TensorSpec


class AtenCall(BaseModel, frozen=True):
    """One aten op of the traced forward. Arguments are JSON; a tensor argument is a reference
    `{"ref": "input"|"param"|"node", "index": i}` (node = an earlier call's output, `item` for a tuple)."""

    op: str
    """e.g. `aten.mean.dim`, `getitem`."""
    args: list[JsonValue] = Field(default_factory=list)
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    out: list[TensorSpec] = Field(default_factory=list)


class SymbolSource(BaseModel, frozen=True):
    """Where a size symbol of the trace comes from at run time: `inputs[input].shape[dim]`."""

    input: int
    dim: int


class ReferenceAnalysis(BaseModel, frozen=True):
    """What the reference computes, read from a trace of `Model.forward` on the task's inputs
    (meta tensors: shapes and dtypes, no data), and how big the task is."""

    inputs: list[InputSpec] = Field(default_factory=list)
    params: list[ParamSpec] = Field(default_factory=list)
    calls: list[AtenCall] = Field(default_factory=list)
    outputs: list[JsonValue] = Field(default_factory=list)
    """References to what forward returns."""
    symbols: dict[str, SymbolSource] = Field(default_factory=dict)
    """A symbolic trace's size symbols (the forward inputs' sizes that stayed free). Sizes computed from them in
    forward come as `{"sym": "s0*s1", "hint": 14}` arguments, and outputs carry `TensorSpec.sizes`; empty when
    the trace was concrete (the symbolic one failed)."""
    specialized: dict[str, Number] = Field(default_factory=dict)
    """Size expressions over the symbols that forward's Python code turned into plain numbers, with their traced
    values (`for t in range(x.size(0))` unrolls the loop that many times, `int(n)` bakes n in): the traced graph
    holds only where they have these values, so no general kernel is lowered from it."""
    constants: dict[str, Number] = Field(default_factory=dict)
    """The task file's module-level numeric constants (after --set)."""
    input_bytes: int = 0
    param_bytes: int = 0
    trace_error: str = ""
    """Why the forward could not be traced (the offline agents then have no template; an LLM can still work)."""
    held_out: dict[str, Number] = Field(default_factory=dict)
    """A second size set (task constants, odd, at least one dimension changed, within the memory bound) the
    verifier also runs reference and candidate at, so a kernel that assumes the sample's sizes fails
    (activities/kernels/held_out.py); empty when none could be derived (`held_out_note` says why)."""
    held_out_note: str = ""
    """Why the task has no held-out sizes ("verified at its own shapes only: ...")."""
    artifact: ArtifactRef | None = None
    """This analysis as JSON in the artifact store: agent requests carry this ref, not the trace. The
    trace_reference result carries no trace (`without_trace`): a whole model's is hundreds of KiB."""
    source: ArtifactRef | None = None
    """The task's source in the artifact store (KernelTask.stored)."""
    ops: list[str] = Field(default_factory=list)
    """The distinct aten ops, kept when the trace is left out (`aten_ops`)."""
    family: str = ""
    """What the offline designer recognised (`elementwise(relu)`), or "no offline template: why"."""
    size_problem: str = ""
    """Why the CPU verifier cannot hold the task ("" when it can: reference.size_problem)."""

    def without_trace(self, **update: object) -> "ReferenceAnalysis":
        """This analysis as the workflow keeps it: no calls, outputs or parameters (they stay in `artifact`),
        its distinct ops kept, and `update` (artifact, source, family, size_problem) set."""
        return self.model_copy(update={"calls": [], "outputs": [], "params": [], "ops": self.aten_ops, **update})

    @property
    def aten_ops(self) -> list[str]:
        """The distinct ops the forward ran, in order (getitem left out)."""
        if self.ops:
            return list(self.ops)
        seen: list[str] = []
        for c in self.calls:
            if c.op != "getitem" and c.op not in seen:
                seen.append(c.op)
        return seen


class TraceReferenceRequest(ActivityMessage, frozen=True):
    task: KernelTask
    timeout_s: float = Field(default=120.0, gt=0)


# --- the offline designer's template choice ---------------------------------------------------


class Operand(BaseModel, frozen=True):
    """An operand of a plan op: the tensor input `x`, an earlier op's value, a scalar forward input
    (passed to the kernel at run time), a constant, or a parameter of the Model (by name)."""

    kind: Literal["x", "value", "scalar", "const", "param"]
    index: int = 0
    value: float = 0.0
    name: str = ""


class PlanOp(BaseModel, frozen=True):
    op: str
    """Our op vocabulary (relu, gelu, add, sum, amax, argmax, ...), read from the aten op."""
    args: list[Operand] = Field(default_factory=list)
    attrs: dict[str, JsonValue] = Field(default_factory=dict)
    """The op's non-tensor arguments: approximate, negative_slope, alpha, eps, ..."""


class KernelPlan(BaseModel, frozen=True):
    """The offline designer's plan: `lowered`, the traced graph lowered by the offline compiler
    (activities.kernels.compiler); the coder lowers the traced reference again, so the plan carries only its label
    (history stays small). The other templates and the fields after `label` are those of the retired template
    designer, kept so recorded histories still decode.
    """

    template: Literal["elementwise", "rowwise", "matmul", "lowered"]
    label: str
    """What the designer recognised, for people: `lowered: convolution → relu` (the compute ops, in order)."""
    x: int = 0
    inputs: list[int] = Field(default_factory=list)
    scalars: list[int] = Field(default_factory=list)
    """Forward arguments that are Python scalars (passed to the kernel at run time)."""
    params: list[str] = Field(default_factory=list)
    ops: list[PlanOp] = Field(default_factory=list)
    dims: list[int] = Field(default_factory=list)
    keepdim: bool = False
    transpose_a: bool = False
    transpose_b: bool = False
    batched: bool = False
    vector: bool = False
    """matmul: the second operand is a vector (aten.mv)."""
    out_dtype: str = "float32"


class KernelDesign(BaseModel, frozen=True):
    """The designer's structured plan for the coder."""

    family: str
    """elementwise, rowwise, matmul, or what an LLM designer called it."""
    block_sizes: dict[str, int] = Field(default_factory=dict)
    grid: str = ""
    tiling: str = ""
    notes: str = ""
    sketch: str = ""
    """Free-form design text (an AKG designer's `code` field: pseudocode)."""
    fields: dict[str, JsonValue] = Field(default_factory=dict)
    """Other output fields the workflow.yaml asked for, as answered."""
    plan: KernelPlan | None = None
    """The offline designer's template choice (the offline coder renders it)."""


class AgentCall(BaseModel, frozen=True):
    """How one agent activity ran, for the trace: the rendered prompt and the raw answer live in the
    artifact store (history carries refs), plus the provider's token usage."""

    provider: Provider = "offline"
    prompt: ArtifactRef | None = None
    output: ArtifactRef | None = None
    usage: TokenUsage = Field(default_factory=TokenUsage)
    latency_s: float = 0.0
    transcript: ArtifactRef | None = None
    """The call's transcript (request and normalised answer), the same shape for every provider."""


class Rejection(StrEnum):
    """Why an agent's answer was refused; the conductor ends differently for each."""

    UNUSABLE = "UNUSABLE"
    """Unparseable, or a mandatory output field missing."""
    STATIC = "STATIC"
    """The candidate failed the static checks (no kernel launch, forbidden import, syntax)."""
    DUPLICATE = "DUPLICATE"
    """The candidate is identical (sha256) to one the verifier already rejected."""
    NO_TEMPLATE = "NO_TEMPLATE"
    """The offline agent has no template for the reference's aten ops."""


class DesignRequest(ActivityMessage, frozen=True):
    task: KernelTask
    suggestion: str = ""
    step: int = 1
    llm: Provider = "offline"
    reference: ArtifactRef | None = None
    """The traced reference (ReferenceAnalysis.artifact): the offline designer chooses its template from it."""
    output: OutputFormat | None = None
    """The workflow.yaml's output_format for the designer: parser and mandatory fields."""
    repair: list[str] = Field(default_factory=list)
    """Why this decision's earlier answers were refused (the ladder's repair rounds), oldest first."""


class DesignResult(ActivityMessage, frozen=True):
    parsed_ok: bool
    design: KernelDesign | None = None
    artifact: ArtifactRef | None = None
    reason: str = ""
    """Why the answer was unusable (empty when parsed)."""
    rejection: Rejection | None = None
    call: AgentCall = Field(default_factory=AgentCall)


class Attempt(BaseModel, frozen=True):
    """An earlier candidate and what the verifier said about it (the coder's bounded history)."""

    step: int
    candidate: ArtifactRef
    verdict: str


class RejectedCandidate(BaseModel, frozen=True):
    """A candidate the verifier rejected: an identical one (same sha256) is not verified again."""

    sha256: str
    step: int
    verdict: str


class LaunchCost(BaseModel, frozen=True):
    """What one Triton launch (or one torch op outside the launches) moved and computed, counted by the Triton
    interpreter during the candidate's first forward call (activities/kernels/traffic.py)."""

    kernel: str
    """The @triton.jit function's name, or `torch:<op>` for a torch op the forward ran outside its launches."""
    programs: int = 1
    """Programs of the grid (product of its dims); of the GPU's grid where the launcher declares it
    (activities/kernels/traffic.py)."""
    loaded: int = 0
    stored: int = 0
    """Bytes the launch's tl.load / tl.store requests moved, masked lanes excluded (every re-read counts)."""
    unique_loaded: int = 0
    unique_stored: int = 0
    """Distinct bytes read / written in the launch: the DRAM traffic when re-reads within a launch hit the cache."""
    flops: int = 0
    """Floating-point arithmetic outside tl.dot (one per element of the block, reductions one per input element)."""
    dot_flops: int = 0
    """2*M*N*K of the tl.dot calls on fp32 operands with input_precision="ieee" (CUDA cores)."""
    tf32_flops: int = 0
    """tl.dot on fp32 operands in TF32 (Triton's default input_precision): tensor cores, 10-bit mantissa."""
    half_flops: int = 0
    """tl.dot on fp16 / bf16 / fp8 operands (tensor cores)."""


class ModeledSpeed(BaseModel, frozen=True):
    """Speed on a named GPU modeled from what the interpreter saw the candidate move and compute, beside the
    task's speed-of-light floor and the eager reference's modeled time (activities/kernels/cost_model.py).
    Always labelled modeled: on a GPU the measured KernelTiming stands beside it."""

    gpu: str
    """The roofline GPU (h100, a100, l40s, b200)."""
    precision: str = "strict"
    sol_ms: float
    """Speed of light: the task's floor (inputs, parameters and outputs moved once; its compute ops' FLOPs)
    on the GPU's roofline, plus one launch."""
    modeled_ms: float
    """The candidate: every launch's roofline time (its distinct bytes, its FLOPs, its grid's share of the SMs)
    plus its launch overhead."""
    eager_ms: float
    """The reference in eager mode: every aten op of the traced graph on the roofline, plus one launch each."""
    speedup: float
    """eager_ms / modeled_ms."""
    sol_fraction: float
    """sol_ms / modeled_ms (1.0 = at the speed of light)."""
    score: float
    """SOL-ExecBench's S = 1 / (1 + (T_k - T_SOL) / (T_b - T_SOL)), T_b the modeled eager time: 0.5 = as fast as
    the baseline, 1 = at the speed of light."""
    traffic_ratio: float
    """The candidate's DRAM bytes / the floor's bytes (1.0 = every input, parameter and output moved once)."""
    launches: int
    eager_launches: int = 0
    bytes: int = 0
    """The candidate's DRAM bytes (distinct bytes per launch, summed)."""
    floor_bytes: int = 0
    floor_flops: int = 0
    memory_bound: bool = True
    """The floor's arithmetic intensity is under the GPU's ridge point."""
    worst: str = ""
    """The launch that costs most, with its figures (what an optimizer should look at first)."""
    breakdown: ArtifactRef | None = None
    """Per launch and per eager op figures (JSON in the artifact store; the history carries this ref)."""

    @property
    def summary(self) -> str:
        """One line for the trace, the CLI and the Web UI, labelled modeled."""
        return (f"modeled on {self.gpu.upper()} ({self.precision}): {self.speedup:.2f}x over eager "
                f"({self.modeled_ms:.4f} ms vs {self.eager_ms:.4f} ms), {self.sol_fraction:.0%} of SOL "
                f"({self.sol_ms:.4f} ms), traffic {self.traffic_ratio:.2f}x the floor, {self.launches} launch(es), "
                f"S={self.score:.2f}")


class CodeRequest(ActivityMessage, frozen=True):
    """The coder's (or optimizer's) context: the workflow sends this, never a prompt string."""

    task: KernelTask
    role: str = "coder"
    design: KernelDesign | None = None
    feedback: str = ""
    """The last verifier report's reason, when it failed."""
    log: str = ""
    """The last verifier report's bounded log excerpt (the candidate's own file/line and the error)."""
    input_family: str = ""
    """The input distribution the last candidate failed on."""
    mismatches: list[Mismatch] = Field(default_factory=list)
    """The last verifier report's first mismatches (index, expected, got)."""
    attempts: list[Attempt] = Field(default_factory=list)
    """The last few candidates (refs; the activity loads their sources), oldest first."""
    suggestion: str = ""
    step: int = 1
    candidate_index: int = 0
    """Which of the round's `num_candidates` parallel attempts this is."""
    llm: Provider = "offline"
    reference: ArtifactRef | None = None
    """The traced reference (ReferenceAnalysis.artifact), for the offline coder's lowering."""
    output: OutputFormat | None = None
    repair: list[str] = Field(default_factory=list)
    """Why this decision's earlier answers were refused (parse, static checks, duplicate), oldest first."""
    rejected: list[RejectedCandidate] = Field(default_factory=list)
    """Every candidate the verifier rejected so far: an identical answer is refused, not verified again."""
    modeled: ModeledSpeed | None = None
    """The optimizer's feedback: the best verified candidate's modeled speed (its `breakdown` says which launch
    moves how many bytes; the activity renders it into the prompt)."""
    tried: list[str] = Field(default_factory=list)
    """The offline optimizer's rewrites tried so far (kept or reverted), so it proposes the next one."""


class CodeResult(ActivityMessage, frozen=True):
    parsed_ok: bool
    candidate: ArtifactRef | None = None
    """The candidate source (text/x-python)."""
    rewrite: str = ""
    """The offline optimizer's answer: which rewrites its candidate applies (`rows+epilogue`)."""
    reason: str = ""
    rejection: Rejection | None = None
    call: AgentCall = Field(default_factory=AgentCall)


class AnalyzeRequest(ActivityMessage, frozen=True):
    """The conductor's routing question (analyze.j2): which of `options` runs after `agent`."""

    task: KernelTask
    agent: str
    options: list[str]
    step: int
    last_result: str = ""
    """One line: what the last agent produced (e.g. the verifier's reason)."""
    recent: list[str] = Field(default_factory=list)
    """The attempt history, bounded: the last trace lines ("step 3 verifier: FAILED: ..."), oldest first."""
    llm: Provider = "openai"
    candidate: ArtifactRef | None = None
    """The last candidate (the activity loads its source into the prompt)."""
    report: VerifierReport | None = None
    """The verifier's full last report: reason, failing input family, mismatches, log excerpt."""
    repair: list[str] = Field(default_factory=list)


class AnalyzeResult(ActivityMessage, frozen=True):
    decision: LLMDecision | None = None
    """None when the answer was unusable; the workflow then applies the deterministic fallback."""
    reason: str = ""
    call: AgentCall = Field(default_factory=AgentCall)


class VerifyRequest(ActivityMessage, frozen=True):
    task: KernelTask
    candidate: ArtifactRef
    timeout_s: float = Field(default=120.0, gt=0)
    """A fixed time limit per child, used only when `time_limit` is None (requests from before it)."""
    time_limit: TimeLimit | None = None
    """The candidate's time limit as a multiple of the reference's time (KernelRequest / workflow.yaml)."""
    seed: int = 0
    trials: int = Field(default=2, ge=1, le=50)
    """Trial sets; each runs the task's own inputs and the other input families (same shapes/dtypes)."""
    held_out: dict[str, Number] = Field(default_factory=dict)
    """Held-out sizes (ReferenceAnalysis.held_out): the candidate must also be right there."""
    held_out_note: str = ""
    """Why there are none (shown in the report as "verified at its own shapes only")."""
    reference_ops: list[str] = Field(default_factory=list)
    """The reference's traced aten ops: the ones torch must not compute in the candidate's forward."""
    allow_mixed: bool = False
    """The workflow.yaml allows mixed kernels (torch may do part of the work; named, not rejected)."""
    reference: ArtifactRef | None = None
    """The traced reference (ReferenceAnalysis.artifact): the cost model's floor and eager baseline."""


class KernelTiming(BaseModel, frozen=True):
    """A verified candidate timed on the GPU (`triton.testing.do_bench` medians, milliseconds) against the
    reference in eager mode and under `torch.compile`; the baseline is the faster of the two."""

    candidate_ms: float
    eager_ms: float
    compile_ms: float | None = None
    """None when torch.compile could not run the reference (`compile_error` says why)."""
    compile_error: str = ""
    baseline: Literal["eager", "torch.compile"]
    ref_ms: float
    """The baseline's time (KernelBench's `ref_ms`)."""

    @property
    def speedup(self) -> float:
        return self.ref_ms / self.candidate_ms

    @property
    def summary(self) -> str:
        """One line for the trace, the CLI and the Web UI: the speedup and the three times behind it."""
        compiled = (f"torch.compile {self.compile_ms:.4f} ms" if self.compile_ms is not None
                    else f"torch.compile failed: {self.compile_error}")
        return (f"speedup {self.speedup:.2f}x over {self.baseline} (candidate {self.candidate_ms:.4f} ms; "
                f"eager {self.eager_ms:.4f} ms, {compiled}; do_bench medians)")


class VerifyResult(ActivityMessage, frozen=True):
    report: VerifierReport
    speed: str = ""
    """Profiler note (on CPU: speed is not measurable)."""
    timing: KernelTiming | None = None
    """Only when measured on a GPU."""
    modeled: ModeledSpeed | None = None
    """A passing candidate's modeled speed (Triton interpreter counts on a named GPU's roofline)."""

    @property
    def speedup(self) -> float | None:
        """Baseline time / candidate time, when measured."""
        return self.timing.speedup if self.timing else None


class TraceEntry(BaseModel, frozen=True):
    """One agent execution. Large text (prompt, raw answer, candidate) is referenced, not inlined."""

    step: int
    agent: str
    summary: str
    ok: bool
    artifact: ArtifactRef | None = None
    """The agent's product: design JSON or candidate source (the verified one for the verifier)."""
    fallback: bool = False
    """True when the conductor's LLM decision was unusable and a deterministic rule routed here."""
    routing: str = ""
    """How this agent was chosen: config, llm, or fallback (with the reason)."""
    provider: Provider | None = None
    prompt: ArtifactRef | None = None
    output: ArtifactRef | None = None
    transcript: ArtifactRef | None = None
    """The agent call's transcript (the same shape for the offline provider and an LLM)."""
    parse_error: str = ""
    candidates: list[ArtifactRef] = Field(default_factory=list)
    """Every candidate of a parallel round (coder) or verified in this step (verifier), when there were
    several; with one, `artifact` is it (the history holds each ref once). See `round_candidates`."""
    report: VerifierReport | None = None
    speed: str = ""
    modeled: ModeledSpeed | None = None
    """The verified candidate's modeled speed (verifier steps)."""
    started_at: datetime | None = None
    duration_s: float = 0.0
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    """This agent's LLM usage plus the routing analysis that chose it."""
    provenance: AgentProvenance | None = None
    """Who answered for this agent: the LLM (after how many repairs), the offline agent, or its fallback."""
    routing_provenance: AgentProvenance | None = None
    """Who chose this agent when the conductor had to decide (the routing analysis or its fallback rule)."""
    sizes: dict[str, Number] = Field(default_factory=dict)
    """The task file's constants set with --set for this run (the sizes this step worked on)."""

    @property
    def round_candidates(self) -> list[ArtifactRef]:
        """The candidates of this step, one or several."""
        return list(self.candidates) or ([self.artifact] if self.artifact is not None else [])


class RecordTraceRequest(ActivityMessage, frozen=True):
    previous: ArtifactRef | None = None
    """The trace.jsonl so far; the new entries are appended to it."""
    entries: list[TraceEntry]
    """This request is where the workflow history holds the trace (sent without default fields, like every
    ActivityMessage: a sixth of a trace); trace.jsonl has all."""


class KernelOutcome(StrEnum):
    VERIFIED = "VERIFIED"
    FAILED = "FAILED"
    MAX_STEPS = "MAX_STEPS"


class KernelRequest(BaseModel, frozen=True):
    task: KernelTask
    config: ConductorConfig
    """Validated at the edge (client or test) from the task's workflow.yaml."""
    queues: TaskQueues = TaskQueues()
    verify_timeout_s: float = Field(default=120.0, gt=0)
    """The reference probe's time limit (reading the task on the meta device); candidates get `time_limit`."""
    time_limit: TimeLimit | None = None
    """The verifier's time limit per candidate (a multiple of the reference's time, floor, ceiling); None:
    the workflow.yaml's `verifier.time_limit` (whose defaults are TimeLimit's)."""
    llm: Provider = "offline"
    """Filled from the settings by the client SDK; offline is the default and the fallback."""
    max_llm_answers: int = Field(default=3, ge=1, le=10, description="LLM answers per agent decision (the first "
                                                                     "and its repairs) before the offline agent answers")
    llm_rejections_before_fallback: int = Field(
        default=3, ge=1, le=50, description="LLM candidates the verifier may reject before the offline template's "
                                            "candidate is tried")
    """Tried once, when the offline agents have one."""

    @property
    def verifier_time_limit(self) -> TimeLimit:
        """The request's own time limit, else its workflow.yaml's."""
        return self.time_limit or self.config.verifier.time_limit


class KernelResult(BaseModel):
    outcome: KernelOutcome
    status: JobStatus
    finish_reason: FinishReason | None = None
    best_candidate: ArtifactRef | None = None
    report: VerifierReport | None = None
    steps: int = 0
    trace_artifact: ArtifactRef | None = None
    """The trace (trace.jsonl, one TraceEntry per agent step), read with `client.artifacts.kernel_trace`. The
    result carries its ref only, so the workflow history holds the trace once (record_trace's input); None when
    no step ran, or the store could not take it on a failure."""
    failure: Failure | None = None
    tokens: TokenTotals = Field(default_factory=TokenTotals)
    """Every agent answer (LLM and offline) and the routing analyses: calls, tokens, LLM latency."""
    speedup: float | None = None
    """Only when measured (GPU); on CPU see `speed`."""
    timing: KernelTiming | None = None
    """The best candidate's GPU timings (candidate, eager, torch.compile), when measured."""
    speed: str = ""
    modeled: ModeledSpeed | None = None
    """The best candidate's modeled speed on the task's roofline GPU (always labelled modeled)."""
    precision_used: str = "strict"
    """The precision policy the candidate was verified under (and its baselines timed and modeled under)."""
    overrides: dict[str, Number] = Field(default_factory=dict)
    """The task file's constants set with --set (the sizes this result is about)."""
    op_family: str = ""
    """What the offline designer recognised in the traced reference (`lowered: relu`), or why not."""
    aten_ops: list[str] = Field(default_factory=list)
    """The aten ops the reference's forward ran."""
    fallbacks: list[str] = Field(default_factory=list)
    """Every offline fallback of an LLM agent, one line each (step, agent, why)."""
    duplicates_refused: int = 0
    """Candidates identical to an already-rejected one, refused without running the verifier again."""
    shapes: str = ""
    """Which sizes the verified candidate was proven at: the task's and the held-out ones, or "verified at
    its own shapes only: <why>"."""
