"""What a person reads about a job before opening it: the Web UI's static summary and details.

Pure functions of the request, so golden tests pin them (tests/golden/) and a change to what
users see is a deliberate diff. The client passes them to `start_workflow`, a parent passes
them to its children.
"""

from __future__ import annotations

from pydantic import BaseModel

from contracts.convert_job import ConversionRequest
from contracts.fleet_job import FleetTestRequest, ModelTestRequest
from contracts.inspect import InspectRequest
from contracts.kernel_job import KernelRequest

HIDDEN_FIELDS = {"queues", "carry", "run_id", "task"}
"""Request fields that are plumbing, not something a person asked for."""


def summary(request: BaseModel) -> str:
    """One line: job, model/op, target."""
    match request:
        case InspectRequest():
            return f"inspect {_short(request.model)}"
        case ConversionRequest():
            soc = request.target_soc.upper() if request.target_soc else "SoC to be asked"
            precision = request.precision.value if request.precision else "precision to be asked"
            return f"convert {_short(request.model)} to {request.output.value} for {soc}, {precision}"
        case KernelRequest():
            return f"kernel {request.task.op_name} in {request.task.dsl} for {request.task.arch}"
        case FleetTestRequest():
            manifest = request.manifest.name or f"manifest {request.manifest.sha256[:12]}"
            return f"fleet-test {manifest} with the {request.runner.value} runner, concurrency {request.concurrency}"
        case ModelTestRequest():
            return f"model-test row {request.row} of fleet {request.fleet_id} ({request.runner.value} runner)"
    raise TypeError(f"no summary for {type(request).__name__}")


def _short(model: str) -> str:
    """A model reference as a person names it: the file name of a path or URI, else the catalog name
    (the details table keeps the full reference)."""
    return model.rstrip("/").rsplit("/", 1)[-1] or model


def details(request: BaseModel) -> str:
    """Markdown: the request as a person would state it."""
    rows = {k: v for k, v in request.model_dump(mode="json", exclude=HIDDEN_FIELDS).items() if v not in (None, "", [], {})}
    if isinstance(request, KernelRequest):
        rows = {"op": request.task.op_name, "task_id": request.task.task_id, "arch": request.task.arch,
                "dsl": request.task.dsl, "workflow": request.task.workflow, **rows}
        rows.pop("config", None)
    lines = [f"**{summary(request)}**", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in rows.items()]
    return "\n".join(lines)


def _cell(value: object) -> str:
    """A table cell: an artifact by its URI, a nested model as `key=value` pairs, one line."""
    if isinstance(value, dict):
        text = value["uri"] if "uri" in value else ", ".join(f"{k}={v}" for k, v in value.items())
    else:
        text = str(value)
    return text.replace("|", "/").replace("\n", " ")[:200]
