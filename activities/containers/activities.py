"""ContainerActivities: the fleet test's side effects (manifest I/O, command writing, policy check,
running one test, classifying its failure, writing the verdict CSV). Built once by the worker.

`write_command` is the offline templater (each decision recorded like an LLM answer: a transcript
artifact, provider "offline", zero usage); the LLM writer runs in the workflow through the LLM layer
(activities/containers/llm_writer.py) with this activity's command as its fallback. A row's
`command` column is a fixed command (used as is, `{attempt}` substituted), which is also how the
process runner gets its commands.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path

from temporalio import activity

from activities.containers.llm_writer import AGENT as WRITER_AGENT
from activities.containers.manifest import apply_verdicts, model_table, parse_manifest, pending_rows, require_commands
from activities.containers.offline_writer import write_command as offline_write_command
from activities.containers.offline_writer import writer_policy
from activities.containers.policy import check_command, to_command
from activities.containers.runners import (
    DEFAULT_PROGRAMS, DockerRunner, ProcessRunner, Runner, ScriptRunner, process_argv,
)
from activities.containers.taxonomy import classify as classify_failure
from activities.llm.activity import record_offline_answer
from activities.storage import ArtifactStore
from contracts.common import ArtifactRef
from contracts.errors import Err, FleetforgeError
from contracts.fleet import Classification, ErrorCategory
from contracts.fleet_job import (
    ClassifyRequest, CommandSource, FinishFleetRequest, FinishFleetResult, FleetPlan, ManifestRow, PolicyCheckRequest,
    PolicyCheckResult, RowVerdict, RunnerKind, RunTestRequest, SaveVerdictsRequest, TestOutcome,
    WriteCommandRequest, WriteCommandResult,
)
from contracts.settings import Settings

CSV_MEDIA = "text/csv"


def upload_manifest(store: ArtifactStore, csv_text: str, name: str = "manifest.csv",
                    runner: RunnerKind | None = None) -> ArtifactRef:
    """Validate a manifest (for `runner`, when given) and put it in the store (what the client does
    before starting a fleet, so a bad CSV is a one-line error and no job)."""
    rows = parse_manifest(csv_text)
    if runner is RunnerKind.PROCESS:
        require_commands(rows)
    return store.put_bytes(csv_text.encode("utf-8"), media_type=CSV_MEDIA, name=name)


class ContainerActivities:
    def __init__(self, store: ArtifactStore, settings: Settings, *, runners: Mapping[RunnerKind, Runner] | None = None,
                 process_programs: Sequence[str] = DEFAULT_PROGRAMS, script: Path | None = None):
        self.store = store
        self.settings = settings
        self.process_programs = tuple(process_programs)
        default: dict[RunnerKind, Runner] = {
            RunnerKind.PROCESS: ProcessRunner(store, self.process_programs),
            RunnerKind.DOCKER: DockerRunner(store),
            RunnerKind.SCRIPT: ScriptRunner(store, script or Path("test_models.sh").resolve()),
        }
        self.runners: dict[RunnerKind, Runner] = {**default, **(runners or {})}
        self._manifests: OrderedDict[str, tuple[str, list[ManifestRow]]] = OrderedDict()
        self._lock = threading.Lock()

    def _manifest(self, ref: ArtifactRef) -> tuple[str, list[ManifestRow]]:
        """(text, rows) of a manifest, parsed once per process (content-addressed, so safe to cache)."""
        with self._lock:
            if ref.sha256 in self._manifests:
                self._manifests.move_to_end(ref.sha256)
                return self._manifests[ref.sha256]
        text = self.store.get_bytes(ref).decode("utf-8-sig")
        parsed = (text, parse_manifest(text))
        with self._lock:
            self._manifests[ref.sha256] = parsed
            while len(self._manifests) > 8:
                self._manifests.popitem(last=False)
        return parsed

    def _row(self, ref: ArtifactRef, row: int) -> ManifestRow:
        rows = self._manifest(ref)[1]
        if not 0 <= row < len(rows):
            raise FleetforgeError(Err.MANIFEST_INVALID, f"manifest has no row {row} ({len(rows)} rows)")
        return rows[row]

    @activity.defn(name="containers.plan_fleet")
    def plan_fleet(self, manifest: ArtifactRef) -> FleetPlan:
        rows = self._manifest(manifest)[1]
        pending = pending_rows(rows)
        return FleetPlan(total=len(rows), pending=pending, skipped=len(rows) - len(pending))

    @activity.defn(name="containers.write_command")
    def write_command(self, req: WriteCommandRequest) -> WriteCommandResult:
        """The row's fixed command, else the offline writer's; the row comes along (the LLM writer's
        prompt is rendered from it, and the offline command is its fallback)."""
        row = self._row(req.manifest, req.row)
        base = WriteCommandResult(model_name=row.model_name, probe_url=row.probe_url, row=row)
        if row.command:
            if req.history and req.history[-1].category is ErrorCategory.POLICY_REJECTED and "{attempt}" not in row.command:
                return base.model_copy(update={"source": CommandSource.FIXED,
                                               "reason": "the row's fixed command was rejected; it needs a person"})
            return base.model_copy(update={"source": CommandSource.FIXED,
                                           "command": row.command.replace("{attempt}", str(req.attempt))})
        if req.runner is RunnerKind.PROCESS:
            return base.model_copy(update={"reason": "the process runner needs a `command` column for this row"})
        command = offline_write_command(row.model_row(), req.hardware, req.history)
        if command is None:
            last = req.history[-1].category.value if req.history else "?"
            return base.model_copy(update={"reason": f"no rule-based repair for {last}"})
        return base.model_copy(update={"command": command, "transcript": self._record_offline(req, row, command)})

    def _record_offline(self, req: WriteCommandRequest, row: ManifestRow, command: str) -> ArtifactRef:
        """The offline decision as a transcript like an LLM call's; its request is what the offline writer
        decided from (the row, the host and the earlier failures), since it has no prompt."""
        request = {"writer": "offline", "runner": req.runner.value, "attempt": req.attempt,
                   "row": row.model_row().model_dump(mode="json"), "hardware": req.hardware.model_dump(mode="json"),
                   "history": [c.model_dump(mode="json") for c in req.history]}
        return record_offline_answer(self.store, WRITER_AGENT, request, command).transcript

    @activity.defn(name="containers.check_policy")
    def check_policy(self, req: PolicyCheckRequest) -> PolicyCheckResult:
        if req.runner is RunnerKind.PROCESS:
            try:
                return PolicyCheckResult(accepted=True, argv=process_argv(req.command, self.process_programs))
            except FleetforgeError as e:
                if e.code is not Err.POLICY_REJECTED:
                    raise
                return PolicyCheckResult(accepted=False, reason=e.message)
        verdict = check_command(req.command, writer_policy(req.hardware))
        if not verdict.accepted or verdict.spec is None:
            return PolicyCheckResult(accepted=False, reason=verdict.reason)
        return PolicyCheckResult(accepted=True, argv=shlex.split(to_command(verdict.spec)))

    @activity.defn(name="containers.run_test")
    async def run_test(self, req: RunTestRequest) -> TestOutcome:
        runner = self.runners.get(req.runner)
        if runner is None:
            raise FleetforgeError(Err.RUNNER_UNAVAILABLE, f"no {req.runner.value} runner on this worker")
        return await runner.run(req, lambda msg: activity.heartbeat(msg))

    @activity.defn(name="containers.classify")
    def classify(self, req: ClassifyRequest) -> Classification:
        return classify_failure(req.exit_code, req.log_tail, req.phase)

    @activity.defn(name="containers.save_verdicts")
    def save_verdicts(self, req: SaveVerdictsRequest) -> ArtifactRef:
        """One batch of verdicts as a JSON-lines artifact (the fleet carries refs, not verdicts)."""
        body = "".join(v.model_dump_json() + "\n" for v in req.verdicts).encode()
        return self.store.put_bytes(body, media_type="application/x-ndjson",
                                    name=f"fleet/{req.fleet_id}/verdicts-{req.batch:05d}.jsonl")

    @activity.defn(name="containers.finish_fleet")
    def finish_fleet(self, req: FinishFleetRequest) -> FinishFleetResult:
        """The manifest with every verdict applied (the last verdict of a row wins), as a CSV artifact."""
        text = self._manifest(req.manifest)[0]
        verdicts: dict[int, RowVerdict] = {}
        for ref in req.batches:
            for line in self.store.get_bytes(ref).decode().splitlines():
                if line.strip():
                    v = RowVerdict.model_validate(json.loads(line))
                    verdicts[v.row] = v
        categories: dict[str, int] = {}
        for v in verdicts.values():
            key = "PASSED" if v.passed else (v.category or ErrorCategory.UNKNOWN.value)
            categories[key] = categories.get(key, 0) + 1
        csv_text = apply_verdicts(text, verdicts.values())
        ref = self.store.put_bytes(csv_text.encode("utf-8"), media_type=CSV_MEDIA,
                                   name=f"fleet/{req.fleet_id}/results.csv")
        table = self.store.put_bytes(model_table(sorted(verdicts.values(), key=lambda v: v.row)).encode("utf-8"),
                                     media_type=CSV_MEDIA, name=f"fleet/{req.fleet_id}/models.csv")
        passed = sum(1 for v in verdicts.values() if v.passed)
        return FinishFleetResult(csv=ref, table=table, passed=passed, failed=len(verdicts) - passed,
                                 categories=dict(sorted(categories.items())))

    def all(self) -> list:
        return [self.plan_fleet, self.write_command, self.check_policy, self.run_test, self.classify,
                self.save_verdicts, self.finish_fleet]

    def local(self) -> list:
        """What ModelTestWorkflow runs as local activities: the worker that runs the workflow needs them."""
        return [self.write_command, self.check_policy, self.classify]
