"""Each job's options, declared once for every front door: which contract field an option sets, the
name the SDK's `start_*` and the MCP tool take it by, the CLI flag. Its type, default, bounds, enum and
help are the contract field's own (`Field(..., description=...)`), so a threshold or an enum is written
once, in the contract. A new contract field is one `Option(...)` line here, and it appears in
`fleetforge <job> --help` (client/cli/options.py) and in the MCP tool's input schema
(client/mcp_server/args.py) alike; tests/unit/test_job_options.py holds them to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

from contracts.convert_job import ConversionRequest
from contracts.fleet_job import FleetTestRequest
from contracts.kernel import CPU_ARCH, KernelTask, TimeLimit
from contracts.kernel_job import KernelRequest

_CONTRACT: Any = object()
"""`Option.default` / `Option.annotation` left to the contract field."""


@dataclass(frozen=True)
class Option:
    field: str
    """The contract field it sets."""
    name: str = ""
    """The SDK's keyword and the MCP tool's property (default: the field's name)."""
    flag: str = ""
    """The CLI flag (default: --NAME with dashes)."""
    metavar: str | None = None
    default: Any = _CONTRACT
    """Where the contract has no default because the SDK fills the field (the kernel's arch, its op name)."""
    annotation: Any = _CONTRACT
    cli: bool = True
    """False: the CLI spells it its own way (a repeatable NAME=VALUE option)."""

    @property
    def key(self) -> str:
        return self.name or self.field

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.key.replace("_", "-")


@dataclass(frozen=True)
class Resolved:
    """An option with what its contract field says: its type, default, constraints and help."""

    option: Option
    annotation: Any
    default: Any
    """The default value (a fresh one from the contract's factory: the CLI's)."""
    info: FieldInfo

    @property
    def contract_default(self) -> bool:
        """The default is the contract's (not one the front door fills in for the SDK)."""
        return self.option.default is _CONTRACT

    @property
    def help(self) -> str:
        return self.info.description or ""

    @property
    def constraints(self) -> list[Any]:
        return list(self.info.metadata)

    @property
    def constrained(self) -> Any:
        """The type with the contract's bounds and patterns attached (for a model that validates like it)."""
        return Annotated[self.annotation, *self.constraints] if self.constraints else self.annotation

    def field(self) -> Any:
        """A pydantic Field with the default (or the contract's default factory) and the help."""
        factory = self.info.default_factory if self.contract_default else None
        if factory is not None:
            return Field(default_factory=factory, description=self.help or None)
        return Field(self.default, description=self.help or None)


@dataclass(frozen=True)
class JobOptions:
    """A job's options over its contracts (the first contract that has a field owns it)."""

    contracts: tuple[type[BaseModel], ...]
    options: tuple[Option, ...]

    def resolved(self) -> list[Resolved]:
        return [self._resolve(o) for o in self.options]

    def _resolve(self, option: Option) -> Resolved:
        for contract in self.contracts:
            info = contract.model_fields.get(option.field)
            if info is not None:
                break
        else:
            raise KeyError(f"{option.field} is no field of {', '.join(c.__name__ for c in self.contracts)}")
        annotation = info.annotation if option.annotation is _CONTRACT else option.annotation
        if option.default is not _CONTRACT:
            default = option.default
        elif info.default_factory is not None:
            default = info.default_factory()  # type: ignore[call-arg]
        else:
            default = info.default
        return Resolved(option, annotation, default, info)


CONVERT = JobOptions((ConversionRequest,), (
    Option("target_soc", name="soc", metavar="SOC"),
    Option("precision"),
    Option("output"),
    Option("toolchain"),
    Option("preset"),
    Option("calibration", metavar="FILE.npz|DIR"),
    Option("min_cosine", metavar="COSINE"),
    Option("max_replans", metavar="N"),
    Option("eval_data", metavar="FILE.npz|DIR"),
    Option("eval_samples", metavar="N"),
    Option("synthetic_calibration"),
    Option("precision_fallback"),
    Option("input_shapes", cli=False),  # the CLI: --input-shape NAME=1,3,224,224 (repeatable)
))

KERNEL = JobOptions((KernelTask, KernelRequest, TimeLimit), (
    Option("arch", metavar="ARCH", default=CPU_ARCH),
    Option("workflow", metavar="NAME|FILE"),
    Option("num_candidates", metavar="N"),
    Option("max_step", metavar="N"),
    Option("op_name", metavar="NAME", default=None, annotation=str | None),
    Option("max_llm_answers", metavar="N"),
    Option("llm_rejections_before_fallback", metavar="N"),
    Option("precision"),
    Option("roofline_gpu", metavar="GPU"),
    # the verifier's time limit, field by field over the workflow.yaml's (None: its value)
    Option("multiple", name="time_limit_multiple", metavar="X", default=None, annotation=float | None),
    Option("floor_s", name="time_limit_floor_s", flag="--time-limit-floor", metavar="SECONDS", default=None,
           annotation=float | None),
    Option("ceiling_s", name="time_limit_ceiling_s", flag="--time-limit-ceiling", metavar="SECONDS", default=None,
           annotation=float | None),
))

FLEET_TEST = JobOptions((FleetTestRequest,), (
    Option("concurrency", metavar="N"),
    Option("runner"),
    Option("max_attempts", metavar="N"),
    Option("test_timeout_s", flag="--test-timeout", metavar="SECONDS"),
    Option("require_approval"),
    Option("require_tier"),
    Option("max_per_family", metavar="N"),
    Option("evidence_columns"),
    Option("process_mode"),
    Option("share", metavar="DIR"),
))
