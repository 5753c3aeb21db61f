"""The kernel job's rules: a KernelRequest from a KernelBench-format task file, checked before a job
starts (BAD_INPUT / KERNEL_TASK_INVALID / WORKFLOW_CONFIG_INVALID). The task's source (with any
`sets` applied) goes to the artifact store and its workflow config travels in the request, so no worker
reads the client's disk."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from client.paths import local_path
from contracts.errors import Err, FleetforgeError
from contracts.kernel import TimeLimit
from contracts.kernel_job import KernelRequest

if TYPE_CHECKING:
    from activities.storage import ArtifactStore


class KernelStart(BaseModel):
    """A checked kernel request and what the user should be told before it runs."""

    request: KernelRequest
    hint: str = ""
    """e.g. the CPU verifier's memory estimate for big default sizes (empty: nothing to say)."""


def kernel_request(
    task: str | Path, *, run_id: str, arch: str = "cpu", workflow: str = "default", op_name: str | None = None,
    sets: dict[str, str] | None = None, cwd: Path | None = None, **fields: Any,
) -> KernelStart:
    """`fields` go to KernelTask (num_candidates, max_step, ...) or KernelRequest (max_llm_answers,
    llm_rejections_before_fallback, time_limit, ...), whichever has them. `time_limit_multiple`,
    `time_limit_floor_s` and `time_limit_ceiling_s` set one field of the verifier's time limit over the
    workflow.yaml's `verifier.time_limit` (None: its value)."""
    from activities.kernels.config_loader import config_for_task
    from activities.kernels.reference import precheck
    from activities.kernels.task_source import apply_overrides, check_op_name, check_task, op_name_for, parse_value
    from contracts.kernel import CPU_ARCH, KernelTask, RooflineGpu, canonical_arch

    try:
        arch = canonical_arch(arch)
    except ValueError as e:
        raise FleetforgeError(Err.BAD_INPUT, f"--arch: {e}") from None
    gpus = RooflineGpu.__args__
    if fields.get("roofline_gpu", "h100") not in gpus:
        raise FleetforgeError(Err.BAD_INPUT, f"--roofline-gpu: unknown GPU {fields['roofline_gpu']!r}; the cost model "
                                             f"knows {', '.join(gpus)}")
    path = local_path(str(task), cwd)
    if path is None or not path.is_file():
        raise FleetforgeError(Err.BAD_INPUT, f"{task}: no such task file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FleetforgeError(Err.BAD_INPUT, f"{task}: cannot read: {e}") from None
    check_task(text, path.name)
    name = check_op_name(op_name) if op_name is not None else op_name_for(path.stem)
    overrides = {k: parse_value(k, v) for k, v in (sets or {}).items()}
    source = apply_overrides(text, overrides, path.name)
    hint = precheck(source, path.name) if arch == CPU_ARCH else ""  # BAD_INPUT when the verifier cannot hold the inputs
    workflow_file = local_path(workflow, cwd) if workflow.endswith((".yaml", ".yml")) else None
    limit_fields = {f: fields.pop(f"time_limit_{f}") for f in TimeLimit.model_fields if f"time_limit_{f}" in fields}
    request_fields = {k: fields.pop(k) for k in list(fields) if k in KernelRequest.model_fields}
    kt = KernelTask(op_name=name, task_desc=source, task_id=f"{name}-{run_id}", arch=arch,
                    workflow=str(workflow_file) if workflow_file else workflow, overrides=overrides,
                    source_file=path.name, **fields)
    config = config_for_task(kt)
    if request_fields.get("time_limit") is None:
        request_fields["time_limit"] = time_limit_from(config.verifier.time_limit, limit_fields)
    return KernelStart(request=KernelRequest(task=kt, config=config, **request_fields), hint=hint or "")


def time_limit_from(base: TimeLimit, given: dict[str, float | None]) -> TimeLimit | None:
    """`base` (the workflow.yaml's) with the fields the user gave (None: not given); None when none was
    given, so the workflow.yaml's stays in charge; BAD_INPUT for a limit that cannot be."""
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return None
    try:
        return TimeLimit.model_validate({**base.model_dump(), **given})
    except ValidationError as e:
        problems = "; ".join(".".join(map(str, err["loc"])) + ": " * bool(err["loc"])
                             + err["msg"].removeprefix("Value error, ") for err in e.errors(include_url=False))
        raise FleetforgeError(Err.BAD_INPUT, f"verifier time limit: {problems}") from None


def with_source_in_store(request: KernelRequest, store: "ArtifactStore") -> KernelRequest:
    """The request with its task's source put in the store (KernelTask.stored): the job's start then holds a
    ref, and the workflow history never holds the source (a whole model's file is kilobytes, and the first
    activity's request would hold it again)."""
    task = request.task
    if task.source is not None:
        return request
    ref = store.put_bytes(task.task_desc.encode("utf-8"), media_type="text/x-python", name="task.py")
    return request.model_copy(update={"task": task.stored(ref)})
