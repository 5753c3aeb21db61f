"""What a person sees of a running job: search attributes, Web UI links and the current-details
markdown.

Search attribute values are normalised here, once, for every path that sets them (client start,
workflow upserts): `FleetforgeTarget` holds SoC names upper-case (`SM8550`) and anything else
lower-case (`cpu`, `docker`), so one documented filter finds every job.
Registered by `fleetforge dev`, the compose init job and `fleetforge setup-namespace`.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from contracts.common import JobKind, JobStatus
from workflows.presentation import current_details

JOB = SearchAttributeKey.for_keyword("FleetforgeJob")
STATUS = SearchAttributeKey.for_keyword("FleetforgeStatus")
MODEL = SearchAttributeKey.for_keyword("FleetforgeModel")
TARGET = SearchAttributeKey.for_keyword("FleetforgeTarget")
SEARCH_ATTRIBUTES = (JOB, STATUS, MODEL, TARGET)

MAX_KEYWORD = 200
WAITING = frozenset({JobStatus.NEEDS_INPUT, JobStatus.AWAITING_APPROVAL})
"""What a running job can be doing that its execution status (Running) cannot say: waiting for a person."""
_SOC = re.compile(r"^sm\d{4}[a-z]?$", re.IGNORECASE)


def normalise_target(target: str) -> str:
    """A FleetforgeTarget value: a Snapdragon SoC upper-case (sm8550 -> SM8550), anything else
    (kernel arch, fleet runner) lower-case."""
    target = target.strip()
    return target.upper() if _SOC.match(target) else target.lower()


def normalise_model(model: str) -> str:
    """A FleetforgeModel value: as given, cut to what a keyword holds."""
    return model.strip()[:MAX_KEYWORD]


def start_attributes(kind: JobKind, model: str = "", target: str = "") -> TypedSearchAttributes:
    """Search attributes a job is started with (the client passes these to start_workflow; a fleet starts
    its rows with these). A fleet row starts without FleetforgeStatus (see `set_status`)."""
    pairs = [SearchAttributePair(JOB, kind.value)]
    if kind is not JobKind.MODEL_TEST:
        pairs.append(SearchAttributePair(STATUS, JobStatus.RUNNING.value))
    if model:
        pairs.append(SearchAttributePair(MODEL, normalise_model(model)))
    if target:
        pairs.append(SearchAttributePair(TARGET, normalise_target(target)))
    return TypedSearchAttributes(pairs)


def set_status(status: JobStatus) -> None:
    """Keep FleetforgeStatus current (what `fleetforge list --status` and the Web UI filter on).

    A fleet row (model-test) carries it only while it waits for a person: a fleet has thousands of rows,
    every upsert is a visibility write on the server (about 3 ms of the machine's CPU each, measured by
    bench/bench_row_costs.py), and while a row runs or once it has ended its execution status says the same
    (client/jobs.py: `status_of`, `list_query`)."""
    if _is_row():
        if status in WAITING:
            workflow.upsert_search_attributes([STATUS.value_set(status.value)])
        elif workflow.info().typed_search_attributes.get(STATUS) is not None:  # it waited (or started with one)
            workflow.upsert_search_attributes([STATUS.value_unset()])
        return
    workflow.upsert_search_attributes([STATUS.value_set(status.value)])


def set_model(model: str) -> None:
    """Set FleetforgeModel, except on a fleet row started with it (a fleet starts most rows with their model;
    each upsert is a visibility write on the server). Other jobs always upsert: their histories have it."""
    value = normalise_model(model)
    if not (_is_row() and workflow.info().typed_search_attributes.get(MODEL) == value):
        workflow.upsert_search_attributes([MODEL.value_set(value)])


def _is_row() -> bool:
    """This workflow is a fleet's row (a model-test job, started by its fleet)."""
    return workflow.info().typed_search_attributes.get(JOB) == JobKind.MODEL_TEST.value


def set_target(target: str) -> None:
    workflow.upsert_search_attributes([TARGET.value_set(normalise_target(target))])


def details(title: str, rows: dict[str, object]) -> None:
    """Set the Web UI's current details from a dict of facts (presentation.current_details renders
    it: scalars in one table; evaluation reports, artifacts and lists of rows as their own tables)."""
    workflow.set_current_details(current_details(title, rows))


UI_DETAILS_TAB = "user-metadata"
"""The job page's tab that shows the Summary, Details and Current Details fleetforge writes (the Web UI's
`/history` tab, its default, shows the event list)."""


def web_ui_link(base: str, namespace: str, workflow_id: str = "", run_id: str = "", *, query: str = "") -> str:
    """The one builder of Web UI links: a workflow's page (the workflow id URL-encoded, `/` included,
    and its run id) opened on its User Metadata tab, where its summary, request and current details
    (step, last error, figures, artifacts) are; or the namespace's workflow list (optionally filtered by a
    visibility query)."""
    root = f"{base.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows"
    if not workflow_id:
        return root + (f"?query={quote(query, safe='')}" if query else "")
    link = f"{root}/{quote(workflow_id, safe='')}"
    return f"{link}/{quote(run_id, safe='')}/{UI_DETAILS_TAB}" if run_id else link
