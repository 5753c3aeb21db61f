"""Load a workflow.yaml (a shipped name or a path) into a validated ConductorConfig."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from contracts.errors import Err, FleetforgeError
from contracts.kernel import ConductorConfig, KernelTask, RequiredLimits

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "examples" / "workflows"


def shipped_workflows() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))


def resolve_workflow_path(name_or_path: str | Path) -> Path:
    """A bare shipped name (`default`) resolves into examples/workflows/; anything else is a path."""
    text = str(name_or_path)
    if isinstance(name_or_path, str) and "/" not in text and not text.endswith((".yaml", ".yml")):
        shipped = SHIPPED_DIR / f"{text}.yaml"
        if shipped.is_file():
            return shipped
        raise FleetforgeError(
            Err.WORKFLOW_CONFIG_INVALID,
            f"{text}: no such shipped workflow (known: {', '.join(shipped_workflows())}) and not a path",
        )
    return Path(name_or_path)


def load_workflow_config(name_or_path: str | Path) -> ConductorConfig:
    """Raises FleetforgeError(WORKFLOW_CONFIG_INVALID, "<file>: <key path>: <problem>")."""
    path = resolve_workflow_path(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise FleetforgeError(Err.WORKFLOW_CONFIG_INVALID, f"{path}: cannot read: {e.strerror or e}") from e
    return parse_workflow_config(text, source=str(path))


def config_for_task(task: KernelTask) -> ConductorConfig:
    """The task's inline config, else its named/path workflow, with the task's max_step applied."""
    cfg = task.conductor if task.conductor is not None else load_workflow_config(task.workflow)
    if task.max_step is None:
        return cfg
    limits = cfg.limitation_info.model_copy(update={"required": RequiredLimits(max_step=task.max_step)})
    return cfg.model_copy(update={"limitation_info": limits})


def parse_workflow_config(text: str, *, source: str = "<workflow.yaml>") -> ConductorConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark is not None else "<yaml>"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise FleetforgeError(Err.WORKFLOW_CONFIG_INVALID, f"{source}: {where}: invalid YAML: {problem}") from e
    if not isinstance(data, dict):
        raise FleetforgeError(
            Err.WORKFLOW_CONFIG_INVALID,
            f"{source}: <root>: expected a mapping with agent_info, start_agent, limitation_info",
        )
    try:
        return ConductorConfig.model_validate(data)
    except ValidationError as e:
        raise FleetforgeError(Err.WORKFLOW_CONFIG_INVALID, f"{source}: {_describe(e)}") from e


def _describe(e: ValidationError) -> str:
    """One line: `key.path: problem` for each error, `;`-separated."""
    parts = []
    for err in e.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)
