"""Queue selection for `worker.py --queues` and one Worker per distinct queue."""

from __future__ import annotations

import pytest

from worker import QUEUE_KINDS, parse_queue_kinds


def test_all_means_every_queue_kind():
    assert parse_queue_kinds("all") == list(QUEUE_KINDS)


def test_a_comma_list_selects_kinds():
    assert parse_queue_kinds("llm, kernels") == ["llm", "kernels"]


@pytest.mark.parametrize("spec", ["gpu", "llm,nope", ""])
def test_unknown_kinds_are_rejected_with_the_valid_choices(spec: str):
    with pytest.raises(ValueError, match="choose from all, workflows, llm"):
        parse_queue_kinds(spec)
