"""What a person reads about a job in the Web UI: the static summary and details of a request, and
the markdown of the current details. Pure functions, so golden tests pin them (tests/golden/) and a
change to what users see is a deliberate diff. The client passes the static texts to
`start_workflow`, a parent passes them to its children; workflows set the current details through
`workflows._visibility.details`.

Markdown tables here are made for the Web UI's renderer (UI 2.54): its stylesheet zeroes every
cell's padding, so adjacent cells would run together (`planner_max_tool_iters8`); every cell ends
with an em-space gutter and columns are left-aligned. Inline HTML styles are blocked there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel

from contracts.convert_job import ConversionRequest
from contracts.fleet_job import FleetTestRequest, ModelTestRequest
from contracts.inspect import InspectRequest
from contracts.kernel_job import KernelRequest, ModeledSpeed

HIDDEN_FIELDS = {"queues", "carry", "run_id", "task"}
"""Request fields that are plumbing, not something a person asked for."""

GUTTER = "\u2003\u2003"
"""Two em spaces after every cell: the column gap the Web UI's table style does not give."""
MAX_CELL = 200
MAX_TABLE_ROWS = 25
"""Longer lists (a fleet's rows) show their first rows and say how many more there are."""


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
    """Markdown: the request as a person would state it (a heading and a field/value table)."""
    rows = {k: v for k, v in request.model_dump(mode="json", exclude=HIDDEN_FIELDS).items() if not _empty(v)}
    if isinstance(request, KernelRequest):
        rows = {"op": request.task.op_name, "task_id": request.task.task_id, "arch": request.task.arch,
                "dsl": request.task.dsl, "workflow": request.task.workflow, "precision": request.task.precision.value,
                "roofline_gpu": request.task.roofline_gpu, **rows}
        rows.pop("config", None)
    if isinstance(request, ConversionRequest) and request.target_soc:
        rows["target_soc"] = request.target_soc.upper()  # SoC names upper-case everywhere
    return "\n".join([f"**{summary(request)}**", "", *markdown_table(["field", "value"], rows.items())])


def modeled_rows(m: ModeledSpeed) -> dict[str, str]:
    """A kernel's modeled speed as a person reads it, every figure labelled modeled (a roofline model of the
    named GPU from the interpreter's counts, never a measurement)."""
    return {
        "GPU (roofline)": f"{m.gpu.upper()}, precision {m.precision}",
        "speedup over eager (modeled)": f"{m.speedup:.2f}x",
        "candidate (modeled)": f"{m.modeled_ms:.4f} ms in {m.launches} launch(es)",
        "eager reference (modeled)": f"{m.eager_ms:.4f} ms in {m.eager_launches} aten op(s)",
        "speed of light": f"{m.sol_ms:.4f} ms ({'memory' if m.memory_bound else 'compute'}-bound floor)",
        "SOL fraction (modeled)": f"{m.sol_fraction:.0%}",
        "SOL score S (modeled)": f"{m.score:.2f}",
        "traffic (modeled)": f"{m.traffic_ratio:.2f}x the floor ({m.bytes} of {m.floor_bytes} bytes)",
        "costliest launch": m.worst,
    }


def current_details(title: str, rows: Mapping[str, object]) -> str:
    """Markdown for a job's current details: scalar facts in one table, then every structured value
    as its own titled table (an evaluation report: its figures; artifacts: name, size, sha256; a list
    of rows such as a fleet's verdicts: one line each). Empty values are left out."""
    facts: dict[str, object] = {}
    sections: list[str] = []
    for key, value in rows.items():
        if _empty(value):
            continue
        table = _as_table(value)
        if table is None:
            facts[key] = value
            continue
        header, body, more = table
        sections += ["", f"**{key}**", "", *markdown_table(header, body)]
        if more:
            sections.append(f"… and {more} more")
    return "\n".join([f"**{title}**", "", *markdown_table(["", ""], facts.items()), *sections]).rstrip() + "\n"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A left-aligned markdown table whose cells are escaped, one line each, and padded (GUTTER)."""
    def line(cells: Iterable[object]) -> str:
        return "| " + " | ".join(cell(c) + GUTTER for c in cells) + " |"

    return [line(header), "|" + ":---|" * len(header), *(line(r) for r in rows)]


def cell(value: object) -> str:
    """One table cell: an artifact by its name first (size, short sha256, then its URI), a nested
    model as `key=value` pairs, booleans as yes/no; `|` escaped, one line, at most MAX_CELL chars."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if value is None:
        text = ""
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, dict) and _is_artifact(value):
        text = artifact_text(value)
    elif isinstance(value, dict):
        text = ", ".join(f"{k}={cell(v)}" for k, v in value.items() if not _empty(v))
    elif isinstance(value, (list, tuple)):
        text = ", ".join(cell(v) for v in value)
    else:
        text = str(value)
    text = " ".join(text.split())
    if len(text) > MAX_CELL:
        text = text[: MAX_CELL - 1] + "…"
    return text.replace("|", "\\|")


def artifact_text(ref: Mapping[str, object]) -> str:
    """`name (size bytes, sha256 0123456789ab) URI`: the workspace name first, the URI second."""
    name = ref.get("name") or ""
    facts = f"{ref.get('size')} bytes, sha256 {str(ref.get('sha256', ''))[:12]}"
    return f"{name} ({facts}) {ref.get('uri')}" if name else f"{ref.get('uri')} ({facts})"


def _is_artifact(value: Mapping[str, object]) -> bool:
    return "uri" in value and "sha256" in value


def _empty(value: object) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _as_table(value: object) -> tuple[list[str], list[list[object]], int] | None:
    """(header, rows, rows left out) for a structured value; None for one that fits a cell."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):
        if _is_artifact(value):
            return None
        return ["", ""], [[k, v] for k, v in value.items() if not _empty(v)], 0
    if not isinstance(value, (list, tuple)) or not value:
        return None
    # only the rows shown are dumped: a fleet run shows its latest verdicts on every window change
    shown = [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value[:MAX_TABLE_ROWS]]
    if not all(isinstance(i, dict) for i in shown):
        return None
    more = max(0, len(value) - MAX_TABLE_ROWS)
    if all(_is_artifact(i) for i in shown):
        return (["artifact", "size", "sha256", "uri"],
                [[i.get("name") or "-", i["size"], str(i["sha256"])[:12], i["uri"]] for i in shown], more)
    columns = [k for k in dict.fromkeys(k for i in shown for k in i)
               if any(not _empty(i.get(k)) and not isinstance(i.get(k), (dict, list)) for i in shown)]
    return columns, [[i.get(k, "") for k in columns] for i in shown], more
