"""Kernel jobs: the task, the conductor's workflow.yaml model, its state and its decisions."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

FINISH = "finish"
"""The pseudo-agent that ends the run. Never declared in `agent_info`."""

AgentId = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]


class AgentName(StrEnum):
    """Agents the conductor treats specially (any other declared agent is routed by config only)."""

    DESIGNER = "designer"
    CODER = "coder"
    VERIFIER = "verifier"
    OPTIMIZER = "optimizer"


# --- workflow.yaml -------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OutputFormat(_Strict):
    parser_name: str = Field(min_length=1)
    fields: dict[str, str] = Field(default_factory=dict)
    """Field name -> description of what the agent's answer must carry."""


class AgentInfo(_Strict):
    possible_next_agent: list[AgentId] = Field(min_length=1)
    output_format: OutputFormat | None = None
    max_repeats: int = Field(default=3, gt=0)
    """How many times in a row this agent may run (self-loops and parse-failure retries)."""


class RequiredLimits(_Strict):
    max_step: int = Field(gt=0)
    """Most agent executions in one run."""


class OptionalLimits(_Strict):
    repeat_limits: dict[AgentId, Annotated[int, Field(gt=0)]] = Field(default_factory=dict)
    """Per-agent override of `agent_info.<agent>.max_repeats`."""


class LimitationInfo(_Strict):
    required: RequiredLimits
    optional: OptionalLimits = Field(default_factory=OptionalLimits)


class ConductorConfig(_Strict):
    """A validated workflow.yaml. Built at the edge (client or activity); workflows only read it."""

    agent_info: dict[AgentId, AgentInfo] = Field(min_length=1)
    start_agent: AgentId
    mandatory_analysis: list[AgentId] = Field(
        default_factory=list,
        validation_alias=AliasChoices("mandatory_analysis", "mandatory_llm_analysis"),
    )
    limitation_info: LimitationInfo

    @model_validator(mode="after")
    def _check_graph(self) -> "ConductorConfig":
        agents = self.agent_info
        if FINISH in agents:
            raise ValueError(f"agent_info.{FINISH}: '{FINISH}' is reserved and cannot be declared")
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
        for name in self.limitation_info.optional.repeat_limits:
            if name not in agents:
                raise ValueError(f"limitation_info.optional.repeat_limits.{name}: unknown agent '{name}'")
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

    @property
    def max_step(self) -> int:
        return self.limitation_info.required.max_step

    def repeat_limit(self, agent: str) -> int:
        override = self.limitation_info.optional.repeat_limits.get(agent)
        return override if override is not None else self.agent_info[agent].max_repeats

    def next_agents(self, agent: str) -> list[str]:
        return list(self.agent_info[agent].possible_next_agent)


CPU_ARCHES = frozenset({"cpu", "cpu-interpreter", "interpreter"})

# --- the task ------------------------------------------------------------------------------


class KernelTask(BaseModel, frozen=True):
    """Write a `dsl` kernel for `op_name`, proven against the `framework` reference."""

    op_name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    task_desc: str = Field(min_length=1)
    """The reference program / requirements given to the agents."""
    task_id: str = Field(min_length=1)
    dsl: Literal["triton"] = "triton"
    framework: Literal["torch"] = "torch"
    arch: str = Field(min_length=1)
    """e.g. "cpu-interpreter" (Triton interpreter on CPU), "a100", "h100"."""
    workflow: str = "default"
    """A shipped workflow name or a workflow.yaml path; ignored when `conductor` is given."""
    conductor: ConductorConfig | None = None
    max_step: int | None = Field(default=None, gt=0)
    """Overrides `limitation_info.required.max_step` when set."""
    num_candidates: int = Field(default=1, ge=1, le=16)
    """Coder attempts per round, run as concurrent activities; the first verified one wins."""

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

    def record(self, rec: AgentRecord) -> "ConductorState":
        return ConductorState(step=rec.step, history=[*self.history, rec])


# --- decisions -----------------------------------------------------------------------------


class FinishReason(StrEnum):
    VERIFIED = "VERIFIED"
    MAX_STEPS = "MAX_STEPS"
    PARSE_FAILED = "PARSE_FAILED"
    NO_OPTIONS = "NO_OPTIONS"
    ROUTED = "ROUTED"
    """The config's only way on was `finish`."""
    LLM_DECIDED = "LLM_DECIDED"


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


class AskLLM(BaseModel, frozen=True):
    kind: Literal["ask_llm"] = "ask_llm"
    agent: AgentId
    """The agent whose result the LLM analyses."""
    options: list[str] = Field(min_length=1)
    step: int = Field(ge=1)


Decision = Annotated[Go | Finish | AskLLM, Field(discriminator="kind")]


class LLMDecision(BaseModel, frozen=True):
    """The conductor LLM's answer (analyze.j2): which agent next, and guidance for it.
    The prompt asks for `{"decision", "suggestion"}`; `next_agent` is accepted too."""

    next_agent: str = Field(validation_alias=AliasChoices("decision", "next_agent"))
    suggestion: str = ""


# --- static checks -------------------------------------------------------------------------


class StaticReport(BaseModel, frozen=True):
    ok: bool
    reasons: list[str] = Field(default_factory=list)
