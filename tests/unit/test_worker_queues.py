"""Queue selection for `worker.py --queues`, one Worker per distinct queue (with exactly the activities
of the kinds it serves), and how many activities each runs at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio import activity

from activities.storage import open_store
from contracts.common import TaskQueues
from contracts.settings import Settings
from worker import IO_SLOTS, QUEUE_KINDS, WORKFLOWS, Registry, activity_slots, build_registry, parse_queue_kinds, plan_workers


def test_all_means_every_queue_kind():
    assert parse_queue_kinds("all") == list(QUEUE_KINDS)


def test_a_comma_list_selects_kinds():
    assert parse_queue_kinds("llm, kernels") == ["llm", "kernels"]


@pytest.mark.parametrize("spec", ["gpu", "llm,nope", ""])
def test_unknown_kinds_are_rejected_with_the_valid_choices(spec: str):
    with pytest.raises(ValueError, match="choose from all, workflows, llm"):
        parse_queue_kinds(spec)


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    settings = Settings(state_dir=tmp_path)
    return build_registry(settings, open_store(settings))


def names(acts) -> list[str]:
    return [activity._Definition.must_from_callable(a).name for a in acts]


def test_distinct_queues_get_one_worker_each_with_only_their_kinds_activities(registry: Registry):
    queues = Settings(queue_prefix="p").queues
    plans = plan_workers(registry, queues, QUEUE_KINDS, cpus=2)
    assert sorted(p.task_queue for p in plans) == queues.all() and len(plans) == len(QUEUE_KINDS)
    for plan in plans:
        (kind,) = plan.kinds
        assert plan.task_queue == getattr(queues, kind)
        assert names(plan.activities) == names(registry.by_kind[kind]), kind
        assert plan.workflows == (tuple(WORKFLOWS) if kind == "workflows" else ()), kind


def test_kinds_sharing_one_queue_are_one_worker_registering_each_activity_once(registry: Registry):
    (plan,) = plan_workers(registry, TaskQueues.single("q"), QUEUE_KINDS, cpus=2)
    every = {n for kind in QUEUE_KINDS for n in names(registry.by_kind[kind])}
    assert plan.task_queue == "q" and plan.kinds == QUEUE_KINDS
    assert sorted(names(plan.activities)) == sorted(every), "each activity once (a duplicate name fails the Worker)"
    assert plan.workflows == tuple(WORKFLOWS)


def test_only_the_selected_kinds_get_workers(registry: Registry):
    queues = Settings(queue_prefix="p").queues
    plans = plan_workers(registry, queues, ["llm", "kernels"], cpus=2)
    assert [(p.task_queue, p.kinds) for p in plans] == [(queues.llm, ("llm",)), (queues.kernels, ("kernels",))]


def test_cpu_heavy_queues_run_one_activity_per_core_and_the_others_io_slots(registry: Registry):
    plans = {p.kinds: p.max_concurrent_activities
             for p in plan_workers(registry, Settings(queue_prefix="p").queues, QUEUE_KINDS, cpus=3)}
    assert plans == {("workflows",): IO_SLOTS, ("llm",): IO_SLOTS, ("toolchain",): 3, ("kernels",): 3,
                     ("containers",): IO_SLOTS}


@pytest.mark.parametrize("kinds, cpus, slots", [
    (["kernels"], 2, 2), (["toolchain", "kernels"], 16, 16), (["kernels"], 0, 1),
    (["kernels", "llm"], 2, IO_SLOTS), (list(QUEUE_KINDS), 2, IO_SLOTS),
])
def test_activity_slots(kinds: list[str], cpus: int, slots: int):
    assert activity_slots(kinds, cpus) == slots
