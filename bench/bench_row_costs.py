"""What a fleet row's Temporal features cost, each alone: bare parent/child variants, in one run.

Every variant runs the bare parent/child of bench_fleet (a sliding window of children, each three no-op
local activities and one no-op activity) with one feature added to the child, so the difference from
`plain` is that feature's price on the server, the worker and the whole machine:

* `priority-key`: the activity carries a priority key (`Priority(priority_key=2)`);
* `fairness-key`: the activity carries a fairness key only;
* `upserts`: the child upserts two search attributes (a model when it starts, a status when it ends);
* `start-attributes`: the child is started with two search attributes and a static summary.

The variants alternate, reversing the order each round (neither gains from the other's leftovers), and
each prints medians per row over the rounds and its machine CPU as a ratio of `plain`'s. Informational
(no target): it is how fleetforge decided what a row leaves out (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import Priority, SearchAttributePair, TypedSearchAttributes

from bench._dev_server import dev_server

with workflow.unsafe.imports_passed_through():  # the sandbox re-imports this module for every child
    from bench.bench_fleet import cpu_s, noop, server_pid, sliding_window
    from workflows._visibility import JOB, MODEL, STATUS

VARIANTS = ("plain", "priority-key", "fairness-key", "upserts", "start-attributes")


class VariantRequest(BaseModel):
    rows: int
    concurrency: int
    queue: str
    variant: str


@workflow.defn
class VariantChild:
    @workflow.run
    async def run(self, req: VariantRequest) -> int:
        for i in range(3):
            await workflow.execute_local_activity(noop, i, start_to_close_timeout=timedelta(seconds=30))
        if req.variant == "upserts":
            workflow.upsert_search_attributes([MODEL.value_set("org/model")])
        priority = {"priority-key": Priority(priority_key=2), "fairness-key": Priority(fairness_key="org")}
        await workflow.execute_activity(noop, 1, task_queue=req.queue, start_to_close_timeout=timedelta(seconds=30),
                                        priority=priority.get(req.variant, Priority.default))
        if req.variant == "upserts":
            workflow.upsert_search_attributes([STATUS.value_set("COMPLETED")])
        return 1


@workflow.defn
class VariantParent:
    @workflow.run
    async def run(self, req: VariantRequest) -> int:
        marked = req.variant == "start-attributes"
        attributes = TypedSearchAttributes([SearchAttributePair(JOB, "model-test"), SearchAttributePair(MODEL, "org/model")])
        return await sliding_window(req.rows, req.concurrency, lambda row: workflow.execute_child_workflow(
            VariantChild.run, req, id=f"{workflow.info().workflow_id}/{row}", task_queue=req.queue,
            search_attributes=attributes if marked else None, static_summary=f"row {row}: org/model" if marked else None))


async def main_async(rows: int, concurrency: int, rounds: int) -> None:
    from tests.helpers import new_worker

    queue = f"row-costs-{uuid.uuid4().hex[:8]}"
    taken: dict[str, list[tuple[float, float, float, float]]] = {v: [] for v in VARIANTS}
    async with dev_server() as env:
        server = server_pid()

        async def run(variant: str, n: int) -> tuple[float, float, float, float]:
            wall, before = time.monotonic(), cpu_s(server)
            await env.client.execute_workflow(VariantParent.run, VariantRequest(rows=n, concurrency=concurrency, queue=queue,
                                                                                variant=variant),
                                              id=f"row-costs/{uuid.uuid4().hex[:8]}", task_queue=queue)
            after = cpu_s(server)
            return (time.monotonic() - wall, *(a - b for a, b in zip(after, before, strict=True)))

        async with new_worker(env.client, workflows=[VariantParent, VariantChild], activities=[noop], task_queue=queue,
                              max_concurrent_activities=64, max_concurrent_workflow_tasks=64):
            for variant in VARIANTS:  # warm-up, untimed
                await run(variant, 64)
            for r in range(rounds):
                for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                    taken[variant].append(await run(variant, rows))

    def per_row(variant: str, k: int) -> float:
        return statistics.median(t[k] for t in taken[variant]) / rows * 1000

    print(f"rows {rows}, concurrency {concurrency}, {rounds} rounds; per row, medians (ms):")
    print(f"{'variant':18s} {'wall':>6s} {'worker':>7s} {'server':>7s} {'machine':>8s}  machine / plain")
    for variant in VARIANTS:
        print(f"{variant:18s} {per_row(variant, 0):6.1f} {per_row(variant, 1):7.1f} {per_row(variant, 2):7.1f} "
              f"{per_row(variant, 3):8.1f}  {per_row(variant, 3) / per_row('plain', 3):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(main_async(args.rows, args.concurrency, args.rounds))


if __name__ == "__main__":
    main()
