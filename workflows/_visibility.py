"""What a person sees of a running job: search attributes and the current-details markdown.

Registered by `fleetforge dev`, the compose init job and `fleetforge setup-namespace`.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from contracts.common import JobKind, JobStatus

JOB = SearchAttributeKey.for_keyword("FleetforgeJob")
STATUS = SearchAttributeKey.for_keyword("FleetforgeStatus")
MODEL = SearchAttributeKey.for_keyword("FleetforgeModel")
TARGET = SearchAttributeKey.for_keyword("FleetforgeTarget")
SEARCH_ATTRIBUTES = (JOB, STATUS, MODEL, TARGET)


def start_attributes(kind: JobKind, model: str = "", target: str = "") -> TypedSearchAttributes:
    """Search attributes a job is started with (the client passes these to start_workflow)."""
    pairs = [SearchAttributePair(JOB, kind.value), SearchAttributePair(STATUS, JobStatus.RUNNING.value)]
    if model:
        pairs.append(SearchAttributePair(MODEL, model[:200]))
    if target:
        pairs.append(SearchAttributePair(TARGET, target))
    return TypedSearchAttributes(pairs)


def set_status(status: JobStatus) -> None:
    """Keep FleetforgeStatus current (what `fleetforge list --status` and the Web UI filter on)."""
    workflow.upsert_search_attributes([STATUS.value_set(status.value)])


def set_model(model: str) -> None:
    workflow.upsert_search_attributes([MODEL.value_set(model[:200])])


def details(title: str, rows: dict[str, object]) -> None:
    """Set the Web UI's current details: a heading and a small markdown table of facts."""
    lines = [f"**{title}**", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {str(v).replace('|', '/').replace(chr(10), ' ')[:300]} |" for k, v in rows.items() if v not in (None, "")]
    workflow.set_current_details("\n".join(lines))
