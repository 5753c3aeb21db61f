"""Converter sweep: what a new user gets for every model the onnx wheel ships, measured in one run.

    .venv/bin/python -m bench.sweep_convert                      # the whole sweep (long: ~1 h on 2 shared cores)
    .venv/bin/python -m bench.sweep_convert --light-only         # the 9 light models x 3 precisions
    .venv/bin/python -m bench.sweep_convert --nodes 8 --markdown sweep.md
    .venv/bin/python -m bench.sweep_convert --only '^test_'       # only the node models

Starts the embedded Temporal dev server (127.0.0.1, random port) and one real `python worker.py`
process (offline planner, file store in a temp dir), then converts for SM8550 with the default preset:
  * every `onnx/backend/test/data/light/light_*.onnx` x {fp16, int8, w8a16} (QNN context binary);
  * a fixed sample of single-op models from `onnx.backend.test.case.node.collect_testcases()` at
    int8: the standard-domain ones whose inputs are float/int/bool tensors at opset <= 22, sorted
    by name, every k-th (k chosen so that `--nodes` models are taken; default 48).

Prints one row per conversion (status, code, worst cosine against its threshold, offload share,
remedies, wall time, the one-line message) and checks the targets:
  * 0 worker crashes (the worker process keeps its PID through the whole sweep);
  * 0 COMPLETED runs below their accuracy threshold;
  * 0 runs ending REPLANS_EXHAUSTED (every plan here is the deterministic offline planner's);
  * every FAILED run has a specific code (a known code with a remedy line, not INTERNAL) and a
    one-line message.
Exit code 0 when every target holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from bench._dev_server import dev_server

PRECISIONS = ("fp16", "int8", "w8a16")
NODE_PRECISION = "int8"
MAX_OPSET = 22
TENSOR_TYPES = frozenset({1, 6, 7, 9})
"""float, int32, int64, bool."""


@dataclass
class Row:
    model: str
    precision: str
    status: str = ""
    code: str = ""
    where: str = ""
    cosine: float | None = None
    threshold: float | None = None
    verdict: str = ""
    offload: float | None = None
    cpu_ops: list[str] = field(default_factory=list)
    remedies: list[str] = field(default_factory=list)
    seconds: float = 0.0
    message: str = ""


def light_models() -> list[Path]:
    import onnx

    return sorted((Path(onnx.__file__).parent / "backend" / "test" / "data" / "light").glob("light_*.onnx"))


def node_models(folder: Path, count: int) -> list[Path]:
    """A fixed, name-ordered sample of the onnx node test models, saved as files."""
    import warnings

    import onnx
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)

    def usable(case: object) -> bool:
        m = case.model  # type: ignore[attr-defined]
        if "_expanded" in case.name or any(o.domain not in ("", "ai.onnx") for o in m.opset_import):  # type: ignore[attr-defined]
            return False
        if any(o.version > MAX_OPSET for o in m.opset_import):
            return False
        return all(i.type.HasField("tensor_type") and i.type.tensor_type.elem_type in TENSOR_TYPES for i in m.graph.input)

    chosen = sorted((c for c in cases if usable(c)), key=lambda c: c.name)
    stride = max(1, len(chosen) // count)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for case in chosen[::stride][:count]:
        path = folder / f"{case.name}.onnx"
        onnx.save(case.model, str(path))
        paths.append(path)
    return paths


async def convert(client: object, queues: object, model: Path, precision: str, timeout_s: float) -> Row:
    from contracts.common import JobKind
    from contracts.convert_job import ConversionRequest, ConversionResult
    from tests.helpers import outcome_of
    from workflows._visibility import start_attributes
    from workflows.converter import ConverterWorkflow

    row = Row(model=model.stem, precision=precision)
    req = ConversionRequest(model=str(model), target_soc="sm8550", precision=precision, queues=queues,  # type: ignore[arg-type]
                            run_id=uuid.uuid4().hex[:8], synthetic_calibration=True)  # no real data: verdicts say unverified
    started = time.monotonic()
    handle = await client.start_workflow(  # type: ignore[attr-defined]
        ConverterWorkflow.run, req, id=f"sweep/{req.run_id}", task_queue=queues.workflows,  # type: ignore[attr-defined]
        search_attributes=start_attributes(JobKind.CONVERT, req.model, "SM8550"))
    try:
        result: ConversionResult = await asyncio.wait_for(outcome_of(handle, ConversionResult), timeout_s)
    except asyncio.TimeoutError:
        await handle.cancel()
        row.status, row.code, row.seconds = "TIMEOUT", "", time.monotonic() - started
        row.message = f"no verdict within {timeout_s:.0f}s (cancelled)"
        return row
    row.seconds = time.monotonic() - started
    row.status = result.status.value
    if result.failure is not None:
        row.code, row.where, row.message = result.failure.code, result.failure.where, result.failure.message
    acc = result.accuracy
    if acc is not None:
        row.cosine, row.threshold, row.verdict, row.remedies = acc.cosine, acc.min_cosine, acc.verdict, list(acc.remedies)
    elif result.evaluation is not None:
        row.cosine = result.evaluation.cosine
    if result.offload is not None:
        row.offload, row.cpu_ops = result.offload.share, list(result.offload.cpu_ops)
    return row


def completed_below(row: Row) -> bool:
    if row.status != "COMPLETED":
        return False
    if row.verdict in ("accepted_lossy", "not_evaluable"):
        return False
    return row.verdict != "passed" or row.cosine is None or row.threshold is None or row.cosine < row.threshold


def specific(row: Row) -> bool:
    """A FAILED row names a known code with a remedy line, and its message is one line."""
    from contracts.errors import remedy

    return bool(row.code) and row.code not in ("INTERNAL", "REPLANS_EXHAUSTED") and bool(remedy(row.code)) \
        and "\n" not in row.message and len(row.message) <= 800


def fmt(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def table(rows: list[Row]) -> str:
    from contracts.errors import clip, explained

    lines = ["| model | precision | status | code | cosine (threshold) | offload | remedies | wall s | message (what to do) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cos = f"{fmt(r.cosine, '.4f')} ({fmt(r.threshold, 'g')})" if r.cosine is not None else ""
        off = fmt(r.offload, ".0%") + (f" (CPU: {', '.join(r.cpu_ops)})" if r.cpu_ops else "")
        msg = explained(clip(r.message, 160), r.code)
        lines.append(f"| {r.model} | {r.precision} | {r.status} | {r.code} | {cos} | {off} | {', '.join(r.remedies)} | "
                     f"{r.seconds:.1f} | {msg.replace('|', '/')} |")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace, workdir: Path) -> int:
    from tests.reliability.worker_process import WorkerProcess

    jobs = [(m, p) for m in light_models() for p in PRECISIONS]
    if not args.light_only:
        jobs += [(m, NODE_PRECISION) for m in node_models(workdir / "nodes", args.nodes)]
    if args.only:
        jobs = [(m, p) for m, p in jobs if re.search(args.only, f"{m.stem} {p}")]
    rows: list[Row] = []
    crashes = 0
    started = time.monotonic()
    async with dev_server() as env:
        wp = WorkerProcess(env.client, workdir / "state", env={"FLEETFORGE_LLM": "offline"})
        await wp.start()
        assert wp.proc is not None
        pid = wp.proc.pid
        gate = asyncio.Semaphore(args.concurrency)

        async def one(model: Path, precision: str) -> None:
            nonlocal crashes
            async with gate:
                row = await convert(env.client, wp.queues, model, precision, args.job_timeout)
            rows.append(row)
            alive = wp.proc is not None and wp.proc.poll() is None
            print(f"[{len(rows):3}/{len(jobs)}] {row.model:<42} {row.precision:<6} {row.status:<9} {row.code:<26} "
                  f"cos {fmt(row.cosine, '.4f'):<7} {row.seconds:6.1f}s worker {'alive' if alive else 'DEAD'}", flush=True)
            if not alive:
                crashes += 1
                await wp.start()

        try:
            await asyncio.gather(*(one(m, p) for m, p in jobs))
        finally:
            same = wp.proc is not None and wp.proc.pid == pid and wp.proc.poll() is None
            wp.stop()

    order = {(m.stem, p): i for i, (m, p) in enumerate(jobs)}
    rows.sort(key=lambda r: order[(r.model, r.precision)])
    md = table(rows)
    print()
    print(md)
    failed = [r for r in rows if r.status == "FAILED"]
    below = [r for r in rows if completed_below(r)]
    exhausted = [r for r in rows if r.code == "REPLANS_EXHAUSTED"]
    vague = [r for r in failed if not specific(r)]
    other = [r for r in rows if r.status not in ("COMPLETED", "FAILED")]
    codes: dict[str, int] = {}
    for r in failed:
        codes[r.code] = codes.get(r.code, 0) + 1
    summary = [
        f"{len(rows)} conversions in {time.monotonic() - started:.0f} s: {sum(r.status == 'COMPLETED' for r in rows)} COMPLETED, "
        f"{len(failed)} FAILED ({', '.join(f'{k} {v}' for k, v in sorted(codes.items()))}), {len(other)} other",
        f"worker crashes: {crashes} (worker PID unchanged: {same})  target 0: {'PASS' if crashes == 0 and same else 'FAIL'}",
        f"COMPLETED below their threshold: {len(below)}  target 0: {'PASS' if not below else 'FAIL'}",
        f"REPLANS_EXHAUSTED (deterministic planner): {len(exhausted)}  target 0: {'PASS' if not exhausted else 'FAIL'}",
        f"FAILED without a specific code and a one-line message: {len(vague)}  target 0: {'PASS' if not vague else 'FAIL'}",
        f"no verdict (timeout): {len(other)}  target 0: {'PASS' if not other else 'FAIL'}",
    ]
    print()
    print("\n".join(summary))
    if args.markdown:
        Path(args.markdown).write_text(md + "\n\n" + "\n".join(f"* {s}" for s in summary) + "\n")
    ok = crashes == 0 and same and not below and not exhausted and not vague and not other
    return 0 if ok else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=48, help="how many onnx node test models (int8)")
    ap.add_argument("--light-only", action="store_true", help="only the light models x 3 precisions")
    ap.add_argument("--concurrency", type=int, default=2, help="conversions at a time (one worker process)")
    ap.add_argument("--job-timeout", type=float, default=1800.0, help="seconds before a conversion counts as hung")
    ap.add_argument("--only", help="a regex on 'MODEL PRECISION': run only the matching conversions")
    ap.add_argument("--markdown", help="also write the table and the summary to this file")
    ap.add_argument("--workdir", help="state, artifacts and node models (default: a temp dir)")
    args = ap.parse_args()
    if args.workdir:
        raise SystemExit(asyncio.run(main_async(args, Path(args.workdir))))
    with tempfile.TemporaryDirectory() as d:
        raise SystemExit(asyncio.run(main_async(args, Path(d))))


if __name__ == "__main__":
    main()
