"""The offline optimizer's registry and round plan, and the figures the LLM optimizer gets as feedback: pure."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from activities.kernels import optimizer
from activities.kernels.cost_model import feedback, model
from activities.kernels.llm_agents import code_prompt
from contracts.kernel import KernelTask
from contracts.kernel_job import CodeRequest, LaunchCost
from tests.unit.test_cost_model import softmax_task


@dataclass
class Graph:
    """Stands in for the compiler's graph: what the rewrites below change."""

    nodes: list[str]
    outputs: list[int] = field(default_factory=list)


@pytest.fixture
def rewrites(monkeypatch):
    """Two rewrites of a toy graph, registered for the test only."""
    monkeypatch.setattr(optimizer, "REWRITES", {})

    @optimizer.rewrite("fuse", order=10, summary="joins neighbours")
    def fuse(g: Graph) -> Graph | None:
        if "a" not in g.nodes:
            return None
        g.nodes = ["ab" if n == "a" else n for n in g.nodes if n != "b"]
        return g

    @optimizer.rewrite("blocks", order=20, summary="sizes blocks")
    def blocks(g: Graph) -> Graph | None:
        g.nodes = [n + "*" for n in g.nodes]
        return g

    return optimizer.REWRITES


def test_each_round_proposes_all_rewrites_at_once_first_then_each_alone_unless_all_at_once_was_kept():
    both = ["fuse", "blocks"]
    assert optimizer.plan(both, both, []) == ["fuse", "blocks"]
    assert optimizer.plan(both, both, ["fuse+blocks=wrong"]) == ["fuse"]
    assert optimizer.plan(both, both, ["fuse+blocks=reverted", "fuse=kept"]) == ["blocks"]
    assert optimizer.plan(both, both, ["fuse+blocks=wrong", "fuse=wrong", "blocks=kept"]) is None
    assert optimizer.plan(both, both, ["fuse+blocks=kept"]) is None  # a part of it would only undo some of the gain
    assert optimizer.plan(both, both, ["fuse+blocks"]) == ["fuse"]  # not verified (yet): tried all the same
    assert optimizer.plan(["blocks"], ["blocks"], []) == ["blocks"]
    # blocks applies alone, but after fuse nothing is left for it: fuse is the whole combination
    assert optimizer.plan(["fuse"], both, []) == ["fuse"]
    assert optimizer.plan(["fuse"], both, ["fuse=kept"]) is None
    assert optimizer.plan(["fuse"], both, ["fuse=reverted"]) == ["blocks"]


def test_propose_applies_the_planned_rewrites_in_order_and_names_them(rewrites):
    lower = lambda _ref: Graph(nodes=["a", "b", "c"])  # noqa: E731
    render = lambda g: " ".join(g.nodes)  # noqa: E731
    first = optimizer.propose("ref", [], lower, render)
    assert first == optimizer.Proposal(source="ab* c*", rewrite="fuse+blocks")
    assert optimizer.propose("ref", ["fuse+blocks=wrong"], lower, render) == optimizer.Proposal(source="ab c",
                                                                                                rewrite="fuse")
    assert optimizer.propose("ref", ["fuse+blocks=kept"], lower, render).startswith("every applicable")
    only_blocks = optimizer.propose("ref", [], lambda _r: Graph(nodes=["c"]), render)
    assert only_blocks == optimizer.Proposal(source="c*", rewrite="blocks")  # fuse does not apply: left out
    assert "does not lower" in optimizer.propose("ref", [], lambda _r: "no lowering for foo", render)


def test_a_rewrite_that_cannot_be_written_out_ends_the_optimizer_saying_so_instead_of_failing_the_job(rewrites):
    def render(g):  # noqa: ANN001, ANN202
        raise ValueError("12 is not in list")

    said = optimizer.propose("ref", [], lambda _r: Graph(nodes=["a", "b", "c"]), render)
    assert isinstance(said, str) and "fuse+blocks could not be written out (ValueError: 12 is not in list)" in said
    assert "the verified candidate stands" in said


def test_a_rewrite_registered_twice_is_refused(rewrites):
    with pytest.raises(ValueError, match="registered twice"):
        optimizer.rewrite("fuse", order=1, summary="again")(lambda g: g)


def test_without_a_registered_rewrite_the_offline_optimizer_says_so(monkeypatch):
    optimizer.load()
    monkeypatch.setattr(optimizer, "REWRITES", {})
    assert optimizer.offline_answer("task", None, []) == "no optimizer rewrite is registered"


def three_launch_softmax():
    n, row = 256 * 4096 * 4, 256 * 4
    launches = [LaunchCost(kernel="amax", programs=256, unique_loaded=n, unique_stored=row),
                LaunchCost(kernel="sum_exp", programs=256, unique_loaded=n + row, unique_stored=row),
                LaunchCost(kernel="div", programs=1024, unique_loaded=n + 2 * row, unique_stored=n)]
    m = model(softmax_task(), launches, "h100")
    assert not isinstance(m, str)
    return m


def test_the_feedback_names_each_launch_and_the_bytes_above_the_floor():
    m = three_launch_softmax()
    lines = feedback(m.speed, m.breakdown)
    assert lines[0] == m.speed.summary
    assert "eager: 1 aten op(s)" in lines[1] and "2.00x the floor in 3 launch(es)" in lines[1]
    assert lines[2].startswith("8.394 MB more than the floor")  # 2 x 4 MiB + 5 row sums of 1 kB
    assert lines[3].startswith("launch 1 amax:") and "reads 4.194 MB" in lines[3] and "256 program(s)" in lines[3]
    assert lines[5].startswith("launch 3 div:") and "(1.00x the floor)" in lines[5]


def test_the_llm_optimizer_prompt_carries_the_modeled_figures_and_the_coder_prompt_does_not():
    m = three_launch_softmax()
    task = KernelTask(op_name="softmax", task_desc="...", task_id="t", arch="cpu")
    opt = code_prompt(CodeRequest(task=task, role="optimizer", modeled=m.speed), [], feedback(m.speed, m.breakdown))
    assert "## The best verified candidate's speed (modeled" in opt and "- launch 2 sum_exp:" in opt
    coder = code_prompt(CodeRequest(task=task, role="coder"), [])
    assert "modeled" not in coder


def test_a_rewrite_with_nothing_left_after_the_others_is_left_out_of_the_combination(monkeypatch):
    monkeypatch.setattr(optimizer, "REWRITES", {})

    @optimizer.rewrite("merge", order=1, summary="merges a and b")
    def merge(g: Graph) -> Graph | None:
        if "a" not in g.nodes:
            return None
        g.nodes = ["ab"] + [n for n in g.nodes if n not in ("a", "b")]
        return g

    @optimizer.rewrite("tune_a", order=2, summary="tunes a")
    def tune_a(g: Graph) -> Graph | None:
        if "a" not in g.nodes:
            return None
        g.nodes = ["a!" if n == "a" else n for n in g.nodes]
        return g

    lower = lambda _ref: Graph(nodes=["a", "b"])  # noqa: E731
    render = lambda g: " ".join(g.nodes)  # noqa: E731
    assert optimizer.propose("ref", [], lower, render) == optimizer.Proposal(source="ab", rewrite="merge")
    assert optimizer.propose("ref", ["merge=kept"], lower, render).startswith("every applicable")
    assert optimizer.propose("ref", ["merge=wrong"], lower, render) == optimizer.Proposal(source="a! b", rewrite="tune_a")
