"""The fleet-test job: its request/result, the per-model child's request/result, and the container
activities' request/result models (STYLE G4). The docker-command vocabulary lives in contracts.fleet.

Workflow history carries row indices, compact verdicts and ArtifactRefs only: the manifest CSV,
logs and verdict batches live in the artifact store.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field
from temporalio.contrib.workflow_streams import WorkflowStreamState

from contracts.agents import AgentProvenance
from contracts.common import ArtifactRef, Failure, JobStatus, TaskQueues, TokenTotals
from contracts.fleet import (
    Classification, ErrorCategory, Evidence, HardwareProfile, ModelRow, RowStatus, Runtime, Slot, TestPhase, Tier,
    row_status,
)


class RunnerKind(StrEnum):
    PROCESS = "process"
    """The command is a plain argv (no shell) run on the worker: the fallback without docker."""
    DOCKER = "docker"
    """The command is a `docker run` checked against the CommandPolicy."""
    SCRIPT = "script"
    """`test_models.sh <model> <command>` (exit 0 success, 1 failure, 2 timeout)."""


class ProcessMode(StrEnum):
    """What passing means for the process runner's command."""

    SERVER = "server"
    """The command serves the row's model on $PORT and keeps running: probed like a container (GET /health,
    GET /v1/models lists the row's model, the prompt set), then stopped."""
    SELF_TEST = "self-test"
    """The command tests the model itself and exits: exit 0 (and the row's probe URL, if any) passes; it
    proves SERVES at most."""


FINISHED_STATUSES = frozenset({"yes", "no"})
"""Status cells (case-insensitive) of rows a fleet skips: a verdict about the model exists. `Error`,
empty or anything else is tested (again)."""

FINGERPRINT_FIELDS = ("model_name", "runtime", "image", "gpus", "port", "max_model_len", "command", "probe_url")
"""The cells a test depends on: a verdict is written back only into a row whose cells still match."""


class ManifestRow(BaseModel, frozen=True):
    """One CSV row, keyed by its 0-based index among the data rows."""

    row: int = Field(ge=0)
    model_name: str
    status: str = ""
    note: str = ""
    runtime: Runtime = "vllm"
    image: str | None = None
    gpus: int | None = None
    port: int | None = None
    max_model_len: int | None = None
    command: str | None = None
    """A fixed command for the row (a person's, or the process runner's); `{attempt}` is replaced."""
    probe_url: str | None = None
    """The row's own probe: a URL that must answer a GET with 2xx once the server is up (process runner:
    after the command exits 0; docker runner: instead of `/v1/models` + a one-token completion)."""
    reference: str | None = None
    """The greedy answer the model must give to the first probe prompt (activities/containers/evidence.py)
    for the MATCHES tier."""
    family: str | None = None
    """The row's family for fair sharing (default: the model name's organisation)."""

    @property
    def finished(self) -> bool:
        """The row has a verdict about the model (Yes or No): a fleet skips it."""
        return self.status.strip().lower() in FINISHED_STATUSES

    def fingerprint(self) -> str:
        """Short hash of the cells the test depends on (not status/note, not extra columns)."""
        cells = {f: getattr(self, f) for f in FINGERPRINT_FIELDS}
        if self.reference is not None:  # only when set: rows without one keep the fingerprints they had
            cells["reference"] = self.reference
        return hashlib.sha256(json.dumps(cells, sort_keys=True).encode()).hexdigest()[:16]

    def family_key(self) -> str:
        """The row's family for fair sharing: its `family` cell, else the model name's organisation
        (`meta-llama/Llama-3.1-8B` -> `meta-llama`), else the whole name."""
        return (self.family or self.model_name.split("/", 1)[0]).strip() or self.model_name

    def model_row(self) -> ModelRow:
        return ModelRow(model_name=self.model_name, runtime=self.runtime, image=self.image, gpus=self.gpus,
                        port=self.port, max_model_len=self.max_model_len)


class CommandSource(StrEnum):
    """Who wrote an attempt's command."""

    FIXED = "fixed"
    """The row's `command` column."""
    OFFLINE = "offline"
    """The offline templater with rule-based repairs (the configured writer)."""
    LLM = "llm"
    FALLBACK = "fallback"
    """The offline templater's command after the LLM failed or its answers stayed unusable."""


@dataclass(frozen=True)
class Written:
    """A command for a row's next attempt and who wrote it (ModelTestWorkflow's own value: defined here,
    outside the workflow's module, so the sandbox does not build the class again for every row)."""

    command: str
    source: CommandSource
    transcript: ArtifactRef | None = None
    note: str = ""
    provenance: AgentProvenance | None = None


class RowVerdict(BaseModel, frozen=True):
    """What goes back into the CSV for one row, plus its line of the per-model table (compact: the
    parent keeps up to `continue_every` of these)."""

    row: int
    model_name: str
    passed: bool
    status: RowStatus | None = None
    """Yes / No / Error (None in verdicts recorded before the Error status: read as Yes / No)."""
    fingerprint: str = ""
    """ManifestRow.fingerprint() of the row tested: the write-back's row identity with model_name."""
    category: str = ""
    """ErrorCategory value of the last failure; empty when passed."""
    reason: str = ""
    attempts: int = 0
    reruns: int = 0
    """Test runs that were run again after an interruption (a worker crash): at-least-once made visible."""
    tier: str = ""
    """Tier value the last test reached (empty: no test ran, or a verdict recorded before tiers)."""
    evidence: str = ""
    """Evidence.line() of the last test."""
    commands: list[str] = Field(default_factory=list)
    categories: list[str] = Field(default_factory=list)
    """Per attempt: the ErrorCategory value, or PASSED."""
    duration_s: float = 0.0
    tokens: TokenTotals = Field(default_factory=TokenTotals)
    """The row's command-writer answers (LLM calls and offline decisions; offline ones cost 0 tokens)."""

    @property
    def row_status(self) -> RowStatus:
        return self.status or (RowStatus.YES if self.passed else RowStatus.NO)


class AttemptRecord(BaseModel, frozen=True):
    attempt: int
    command: str
    category: ErrorCategory | None = None
    """None when the attempt passed."""
    reason: str = ""
    duration_s: float = 0.0
    log: ArtifactRef | None = None
    source: CommandSource = CommandSource.OFFLINE
    writer_note: str = ""
    """Why the LLM's answer was not used (the offline writer's command ran instead)."""
    transcript: ArtifactRef | None = None
    """The writer's answer that gave `command` (LLM or offline, same artifact shape); None for a fixed command."""
    provenance: AgentProvenance | None = None
    """How the command was reached on the agent ladder (LLM answers, refusals, fallback reason)."""
    activity_attempt: int = 0
    """Temporal's attempt number of the test activity that gave the outcome (0: the test did not run)."""
    test_runs: int = 0
    """How often the test itself started: 2 or more when an interrupted run (worker crash) was killed and run again."""
    tier: Tier | None = None
    evidence: Evidence | None = None


class PreviousAttempt(BaseModel, frozen=True):
    """What the command writer is told about an earlier attempt of the row."""

    command: str
    category: str
    reason: str
    log_tail: str = ""


class CommandWriterContext(BaseModel, frozen=True):
    """Everything the LLM command writer's prompt is rendered from (STYLE G9)."""

    row: ManifestRow
    hardware: HardwareProfile
    runner: RunnerKind
    attempt: int
    previous: list[PreviousAttempt] = Field(default_factory=list)
    slot: Slot | None = None
    """The port and GPUs the command must use (the policy rejects anything else)."""


# -- activities ------------------------------------------------------------------------------

class PlanFleetRequest(BaseModel, frozen=True):
    fleet_id: str
    manifest: ArtifactRef
    hardware: HardwareProfile = Field(default_factory=HardwareProfile)
    families: bool = False
    """Also return each pending row's family (only a fleet with `max_per_family` needs them)."""
    models: tuple[int, int] = (0, 0)
    """(first position in the pending rows, count): also return these rows' model names (what one fleet
    run can start; not the whole CSV's, which would put every name in every run's history)."""


class FleetPlan(BaseModel, frozen=True):
    total: int
    pending: list[int]
    """Row indices still to test (status neither Yes nor No), in CSV order."""
    skipped: int
    gpus: dict[int, int] = Field(default_factory=dict)
    """GPUs a pending row needs, only for rows that differ from the host's default (sparse: history stays small)."""
    default_gpus: int = 0
    """GPUs every other pending row needs (1 on a GPU host, 0 without GPUs)."""
    families: list[str] = Field(default_factory=list)
    """Distinct families of the pending rows (only when asked)."""
    family_of: dict[int, int] = Field(default_factory=dict)
    """Pending row -> index into `families` (only when asked)."""
    models: dict[int, str] = Field(default_factory=dict)
    """Pending row -> its model name, for the positions asked (a row starts with its FleetforgeModel
    instead of upserting it: one visibility write fewer per row)."""


class RowRequest(BaseModel, frozen=True):
    """Read one manifest row (the model test's first step)."""

    manifest: ArtifactRef
    row: int


class WriteCommandRequest(BaseModel, frozen=True):
    manifest: ArtifactRef
    row: int
    hardware: HardwareProfile
    runner: RunnerKind
    attempt: int = 1
    history: list[Classification] = Field(default_factory=list)
    """Earlier failures of this row, oldest first (policy rejections included)."""
    slot: Slot | None = None


class WriteCommandResult(BaseModel, frozen=True):
    command: str | None = None
    """None when the writer has no further idea (no rule-based repair applies)."""
    reason: str = ""
    transcript: ArtifactRef | None = None
    """The offline writer's decision, recorded like an LLM answer (activities/llm record_offline_answer):
    set when the offline writer wrote `command`. Only the ref crosses into history."""


class PolicyCheckRequest(BaseModel, frozen=True):
    command: str
    runner: RunnerKind
    hardware: HardwareProfile
    slot: Slot | None = None
    """The command must use exactly this port and no GPU outside these devices (None: a direct call,
    checked against the policy only)."""
    row: ModelRow | None = None
    """The row the command is for: it may run only the row's image (None: any valid image)."""


class PolicyCheckResult(BaseModel, frozen=True):
    accepted: bool
    reason: str = ""
    argv: list[str] = Field(default_factory=list)
    """What would run (docker: the spec's argv without our name/labels)."""


class RunTestRequest(BaseModel, frozen=True):
    fleet_id: str
    row: int
    model_name: str
    attempt: int
    command: str
    runner: RunnerKind
    hardware: HardwareProfile
    probe_url: str | None = None
    timeout_s: float = Field(default=600.0, gt=0)
    slot: Slot | None = None
    """The row's port (health and probe go there, and only there) and GPUs (None: a row started before
    slots; the port the command names)."""
    require_tier: Tier = Tier.SERVES
    """The tier a test must reach to pass (`--require-tier`)."""
    reference: str | None = None
    """The row's reference answer (MATCHES tier)."""
    process_mode: ProcessMode = ProcessMode.SERVER
    """The process runner: a server on $PORT, or a self-test whose exit code is the verdict."""
    shares: tuple[str, ...] = ()
    """The process runner: host folders its sandboxed command may read (`--share`)."""


class TestOutcome(BaseModel, frozen=True):
    __test__ = False  # not a pytest class

    passed: bool
    phase: TestPhase = TestPhase.START
    exit_code: int | None = None
    log_tail: str = ""
    log: ArtifactRef | None = None
    duration_s: float = 0.0
    activity_attempt: int = 1
    """Temporal's attempt number of the run_test activity that produced this outcome."""
    test_runs: int = 1
    """1 + earlier runs of this same test that were interrupted (found by their marker/container, killed)."""
    tier: Tier | None = None
    """The highest tier the test reached (None: from a worker before tiers)."""
    evidence: Evidence | None = None


class ClassifyRequest(BaseModel, frozen=True):
    exit_code: int | None = None
    log_tail: str = ""
    phase: TestPhase = TestPhase.START


class SaveVerdictsRequest(BaseModel, frozen=True):
    fleet_id: str
    batch: int
    verdicts: list[RowVerdict]


class RecordVerdictRequest(BaseModel, frozen=True):
    """A finished row's verdict, saved to the store at once (so a cancelled or crashed fleet's finished
    rows still reach the CSV on `--resume`)."""

    fleet_id: str
    verdict: RowVerdict


class FinishFleetRequest(BaseModel, frozen=True):
    fleet_id: str
    manifest: ArtifactRef
    batches: list[ArtifactRef]
    evidence_columns: bool = False
    """Write `tier` and `evidence` columns into the result CSV (`--evidence-columns`)."""


class FinishFleetResult(BaseModel, frozen=True):
    csv: ArtifactRef
    table: ArtifactRef | None = None
    """The per-model table (CSV: row, model, verdict, attempts, commands, categories, duration, tokens)."""
    passed: int
    failed: int
    errors: int = 0
    categories: dict[str, int] = Field(default_factory=dict)


# -- workflows -------------------------------------------------------------------------------

class ApprovalRequest(BaseModel, frozen=True):
    """`approve_command` update: accept or refuse the command of `attempt`."""

    attempt: int
    approved: bool
    reason: str = ""


class ModelTestRequest(BaseModel, frozen=True):
    fleet_id: str
    manifest: ArtifactRef
    row: int
    hardware: HardwareProfile = Field(default_factory=HardwareProfile)
    runner: RunnerKind = RunnerKind.DOCKER
    max_attempts: int = Field(default=3, ge=1, le=10)
    require_approval: bool = False
    test_timeout_s: float = Field(default=600.0, gt=0)
    llm: Literal["offline", "openai"] = "offline"
    """Who writes the commands: the offline templater, or the LLM (offline writer as its fallback)."""
    queues: TaskQueues = Field(default_factory=TaskQueues)
    slot: Slot | None = None
    """The port and GPUs the fleet gave this row (None: the first port of the range, the first GPUs it needs)."""
    require_tier: Tier = Tier.SERVES
    process_mode: ProcessMode = ProcessMode.SERVER
    shares: tuple[str, ...] = ()


class ModelTestResult(BaseModel, frozen=True):
    row: int
    model_name: str
    passed: bool
    status: RowStatus | None = None
    """Yes / No / Error (row_status of passed and category)."""
    fingerprint: str = ""
    attempts: list[AttemptRecord] = Field(default_factory=list)
    category: str = ""
    reason: str = ""
    duration_s: float = 0.0
    tokens: TokenTotals = Field(default_factory=TokenTotals)

    def verdict(self) -> RowVerdict:
        tested = [a for a in self.attempts if a.tier is not None]
        last = tested[-1] if tested else None
        return RowVerdict(tier=last.tier.value if last and last.tier else "",
                          evidence=last.evidence.line() if last and last.evidence else "",
                          row=self.row, model_name=self.model_name, passed=self.passed,
                          status=self.status or row_status(self.passed, self.category), fingerprint=self.fingerprint,
                          category=self.category, reason=self.reason, attempts=len(self.attempts),
                          reruns=sum(max(0, a.test_runs - 1) for a in self.attempts),
                          commands=[a.command for a in self.attempts],
                          categories=[a.category.value if a.category else "PASSED" for a in self.attempts],
                          duration_s=self.duration_s, tokens=self.tokens)


class FleetCarry(BaseModel, frozen=True):
    """What one run hands the next through continue-as-new: counters and refs, never the verdicts."""

    cursor: int = 0
    """Position in FleetPlan.pending of the next row to start."""
    passed: int = 0
    failed: int = 0
    """Rows whose verdict is No."""
    errors: int = 0
    """Rows whose verdict is Error (we failed to test them)."""
    batches: list[ArtifactRef] = Field(default_factory=list)
    categories: dict[str, int] = Field(default_factory=dict)
    started_at: datetime | None = None
    runs: int = 0
    paused: bool = False
    tokens: TokenTotals = Field(default_factory=TokenTotals)
    ahead: list[int] = Field(default_factory=list)
    """Positions in FleetPlan.pending past `cursor` whose rows already ran (a family cap let them start early)."""
    events: WorkflowStreamState | None = None
    """The live events the next run starts from (workflows/_events.py: the latest ones at their offsets)."""


def default_fleet_id(workflow_id: str) -> str:
    """The fleet id of a fleet started without one: its workflow id without the `fleet-test/` kind, any
    other `/` or blank made `-`, so its rows' ids `fleet/<fleet id>/<row>` stay ids the tool accepts."""
    return re.sub(r"[/\s]+", "-", workflow_id.removeprefix("fleet-test/").removeprefix("fleet/")).strip("-") or "fleet"


class FleetTestRequest(BaseModel, frozen=True):
    manifest: ArtifactRef
    """The CSV uploaded by the client."""
    hardware: HardwareProfile = Field(default_factory=HardwareProfile)
    concurrency: int = Field(default=4, ge=1, le=256, description="rows tested at the same time")
    max_attempts: int = Field(default=3, ge=1, le=10, description="attempts per row (each retry is told the last "
                                                                  "failure)")
    runner: RunnerKind = Field(RunnerKind.DOCKER, description="how a row's command runs")
    require_approval: bool = Field(False, description="a person approves every command before it runs "
                                                      "(fleetforge approve, or the MCP approve tool)")
    test_timeout_s: float = Field(default=600.0, gt=0, description="seconds one test may take (a server: to become "
                                                                   "healthy)")
    llm: Literal["offline", "openai"] = "offline"
    """Who writes the docker commands (the client sets it from FLEETFORGE_LLM, like ConversionRequest.llm)."""
    fleet_id: str = ""
    """Default: `default_fleet_id(workflow id)` (the CLI and SDK always set it; a direct Temporal start may not)."""
    continue_every: int = Field(default=500, ge=1)
    """Continue-as-new after this many completions in one run (or when Temporal suggests it)."""
    queues: TaskQueues = Field(default_factory=TaskQueues)
    carry: FleetCarry | None = None
    """Set only by the workflow itself when it continues as new."""
    require_tier: Tier = Field(Tier.SERVES, description="the tier a row must reach to be Yes: BOOTS (healthy), "
                                                        "SERVES (lists its model, answers every request), SENSIBLE "
                                                        "(non-degenerate answers in time), MATCHES (greedy answer = "
                                                        "the row's reference)")
    """Never NONE: that would pass a dead server."""
    evidence_columns: bool = Field(False, description="also write tier and evidence columns into the CSV (the "
                                                      "per-model table always has them)")
    max_per_family: int = Field(default=0, ge=0, description="at most N rows of one family (the family column, else "
                                                             "the model's organisation) run at once; 0: no cap")
    """Rows of other families further down the CSV start meanwhile."""
    process_mode: ProcessMode = Field(ProcessMode.SERVER, description=(
        "the process runner: `server` (the command serves the row's model on $PORT until stopped, probed like a "
        "container) or `self-test` (the command tests the model and exits: exit 0 passes, SERVES at most)"))
    share: list[str] = Field(default_factory=list, description=(
        "the process runner: a folder its sandboxed commands may read, at the same path (repeatable); they see "
        "only their scratch dir and read-only system paths otherwise (not the host's /tmp, not the home)"))


class FleetProgress(BaseModel, frozen=True):
    total: int = 0
    skipped: int = 0
    done: int = 0
    passed: int = 0
    failed: int = 0
    errors: int = 0
    running: int = 0
    capacity: int = 0
    """Rows that can run at once: the smallest of --concurrency, the port range and the GPUs (0 before planning)."""
    paused: bool = False
    runs: int = 1
    eta_s: float | None = None


class FleetTestResult(BaseModel, frozen=True):
    status: JobStatus
    fleet_id: str
    csv: ArtifactRef | None = None
    """The manifest with status/note filled in for every tested row."""
    table: ArtifactRef | None = None
    """The per-model table: attempts, commands, categories, durations, tokens."""
    total: int = 0
    skipped: int = 0
    passed: int = 0
    failed: int = 0
    """Rows whose verdict is No (the model failed)."""
    errors: int = 0
    """Rows whose verdict is Error (we failed to test them; the next run on the CSV retests them)."""
    categories: dict[str, int] = Field(default_factory=dict)
    runs: int = 1
    """Workflow runs the fleet took (continue-as-new count + 1)."""
    failure: Failure | None = None
    tokens: TokenTotals = Field(default_factory=TokenTotals)
    """Every row's command-writer answers: calls, tokens, LLM latency."""

