"""Kernel jobs: the task, the conductor's workflow.yaml model, its state and its decisions.

workflow.yaml follows AKG's conductor format (agent_info with possible_next_agent and
output_format.parser_name / parser_definition.output_fields, start_agent, mandatory_llm_analysis,
limitation_info.required.max_step, limitation_info.optional.repeat_limits.single_agent / sequences);
the shorter forms of earlier fleetforge files (`fields`, a flat `repeat_limits` mapping,
`mandatory_analysis`) are accepted too. Everything a file names must exist: agents need an
implementation, parsers must be registered.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from contracts.common import ArtifactRef

FINISH = "finish"
"""The pseudo-agent that ends the run. Never declared in `agent_info`."""

AgentId = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]


class AgentName(StrEnum):
    """The agents fleetforge implements. A workflow.yaml may only route between these."""

    DESIGNER = "designer"
    CODER = "coder"
    VERIFIER = "verifier"
    OPTIMIZER = "optimizer"


CANDIDATE_AGENTS = frozenset({AgentName.CODER, AgentName.OPTIMIZER})
"""Agents whose product is a candidate the verifier must check."""

PARSER_FIELDS: dict[str, frozenset[str] | None] = {
    "code_parser": None,
    "coder_parser": None,
    "optimizer_parser": None,
    "designer_parser": None,
    "json_parser": None,
}
"""Registered answer parsers (activities/kernels/parsers.py implements them) and the output fields each
can fill (None: any). The code parsers read one fenced ```python block into the agent's one mandatory
field; designer_parser and json_parser read one JSON object and check its mandatory fields."""

CODE_PARSERS = frozenset({"code_parser", "coder_parser", "optimizer_parser"})


# --- workflow.yaml -------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OutputField(_Strict):
    field_type: Literal["str", "int", "float", "bool", "dict", "list"] = "str"
    mandatory: bool = True
    field_description: str = ""


class ParserDefinition(_Strict):
    output_fields: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], OutputField] = Field(min_length=1)


class OutputFormat(_Strict):
    parser_name: str = Field(min_length=1)
    parser_definition: ParserDefinition | None = None
    fields: dict[str, str] = Field(default_factory=dict)
    """Short form: field name -> description (mandatory str fields)."""

    @model_validator(mode="after")
    def _check_parser(self) -> "OutputFormat":
        if self.parser_name not in PARSER_FIELDS:
            raise ValueError(f"parser_name: unknown parser '{self.parser_name}' (registered: {', '.join(PARSER_FIELDS)})")
        allowed = PARSER_FIELDS[self.parser_name]
        unknown = [f for f in self.output_fields if allowed is not None and f not in allowed]
        if unknown:
            raise ValueError(f"output_fields: {self.parser_name} cannot fill {', '.join(unknown)} "
                             f"(it fills {', '.join(sorted(allowed or []))})")
        if self.parser_name in CODE_PARSERS and len(self.mandatory_fields) > 1:
            raise ValueError(f"output_fields: {self.parser_name} reads one fenced python block into one field; "
                             f"{len(self.mandatory_fields)} mandatory fields declared "
                             f"({', '.join(self.mandatory_fields)}); use json_parser for several")
        return self

    @property
    def output_fields(self) -> dict[str, OutputField]:
        fields = {name: OutputField(field_description=desc) for name, desc in self.fields.items()}
        if self.parser_definition is not None:
            fields.update(self.parser_definition.output_fields)
        return fields

    @property
    def mandatory_fields(self) -> list[str]:
        return [name for name, f in self.output_fields.items() if f.mandatory]


class AgentInfo(_Strict):
    possible_next_agent: list[AgentId] = Field(min_length=1)
    output_format: OutputFormat | None = None
    max_repeats: int = Field(default=3, gt=0)
    """How many times in a row this agent may run (self-loops)."""


class RequiredLimits(_Strict):
    max_step: int = Field(gt=0)
    """Most agent executions in one run."""


class SequenceLimit(_Strict):
    pattern: list[AgentId] = Field(min_length=1)
    max_repeats: int = Field(gt=0)
    """How many times in a row `pattern` may run; the agent that would start (or complete) one more
    repetition is not an option."""


class RepeatLimits(_Strict):
    single_agent: dict[AgentId, Annotated[int, Field(gt=0)]] = Field(default_factory=dict)
    """Per-agent override of `agent_info.<agent>.max_repeats` (consecutive runs)."""
    sequences: dict[str, SequenceLimit] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _flat_form(cls, data: Any) -> Any:
        """`repeat_limits: {coder: 2}` (earlier fleetforge files) means `single_agent: {coder: 2}`."""
        if isinstance(data, dict) and data and not ({"single_agent", "sequences"} & set(data)):
            return {"single_agent": data}
        return data


class OptionalLimits(_Strict):
    repeat_limits: RepeatLimits = Field(default_factory=RepeatLimits)


class LimitationInfo(_Strict):
    required: RequiredLimits
    optional: OptionalLimits = Field(default_factory=OptionalLimits)


class TimeLimit(_Strict):
    """How long the verifier lets a candidate run: `multiple` times the reference's own time on the same runs
    (its child: start, build, every trial set and the held-out sizes), never under `floor_s` nor over
    `ceiling_s`. The reference itself may take up to `ceiling_s`. A candidate past its limit is rejected
    (a verdict about the candidate, naming the limit and the reference's time), never a worker failure."""

    multiple: float = Field(default=200.0, gt=0, description=(
        "the verifier gives a candidate this many times the reference's own time on the same runs "
        "(default: the workflow.yaml's verifier.time_limit, else 200)"))
    """Under the Triton interpreter a kernel runs tens to thousands of times slower than torch's own op: whole
    KernelBench Level 3 models measured 47x (VGG16), 140x (MobileNetV1) and 190x (ViT) per forward call, and at 50x
    9 of 34 right-looking candidates were killed after 2-7 of their 8 calls."""
    floor_s: float = Field(default=120.0, gt=0, description=(
        "the least time in seconds the verifier gives a candidate (default: the workflow.yaml's, else 120)"))
    """Every child starts Python, torch and triton first (several seconds on a loaded machine)."""
    ceiling_s: float = Field(default=1800.0, gt=0, description=(
        "the most time in seconds the verifier gives a candidate, and the reference itself (default: the "
        "workflow.yaml's, else 1800)"))

    @model_validator(mode="after")
    def _ordered(self) -> "TimeLimit":
        if self.floor_s > self.ceiling_s:
            raise ValueError(f"floor_s ({self.floor_s:g}) is above ceiling_s ({self.ceiling_s:g})")
        return self

    @classmethod
    def fixed(cls, seconds: float) -> "TimeLimit":
        """The same limit whatever the reference takes."""
        return cls(floor_s=seconds, ceiling_s=seconds)

    def for_reference(self, reference_s: float) -> float:
        """The candidate's limit when the reference took `reference_s` seconds (to a tenth of a second)."""
        return round(min(self.ceiling_s, max(self.floor_s, self.multiple * reference_s)), 1)

    @property
    def text(self) -> str:
        """`200x the reference's time, at least 120 s, at most 1800 s`."""
        if self.floor_s == self.ceiling_s:
            return f"a fixed {self.ceiling_s:g} s"
        return f"{self.multiple:g}x the reference's time, at least {self.floor_s:g} s, at most {self.ceiling_s:g} s"


class VerifierSettings(_Strict):
    """workflow.yaml's `verifier:` section."""

    time_limit: TimeLimit = Field(default_factory=TimeLimit)


class ConductorConfig(_Strict):
    """A validated workflow.yaml. Built at the edge (client or activity); workflows only read it."""

    agent_info: dict[AgentId, AgentInfo] = Field(min_length=1)
    start_agent: AgentId
    mandatory_analysis: list[AgentId] = Field(
        default_factory=list,
        validation_alias=AliasChoices("mandatory_analysis", "mandatory_llm_analysis"),
    )
    limitation_info: LimitationInfo
    allow_mixed_kernels: bool = False
    """Off by default: a candidate whose forward computes part of the task with torch ops (e.g. a Triton
    matmul followed by `torch.softmax`) is rejected, naming the op and its line. On: such mixed kernels
    may be VERIFIED (the torch ops are still named in the report); the output must still come from a
    Triton kernel's writes."""
    verifier: VerifierSettings = Field(default_factory=VerifierSettings)
    """How the verifier treats candidates (their time limit); a KernelRequest's `time_limit` overrides it."""

    @model_validator(mode="after")
    def _check_graph(self) -> "ConductorConfig":
        agents = self.agent_info
        if FINISH in agents:
            raise ValueError(f"agent_info.{FINISH}: '{FINISH}' is reserved and cannot be declared")
        implemented = [a.value for a in AgentName]
        for name in agents:
            if name not in implemented:
                raise ValueError(f"agent_info.{name}: no implementation for agent '{name}' "
                                 f"(implemented: {', '.join(implemented)})")
        if self.start_agent not in agents:
            raise ValueError(f"start_agent: unknown agent '{self.start_agent}' (declared: {', '.join(agents)})")
        for name, info in agents.items():
            for nxt in info.possible_next_agent:
                if nxt != FINISH and nxt not in agents:
                    raise ValueError(
                        f"agent_info.{name}.possible_next_agent: unknown agent '{nxt}' "
                        f"(declared: {', '.join(agents)}, or '{FINISH}')"
                    )
        for i, name in enumerate(self.mandatory_analysis):
            if name not in agents:
                raise ValueError(f"mandatory_analysis.{i}: unknown agent '{name}'")
        limits = self.limitation_info.optional.repeat_limits
        for name in limits.single_agent:
            if name not in agents:
                raise ValueError(f"limitation_info.optional.repeat_limits.single_agent.{name}: unknown agent '{name}'")
        for seq, lim in limits.sequences.items():
            for name in lim.pattern:
                if name not in agents:
                    raise ValueError(f"limitation_info.optional.repeat_limits.sequences.{seq}.pattern: "
                                     f"unknown agent '{name}'")
        if FINISH not in self.reachable_from(self.start_agent):
            raise ValueError(f"agent_info: '{FINISH}' is unreachable from start_agent '{self.start_agent}'")
        return self

    def reachable_from(self, agent: str) -> set[str]:
        seen: set[str] = set()
        todo = [agent]
        while todo:
            cur = todo.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if cur in self.agent_info:
                todo.extend(self.agent_info[cur].possible_next_agent)
        return seen

    def steps_to(self, agent: str, target: str) -> int | None:
        """Fewest agent runs from starting `agent` until `target` has run (1 when agent is target);
        None when `target` cannot be reached."""
        frontier, depth, seen = [agent], 1, {agent}
        while frontier:
            if target in frontier:
                return depth
            nxt = []
            for cur in frontier:
                for a in self.agent_info.get(cur, AgentInfo(possible_next_agent=[FINISH])).possible_next_agent:
                    if a != FINISH and a not in seen:
                        seen.add(a)
                        nxt.append(a)
            frontier, depth = nxt, depth + 1
        return None

    @property
    def max_step(self) -> int:
        return self.limitation_info.required.max_step

    @property
    def sequences(self) -> dict[str, SequenceLimit]:
        return self.limitation_info.optional.repeat_limits.sequences

    def repeat_limit(self, agent: str) -> int:
        override = self.limitation_info.optional.repeat_limits.single_agent.get(agent)
        return override if override is not None else self.agent_info[agent].max_repeats

    def next_agents(self, agent: str) -> list[str]:
        return list(self.agent_info[agent].possible_next_agent)

    def output_format(self, agent: str) -> OutputFormat | None:
        info = self.agent_info.get(agent)
        return info.output_format if info is not None else None


# --- targets -------------------------------------------------------------------------------

CPU_ARCH = "cpu-interpreter"
CPU_ARCHES = frozenset({"cpu", CPU_ARCH, "interpreter"})
"""The Triton interpreter on CPU (correctness only); `cpu` and `interpreter` are aliases."""
GPU_ARCHES = frozenset({"a10", "a100", "b200", "cuda", "h100", "h20", "h800", "l4", "l40s", "rtx3090", "rtx4090", "t4", "v100",
                        "mi250", "mi300x"})
"""GPU targets: Triton compiles for the worker's GPU; the name says which one the job is for (`cuda`: whichever
NVIDIA GPU the kernels worker has)."""
KNOWN_ARCHES = CPU_ARCHES | GPU_ARCHES


def known_arches() -> str:
    """The targets, for a one-line error: `cpu-interpreter (or cpu, interpreter), a10, a100, ...`."""
    aliases = ", ".join(sorted(CPU_ARCHES - {CPU_ARCH}))
    return f"{CPU_ARCH} (or {aliases}), " + ", ".join(sorted(GPU_ARCHES))


def canonical_arch(arch: str) -> str:
    """`cpu` and `interpreter` mean cpu-interpreter; raises ValueError naming the known targets."""
    if arch in CPU_ARCHES:
        return CPU_ARCH
    if arch not in GPU_ARCHES:
        raise ValueError(f"unknown target {arch!r}; known targets: {known_arches()}")
    return arch


# --- the task ------------------------------------------------------------------------------

Number = int | float
SOURCE_IN_STORE = "(in the artifact store: KernelTask.source)"
"""`task_desc` of a task whose source travels as a store ref (KernelTask.stored)."""


RooflineGpu = Literal["h100", "a100", "l40s", "b200"]
"""The GPUs the cost model knows the peaks of (activities/kernels/gpus.py)."""


class PrecisionPolicy(StrEnum):
    """How exact a kernel must be, declared by the job (activities/kernels/precision.py holds the numbers).
    Speedups are only compared within one policy: the baselines are timed (and modeled) under the same one."""

    STRICT = "strict"
    """IEEE fp32 (the default): fp32 tolerance (1e-4, atol scaled by the output's magnitude), TF32 off in the
    reference and the baselines, and a candidate's `tl.dot` on fp32 operands must use input_precision="ieee"."""
    KERNELBENCH = "kernelbench"
    """KernelBench's own check: atol = rtol = 1e-2, TF32 allowed in the candidate's `tl.dot`, the reference and
    the baselines (matmuls and convolutions then count at the TF32 tensor-core peak in the cost model)."""


class KernelTask(BaseModel, frozen=True):
    """Write a `dsl` kernel for `op_name`, proven against the `framework` reference."""

    op_name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                         description="the op's name (default: from the task file's name, 19_ReLU.py -> ReLU)")
    task_desc: str = Field(min_length=1)
    """The reference program as it runs (KernelBench format), with `overrides` applied."""
    task_id: str = Field(min_length=1)
    dsl: Literal["triton"] = "triton"
    framework: Literal["torch"] = "torch"
    arch: str = Field(min_length=1, description="cpu-interpreter (the Triton interpreter on CPU) or a GPU arch "
                                                "(a100, h100, ...)")
    """See KNOWN_ARCHES."""
    workflow: str = Field("default", description="a shipped workflow name (default, first_verified, coder_only, "
                                                 "akg_style) or a workflow.yaml path")
    """Ignored when `conductor` is given."""
    conductor: ConductorConfig | None = None
    max_step: int | None = Field(default=None, gt=0, description="cap on conductor steps")
    """Overrides `limitation_info.required.max_step` when set."""
    num_candidates: int = Field(default=1, ge=1, le=16, description="coder candidates per round, run in parallel")
    """Run as concurrent activities; the first verified one wins."""
    overrides: dict[str, Number] = Field(default_factory=dict)
    """Module-level constants of the task file set with `--set NAME=VALUE` (already applied to task_desc)."""
    source_file: str = ""
    """The task file's name, for people (the op name is derived from it)."""
    source: ArtifactRef | None = None
    """Where `task_desc` is when it reads SOURCE_IN_STORE: the SDK starts a job with its source in the store
    (client.kernel.with_source_in_store), and the conductor's activity requests carry this ref (a whole model's
    file is kilobytes; a request started with the source inline holds it once, in the job's start)."""

    def stored(self, source: ArtifactRef) -> "KernelTask":
        """This task with its source left in the store at `source` (the activity reads it back)."""
        return self.model_copy(update={"task_desc": SOURCE_IN_STORE, "source": source})
    precision: PrecisionPolicy = Field(PrecisionPolicy.STRICT, description=(
        "strict: IEEE fp32 (tolerance 1e-4, no TF32); kernelbench: KernelBench's atol/rtol 1e-2 with TF32 allowed "
        "(the baselines too)"))
    """The declared precision policy: tolerance and whether TF32 is allowed (recorded as `precision_used`)."""
    roofline_gpu: RooflineGpu = Field("h100", description="the GPU the modeled speed is for (h100, a100, l40s, b200; "
                                                          "a GPU --arch of these models itself)")
    """The GPU whose peaks the cost model uses for the modeled speed (activities/kernels/gpus.py: h100, a100,
    l40s, b200); a GPU `arch` of that table is used instead."""

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, arch: str) -> str:
        canonical_arch(arch)
        return arch

    @property
    def on_cpu(self) -> bool:
        """Correctness only, under the Triton interpreter; speed is not measurable."""
        return self.arch in CPU_ARCHES


# --- conductor state -----------------------------------------------------------------------


class AgentRecord(BaseModel, frozen=True):
    agent: AgentId
    step: int = Field(ge=1)
    parsed_ok: bool = True
    verifier_passed: bool | None = None
    """Set only for the verifier: did the candidate match the reference?"""
    speedup: float | None = None
    """Set only for a passing verification where speed is measurable (GPU): candidate vs reference."""
    modeled_ms: float | None = None
    """Set only for a passing verification with a modeled speed: the candidate's modeled time."""
    sol_fraction: float | None = None
    """Set with modeled_ms: the candidate's modeled fraction of the speed of light."""
    suggestion: str = ""
    """The conductor's guidance this agent ran with."""


class ConductorState(BaseModel, frozen=True):
    step: int = Field(default=0, ge=0)
    """Agent executions so far."""
    history: list[AgentRecord] = Field(default_factory=list)

    @property
    def last(self) -> AgentRecord | None:
        return self.history[-1] if self.history else None

    @property
    def consecutive_repeats(self) -> int:
        """How many times in a row the last agent has run (0 before any agent)."""
        if not self.history:
            return 0
        n = 0
        for rec in reversed(self.history):
            if rec.agent != self.history[-1].agent:
                break
            n += 1
        return n

    @property
    def agents(self) -> list[str]:
        return [r.agent for r in self.history]

    def record(self, rec: AgentRecord) -> "ConductorState":
        return ConductorState(step=rec.step, history=[*self.history, rec])


# --- decisions -----------------------------------------------------------------------------


class FinishReason(StrEnum):
    VERIFIED = "VERIFIED"
    MAX_STEPS = "MAX_STEPS"
    PARSE_FAILED = "PARSE_FAILED"
    """No usable answer on any rung of the ladder (the LLM's answers stayed unusable, no offline answer)."""
    NO_OPTIONS = "NO_OPTIONS"
    ROUTED = "ROUTED"
    """The config's only way on was `finish`."""
    LLM_DECIDED = "LLM_DECIDED"
    NO_OFFLINE_TEMPLATE = "NO_OFFLINE_TEMPLATE"
    """No LLM answered and the offline agents have no template for the reference's aten ops."""
    NO_PROGRESS = "NO_PROGRESS"
    """The only candidate left to try is one the verifier already rejected (a deterministic agent repeats itself)."""
    REPEAT_LIMIT = "REPEAT_LIMIT"
    """A repeat limit of workflow.yaml (single_agent or a sequence) left no agent to run."""


class Go(BaseModel, frozen=True):
    kind: Literal["go"] = "go"
    agent: AgentId
    step: int = Field(ge=1)
    suggestion: str = ""
    fallback: bool = False
    """True when the LLM's decision was unusable and a deterministic rule chose."""


class Finish(BaseModel, frozen=True):
    kind: Literal["finish"] = "finish"
    reason: FinishReason
    step: int = Field(ge=0)
    detail: str = ""
    """What a person needs to know (which limit, which aten ops, which candidate), one line."""


class AskLLM(BaseModel, frozen=True):
    kind: Literal["ask_llm"] = "ask_llm"
    agent: AgentId
    """The agent whose result the LLM analyses."""
    options: list[str] = Field(min_length=1)
    step: int = Field(ge=1)


Decision = Annotated[Go | Finish | AskLLM, Field(discriminator="kind")]


class LLMDecision(BaseModel, frozen=True):
    """The conductor LLM's answer (analyze.j2): which agent next, and guidance for it.
    The prompt asks for `{"decision", "suggestion"}`; `next_agent` is accepted too, in any case."""

    next_agent: str = Field(validation_alias=AliasChoices("decision", "next_agent"))
    suggestion: str = ""

    @field_validator("next_agent")
    @classmethod
    def _normalise(cls, value: str) -> str:
        return value.strip().lower()


# --- static checks -------------------------------------------------------------------------


class StaticReport(BaseModel, frozen=True):
    ok: bool
    reasons: list[str] = Field(default_factory=list)
