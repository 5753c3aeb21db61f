"""Converter benchmark: cache speedup and orchestration overhead per step, measured in one run.

    .venv/bin/python -m bench.bench_convert [--model PATH] [--workdir DIR]

Starts the embedded Temporal dev server (the `temporal` binary, 127.0.0.1, random port) and one
worker on a throwaway queue; converts light_resnet50.onnx from the onnx wheel (or the tiny CNN,
with a printed note, if it is absent) to an SM8550 int8 QNN context binary twice with the offline
planner and a file store. Prints:
  * cache speedup = second run wall time / first run wall time (the second run restores every step
    and the evaluation from the content-addressed caches, so it runs no tool and no model);
  * per step of the first run: activity time (scheduled → completed, from the history), and the
    orchestration overhead = workflow wall time − summed activity time, spread per step.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

from bench._history import activity_times
from bench._dev_server import dev_server


def find_model() -> tuple[Path | None, str]:
    import onnx

    p = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"
    return (p, "light_resnet50") if p.is_file() else (None, "")


async def main_async(model_arg: str | None, workdir: Path) -> None:
    from activities.storage import FileStore
    from contracts.common import JobKind, JobStatus, TaskQueues
    from contracts.convert import Precision
    from contracts.convert_job import ConversionRequest, ConversionResult
    from contracts.settings import Settings
    from examples.tiny_model import build_tiny_cnn
    from tests.helpers import new_worker, outcome_of
    from worker import build_registry
    from workflows._visibility import start_attributes
    from workflows.converter import ConverterWorkflow

    if model_arg:
        model, label = Path(model_arg), Path(model_arg).stem
    else:
        found, label = find_model()
        if found is None:
            print("note: light_resnet50.onnx is not in this onnx wheel; benchmarking the tiny CNN instead")
            model, label = build_tiny_cnn(workdir / "tiny.onnx"), "tiny_cnn"
        else:
            model = found
    settings = Settings(state_dir=workdir / "state")
    store = FileStore(workdir / "artifacts")
    reg = build_registry(settings, store)
    queues = TaskQueues.single(f"bench-{uuid.uuid4().hex[:8]}")
    async with dev_server() as env:
        client = env.client
        async with new_worker(client, workflows=[ConverterWorkflow], activities=reg.by_kind["toolchain"],
                              task_queue=queues.workflows):
            runs = []
            for _ in range(2):
                req = ConversionRequest(model=str(model), target_soc="sm8550", precision=Precision.INT8, queues=queues,
                                        run_id=uuid.uuid4().hex[:8], synthetic_calibration=True)
                t0 = time.monotonic()
                handle = await client.start_workflow(ConverterWorkflow.run, req, id=f"bench-convert/{req.run_id}",
                                                     task_queue=queues.workflows,
                                                     search_attributes=start_attributes(JobKind.CONVERT, req.model, "SM8550"))
                result: ConversionResult = await outcome_of(handle, ConversionResult)
                wall = time.monotonic() - t0
                if result.status is not JobStatus.COMPLETED:
                    raise SystemExit(f"conversion failed: {result.failure}")
                runs.append((wall, result, await activity_times(handle)))

    (w1, r1, acts1), (w2, r2, acts2) = runs
    print(f"model: {label} ({model.stat().st_size / 1e6:.1f} MB) → SM8550 int8 QNN context binary, offline planner, file store")
    for n, (w, r) in enumerate(((w1, r1), (w2, r2)), 1):
        acc = r.accuracy
        print(f"run {n}: {w:7.2f} s  executed={r.executed_steps} cached={r.cached_steps} attempts="
              f"{[a.outcome for a in r.attempts]} accuracy={acc.verdict if acc else '-'} cosine={r.evaluation.cosine:.4f} "
              f"remedies={acc.remedies if acc else []}")
    print(f"cache speedup (second run / first run wall time): {w2 / w1:.3f}  (= {w1 / w2:.1f}x faster)")
    steps1 = sum(sec for n, _, sec in acts1 if n == "execute_step")
    steps2 = sum(sec for n, _, sec in acts2 if n == "execute_step")
    ev1 = sum(sec for n, _, sec in acts1 if n == "evaluate")
    ev2 = sum(sec for n, _, sec in acts2 if n == "evaluate")
    # an int8 model whose softmax collapses takes two attempts (the gate's remedy): both runs do the same
    print(f"tool steps only (execute_step, second / first): {steps2 / steps1:.4f}  ({steps1:.2f} s → {steps2:.3f} s)")
    print(f"evaluation (second / first): {ev2 / ev1:.4f}  ({ev1:.2f} s → {ev2:.3f} s; cached={r2.evaluation.cached}: "
          "the figures are restored from the evaluation cache instead of rerunning HTP emulation)")
    for label_, wall, acts in (("run 1", w1, acts1), ("run 2", w2, acts2)):
        total = sum(s for _, _, s in acts)
        print(f"{label_}: {len(acts)} activities, summed activity time {total:.2f} s, "
              f"orchestration overhead {wall - total:.2f} s = {(wall - total) / len(acts) * 1000:.0f} ms per step "
              f"({(wall - total) / wall:.1%} of wall time)")
        for name, _, s in acts:
            print(f"    {name:<22} {s * 1000:8.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="ONNX model to convert (default: light_resnet50 from the onnx wheel)")
    ap.add_argument("--workdir", help="state and artifacts folder (default: a temp dir)")
    args = ap.parse_args()
    if args.workdir:
        asyncio.run(main_async(args.model, Path(args.workdir)))
    else:
        with tempfile.TemporaryDirectory() as d:
            asyncio.run(main_async(args.model, Path(d)))


if __name__ == "__main__":
    main()
