"""Conversion vocabulary: the planner's plan contract, tool specs, and the compiler's output."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from contracts.common import Failure


class Precision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"
    W8A16 = "w8a16"
    W4A16 = "w4a16"
    """4-bit per-channel weights for the MatMuls (a transformer decoder's), 16-bit activations."""


class OutputKind(StrEnum):
    QNN_CONTEXT_BINARY = "qnn_context_binary"
    DLC = "dlc"
    ONNX_QDQ = "onnx_qdq"
    ORT = "ort"


class Toolchain(StrEnum):
    AUTO = "auto"
    QAIRT = "qairt"
    ORT_QNN = "ort-qnn"
    ONNX = "onnx"


class Preset(BaseModel, frozen=True):
    """A named, user-facing shortcut: what to build, for which SoC, at which precision."""

    name: str
    description: str = ""
    soc: str | None = None
    precision: Precision
    output: OutputKind
    toolchain: Toolchain = Toolchain.AUTO


class PlanStatus(StrEnum):
    OK = "OK"
    NEEDS_INPUT = "NEEDS_INPUT"


class PlanStep(BaseModel, frozen=True):
    model_config = ConfigDict(extra="forbid", frozen=True)

    step_id: str = Field(min_length=1, max_length=64)
    tool_name: str = Field(min_length=1, max_length=128)
    required_args: dict[str, JsonValue] = Field(default_factory=dict)
    optional_args: dict[str, JsonValue] = Field(default_factory=dict)
    expected_outputs: list[str] = Field(default_factory=list)
    depends_on: list[str] = Field(default_factory=list)


class ConversionPlan(BaseModel, frozen=True):
    """The planner's answer (LLM output is data: validated before anything runs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: PlanStatus
    intent: dict[str, JsonValue] = Field(default_factory=dict)
    steps: list[PlanStep] = Field(default_factory=list)
    questions: list[str] = Field(default_factory=list)
    rationale: str = ""


ArgType = Literal["path_in", "path_out", "str", "int", "float", "bool", "enum", "list"]
"""`list`: a list of short strings (names, e.g. graph outputs), never paths."""
PATH_TYPES = frozenset({"path_in", "path_out"})


class ArgSpec(BaseModel, frozen=True):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    type: ArgType
    required: bool = False
    description: str = ""
    enum_values: list[str] = Field(default_factory=list)
    default: JsonValue = None
    requires: dict[str, JsonValue] = Field(default_factory=dict)
    """Conditional requirement: this arg may only be given (and, if `required`, must be given)
    when every named arg has the given value, e.g. {"precision": "int8"}."""
    exclusive_group: str | None = None
    """At most one arg of the same group may be given."""
    flag: str | None = None
    """The CLI flag for argv-driven tools (None: the arg is a typed param, not argv)."""


class ToolSpec(BaseModel, frozen=True):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    toolchain: Toolchain
    version: str
    description: str = ""
    planner_visible: bool = True
    program: str | None = None
    """Executable for argv-driven tools; None for in-process tools that take typed params."""
    args: list[ArgSpec]
    outputs: list[str] = Field(default_factory=list)
    """Names of the path_out args whose files the step produces."""
    derived_outputs: list[str] = Field(default_factory=list)
    """Files the tool writes next to an output, as templates: `{ARG_stem}` is ARG's path without
    its suffix (e.g. "{output_stem}_qnn.bin" for an EPContext model's context binary)."""

    def arg(self, name: str) -> ArgSpec | None:
        return next((a for a in self.args if a.name == name), None)


class CompiledStep(BaseModel, frozen=True):
    """A validated step: every path workspace-relative and normalised, ready to execute."""

    step_id: str
    tool_name: str
    tool_version: str
    argv: list[str] | None = None
    """For external programs: argv built from the spec (no shell)."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Typed, validated arguments (paths as normalised workspace-relative strings)."""
    inputs: list[str] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    depends_on: list[str] = Field(default_factory=list)


class StepOutput(BaseModel, frozen=True):
    """What a step produced: every runner returns it (from a child process: as its reply)."""

    outputs: list[str]
    """Workspace-relative files the step wrote."""
    seconds: float
    details: dict[str, Any] = {}


class CompileResult(BaseModel, frozen=True):
    ok: bool
    steps: list[CompiledStep] = Field(default_factory=list)
    """In dependency (topological) order when ok."""
    errors: list[Failure] = Field(default_factory=list)
    """Structured rejections: code COMPILER_ERROR / PLAN_INVALID / PATH_ESCAPE, where=step_id[.arg]."""

    def feedback(self) -> str:
        """One line per rejection, for the planner's next attempt."""
        return "\n".join(f"[{e.code}] {e.where}: {e.message}" for e in self.errors)
