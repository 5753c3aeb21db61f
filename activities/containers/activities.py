"""ContainerActivities: the fleet test's side effects (manifest I/O, command writing, policy check,
running one test, classifying its failure, recording verdicts, writing the verdict CSV). Built once
by the worker.

`write_command` is the offline templater (each decision recorded like an LLM answer: a transcript
artifact, provider "offline", zero usage); the LLM writer runs in the workflow through the LLM layer
(activities/containers/llm_writer.py) on the agent ladder, with this activity as its fallback. A
row's `command` column is a fixed command (the workflow substitutes `{attempt}`, `{port}`,
`{devices}`), which is also how the process runner gets its commands.

Verdicts live in the store as documents, per fleet: `fleets/<fleet>/rows/<row>.json` as each row
finishes (the row's own last step) and `fleets/<fleet>/batches/<n>.jsonl` per workflow run. The
client's write-back reads them with `collect_verdicts`, also for a fleet that was cancelled or whose
follower was interrupted.
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
from activities.containers.manifest import (
    apply_verdicts, fleet_counts, model_table, parse_manifest, pending_rows, require_commands,
)
from activities.containers.offline_writer import write_command as offline_write_command
from activities.containers.offline_writer import writer_policy
from activities.containers.policy import check_command, to_command
from activities.containers.runners import DockerRunner, ProcessRunner, Runner, ScriptRunner, process_argv
from activities.containers.taxonomy import classify as classify_failure
from activities.llm.activity import record_offline_answer
from activities.storage import ArtifactStore
from contracts.common import ArtifactRef
from contracts.errors import Err, FleetforgeError
from contracts.fleet import Classification
from contracts.fleet_job import (
    ClassifyRequest, FinishFleetRequest, FinishFleetResult, FleetPlan, ManifestRow, PlanFleetRequest,
    PolicyCheckRequest, PolicyCheckResult, RecordVerdictRequest, RowRequest, RowVerdict, RunnerKind, RunTestRequest,
    SaveVerdictsRequest, TestOutcome, WriteCommandRequest, WriteCommandResult,
)
from contracts.settings import Settings

CSV_MEDIA = "text/csv"


def upload_manifest(store: ArtifactStore, csv_text: str, name: str = "manifest.csv",
                    runner: RunnerKind | None = None) -> ArtifactRef:
    """Validate a manifest (for `runner`, when given) and put it in the store (what the client does
    before starting a fleet, so a bad CSV is a one-line error and no job). The stored bytes are the
    text's UTF-8 bytes: the file's own bytes when the client read it without newline translation."""
    rows = parse_manifest(csv_text)
    if runner is RunnerKind.PROCESS:
        require_commands(rows)
    return store.put_bytes(csv_text.encode("utf-8"), media_type=CSV_MEDIA, name=name)


def row_doc(fleet_id: str, row: int) -> str:
    return f"fleets/{fleet_id}/rows/{row:07d}.json"


def batch_doc(fleet_id: str, batch: int) -> str:
    return f"fleets/{fleet_id}/batches/{batch:05d}.jsonl"


def _jsonl(body: bytes) -> list[RowVerdict]:
    return [RowVerdict.model_validate(json.loads(line)) for line in body.decode().splitlines() if line.strip()]


def collect_verdicts(store: ArtifactStore, fleet_id: str) -> dict[int, RowVerdict]:
    """Every verdict the fleet has recorded so far, by row (the batches first, then the rows that
    finished since the last batch; a fleet that is still running or was cancelled has only some)."""
    verdicts: dict[int, RowVerdict] = {}
    for key in store.list_docs(f"fleets/{fleet_id}/batches/"):
        for v in _jsonl(store.get_doc(key) or b""):
            verdicts[v.row] = v
    for key in store.list_docs(f"fleets/{fleet_id}/rows/"):
        row = key.rsplit("/", 1)[-1].removesuffix(".json")
        if row.isdigit() and int(row) not in verdicts and (body := store.get_doc(key)):
            v = RowVerdict.model_validate_json(body)
            verdicts[v.row] = v
    return verdicts


class ContainerActivities:
    def __init__(self, store: ArtifactStore, settings: Settings, *, runners: Mapping[RunnerKind, Runner] | None = None,
                 process_programs: Sequence[str] | None = None, script: Path | None = None):
        self.store = store
        self.settings = settings
        self.process_programs = tuple(process_programs if process_programs is not None else
                                      (p.strip() for p in settings.process_programs.split(",") if p.strip()))
        markers = settings.state_dir.resolve() / "fleet-rows"
        default: dict[RunnerKind, Runner] = {
            RunnerKind.PROCESS: ProcessRunner(store, self.process_programs, marker_dir=markers),
            RunnerKind.DOCKER: DockerRunner(store, marker_dir=markers),
            RunnerKind.SCRIPT: ScriptRunner(store, script or Path("test_models.sh").resolve(), marker_dir=markers),
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
        text = self.store.get_bytes(ref).decode("utf-8")
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
    def plan_fleet(self, req: PlanFleetRequest) -> FleetPlan:
        """The rows to test and what each needs of the host (GPUs; every row needs one port)."""
        rows = self._manifest(req.manifest)[1]
        pending = pending_rows(rows)
        default = req.hardware.gpus_for(None)
        gpus = {i: n for i in pending if (n := req.hardware.gpus_for(rows[i].gpus)) != default}
        families: list[str] = []
        family_of: dict[int, int] = {}
        if req.families:
            index: dict[str, int] = {}
            for i in pending:
                family_of[i] = index.setdefault(rows[i].family_key(), len(index))
            families = list(index)
        first, count = req.models
        models = {i: rows[i].model_name for i in pending[first:first + count]}
        return FleetPlan(total=len(rows), pending=pending, skipped=len(rows) - len(pending), gpus=gpus,
                         default_gpus=default, families=families, family_of=family_of, models=models)

    @activity.defn(name="containers.read_row")
    def read_row(self, req: RowRequest) -> ManifestRow:
        return self._row(req.manifest, req.row)

    @activity.defn(name="containers.write_command")
    def write_command(self, req: WriteCommandRequest) -> WriteCommandResult:
        """The offline writer's command for the row's slot, or why it has none (no template for the row,
        no rule-based repair for its last failure): then `command` is None and `reason` says why."""
        row = self._row(req.manifest, req.row)
        base = WriteCommandResult()
        if req.runner is RunnerKind.PROCESS:
            return base.model_copy(update={"reason": "the process runner needs a `command` column for this row"})
        try:
            command = offline_write_command(row.model_row(), req.hardware, req.history, req.slot)
        except FleetforgeError as e:
            if e.code is not Err.BAD_INPUT:
                raise
            return base.model_copy(update={"reason": e.message})
        if command is None:
            last = req.history[-1].category.value if req.history else "?"
            return base.model_copy(update={"reason": f"no rule-based repair for {last}"})
        return base.model_copy(update={"command": command, "transcript": self._record_offline(req, row, command)})

    def _record_offline(self, req: WriteCommandRequest, row: ManifestRow, command: str) -> ArtifactRef:
        """The offline decision as a transcript like an LLM call's; its request is what the offline writer
        decided from (the row, the host, the slot and the earlier failures), since it has no prompt."""
        request = {"writer": "offline", "runner": req.runner.value, "attempt": req.attempt,
                   "row": row.model_row().model_dump(mode="json"), "hardware": req.hardware.model_dump(mode="json"),
                   "slot": req.slot.model_dump(mode="json") if req.slot else None,
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
        verdict = check_command(req.command, writer_policy(req.hardware, req.row), req.slot, req.hardware.gpu_count)
        if not verdict.accepted or verdict.spec is None:
            return PolicyCheckResult(accepted=False, reason=verdict.reason)
        return PolicyCheckResult(accepted=True, argv=shlex.split(to_command(verdict.spec)))

    @activity.defn(name="containers.run_test")
    async def run_test(self, req: RunTestRequest) -> TestOutcome:
        runner = self.runners.get(req.runner)
        if runner is None:
            raise FleetforgeError(Err.RUNNER_UNAVAILABLE, f"no {req.runner.value} runner on this worker")
        outcome = await runner.run(req, lambda msg: activity.heartbeat(msg))
        return outcome.model_copy(update={"activity_attempt": activity.info().attempt})

    @activity.defn(name="containers.classify")
    def classify(self, req: ClassifyRequest) -> Classification:
        return classify_failure(req.exit_code, req.log_tail, req.phase)

    @activity.defn(name="containers.record_verdict")
    def record_verdict(self, req: RecordVerdictRequest) -> None:
        """A finished row's verdict, saved at once (the write-back after a cancel or crash reads it)."""
        self.store.put_doc(row_doc(req.fleet_id, req.verdict.row), req.verdict.model_dump_json().encode())

    @activity.defn(name="containers.save_verdicts")
    def save_verdicts(self, req: SaveVerdictsRequest) -> ArtifactRef:
        """One run's verdicts as a JSON-lines artifact (the fleet carries refs, not verdicts) and the same
        lines as the fleet's batch document (what the write-back reads first)."""
        body = "".join(v.model_dump_json() + "\n" for v in req.verdicts).encode()
        self.store.put_doc(batch_doc(req.fleet_id, req.batch), body)
        return self.store.put_bytes(body, media_type="application/x-ndjson",
                                    name=f"fleet/{req.fleet_id}/verdicts-{req.batch:05d}.jsonl")

    @activity.defn(name="containers.finish_fleet")
    def finish_fleet(self, req: FinishFleetRequest) -> FinishFleetResult:
        """The manifest with every verdict applied (the last verdict of a row wins), as a CSV artifact."""
        text = self._manifest(req.manifest)[0]
        verdicts: dict[int, RowVerdict] = {}
        for ref in req.batches:
            for v in _jsonl(self.store.get_bytes(ref)):
                verdicts[v.row] = v
        passed, failed, errors, categories = fleet_counts(verdicts.values())
        csv_text = apply_verdicts(text, verdicts.values(), req.evidence_columns)
        ref = self.store.put_bytes(csv_text.encode("utf-8"), media_type=CSV_MEDIA,
                                   name=f"fleet/{req.fleet_id}/results.csv")
        table = self.store.put_bytes(model_table(sorted(verdicts.values(), key=lambda v: v.row)).encode("utf-8"),
                                     media_type=CSV_MEDIA, name=f"fleet/{req.fleet_id}/models.csv")
        return FinishFleetResult(csv=ref, table=table, passed=passed, failed=failed, errors=errors,
                                 categories=categories)

    def all(self) -> list:
        return [self.plan_fleet, self.read_row, self.write_command, self.check_policy, self.run_test, self.classify,
                self.record_verdict, self.save_verdicts, self.finish_fleet]

    def local(self) -> list:
        """What ModelTestWorkflow runs as local activities: the worker that runs the workflow needs them."""
        return [self.read_row, self.write_command, self.check_policy, self.classify, self.record_verdict]
