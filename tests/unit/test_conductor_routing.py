"""get_next_agent / apply_llm_decision / the ends of a run: the conductor's routing table, without a server."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from activities.kernels.config_loader import load_workflow_config
from contracts.common import ArtifactRef
from contracts.kernel import (
    AgentRecord,
    AskLLM,
    ConductorConfig,
    ConductorState,
    Decision,
    Finish,
    FinishReason,
    Go,
    LLMDecision,
    TimeLimit,
)
from activities.llm.structured import Rejected
from contracts.kernel_job import Attempt, Rejection
from workflows.conductor_policy import (
    CODER_HISTORY,
    apply_llm_decision,
    fallback_agent,
    best_record,
    better,
    faster,
    get_next_agent,
    no_answer_finish,
    offline_fallback_due,
    offline_first,
    optimizer_time_limit,
    recent_attempts,
    sequence_allows,
    sequence_repeats,
    validate_decision,
)

DEFAULT = load_workflow_config("default")
CODER_ONLY = load_workflow_config("coder_only")
FIRST_VERIFIED = load_workflow_config("first_verified")


def _state(*records: tuple) -> ConductorState:
    """Each record: (agent,) or (agent, parsed_ok) or (agent, parsed_ok, verifier_passed[, speedup]), or a
    verification with a modeled speed: (agent, parsed_ok, verifier_passed, None, (modeled_ms, sol_fraction))."""
    state = ConductorState()
    for i, rec in enumerate(records, start=1):
        agent = rec[0]
        parsed_ok = rec[1] if len(rec) > 1 else True
        passed = rec[2] if len(rec) > 2 else None
        speedup = rec[3] if len(rec) > 3 else None
        modeled_ms, sol = rec[4] if len(rec) > 4 else (None, None)
        state = state.record(AgentRecord(agent=agent, step=i, parsed_ok=parsed_ok, verifier_passed=passed, speedup=speedup,
                                         modeled_ms=modeled_ms, sol_fraction=sol))
    return state


def _with_max_step(cfg: ConductorConfig, max_step: int) -> ConductorConfig:
    data = cfg.model_dump()
    data["limitation_info"]["required"]["max_step"] = max_step
    return ConductorConfig.model_validate(data)


SEQUENCE_2 = ConductorConfig.model_validate({
    "agent_info": {"coder": {"possible_next_agent": ["verifier"]},
                   "verifier": {"possible_next_agent": ["finish", "coder"]}},
    "start_agent": "coder",
    "limitation_info": {"required": {"max_step": 30}, "optional": {"repeat_limits": {
        "sequences": {"coder_verifier": {"pattern": ["coder", "verifier"], "max_repeats": 2}}}}},
})


def _self_looping(max_repeats: int) -> ConductorConfig:
    return ConductorConfig.model_validate(
        {
            "agent_info": {
                "designer": {"possible_next_agent": ["designer", "coder"], "max_repeats": max_repeats},
                "coder": {"possible_next_agent": ["verifier"]},
                "verifier": {"possible_next_agent": ["finish", "coder"]},
            },
            "start_agent": "designer",
            "limitation_info": {"required": {"max_step": 30}},
        }
    )


CASES = [
    # (id, config, history, expected decision)
    ("empty history starts at start_agent", DEFAULT, [], Go(agent="designer", step=1)),
    ("coder_only starts at coder", CODER_ONLY, [], Go(agent="coder", step=1)),
    ("single option, not mandatory -> go", DEFAULT, [("designer",)], Go(agent="coder", step=2)),
    ("coder -> verifier", DEFAULT, [("designer",), ("coder",)], Go(agent="verifier", step=3)),
    (
        "a step without an answer ends the run (the ladder already repaired and fell back)",
        DEFAULT,
        [("designer",), ("coder", False)],
        Finish(reason=FinishReason.PARSE_FAILED, step=2),
    ),
    (
        "verifier pass -> finish",
        FIRST_VERIFIED,
        [("designer",), ("coder",), ("verifier", True, True)],
        Finish(reason=FinishReason.VERIFIED, step=3),
    ),
    (
        "verifier pass with optimizer, budget and a measured speed -> optimizer",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, True, 1.3)],
        Go(agent="optimizer", step=4),
    ),
    (
        "verifier pass with optimizer but speed not measurable (CPU) -> finish",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, True)],
        Finish(reason=FinishReason.VERIFIED, step=3),
    ),
    (
        "verifier pass with optimizer but no budget for optimize+verify -> finish",
        _with_max_step(DEFAULT, 4),
        [("designer",), ("coder",), ("verifier", True, True, 1.3)],
        Finish(reason=FinishReason.VERIFIED, step=3),
    ),
    (
        "verifier pass with budget for exactly optimize+verify -> optimizer",
        _with_max_step(DEFAULT, 5),
        [("designer",), ("coder",), ("verifier", True, True, 1.3)],
        Go(agent="optimizer", step=4),
    ),
    (
        "the optimizer's round made it faster -> another optimizer round",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, True, 1.3), ("optimizer",), ("verifier", True, True, 1.8)],
        Go(agent="optimizer", step=6),
    ),
    (
        "one optimizer round without gain -> one more round",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, True, 1.3), ("optimizer",), ("verifier", True, True, 1.3)],
        Go(agent="optimizer", step=6),
    ),
    (
        "two optimizer rounds in a row without gain -> finish with the best",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, True, 1.3), ("optimizer",), ("verifier", True, True, 1.3),
         ("optimizer",), ("verifier", True, True, 1.2)],
        Finish(reason=FinishReason.VERIFIED, step=7,
               detail="optimizer stopped: 2 optimizer rounds in a row without a faster verified candidate"),
    ),
    (
        "a modeled speed (CPU) is a speed to beat -> optimizer",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, True, None, (0.009, 0.33))],
        Go(agent="optimizer", step=4),
    ),
    (
        "at 95 % of the speed of light (modeled) -> finish",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, True, None, (0.0031, 0.96))],
        Finish(reason=FinishReason.VERIFIED, step=3),
    ),
    (
        "an optimizer round that reached 95 % of SOL -> finish, saying why",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, True, None, (0.009, 0.33)), ("optimizer",),
         ("verifier", True, True, None, (0.0031, 0.97))],
        Finish(reason=FinishReason.VERIFIED, step=5,
               detail="optimizer stopped: the best candidate is at 97% of the speed of light (modeled)"),
    ),
    (
        "the optimizer's candidate failed verification: discarded, the optimizer tries again (never the coder)",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, True, None, (0.009, 0.33)), ("optimizer",),
         ("verifier", True, False)],
        Go(agent="optimizer", step=6),
    ),
    (
        "a wrong rewrite, then a slower one -> finish with the first verified candidate",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, True, None, (0.009, 0.33)), ("optimizer",),
         ("verifier", True, False), ("optimizer",), ("verifier", True, True, None, (0.0095, 0.31))],
        Finish(reason=FinishReason.VERIFIED, step=7,
               detail="optimizer stopped: 2 optimizer rounds in a row without a faster verified candidate"),
    ),
    (
        "a faster modeled candidate resets the count -> another round",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, True, None, (0.009, 0.33)), ("optimizer",),
         ("verifier", True, False), ("optimizer",), ("verifier", True, True, None, (0.004, 0.75))],
        Go(agent="optimizer", step=8),
    ),
    (
        "optimizer -> verifier",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, True), ("optimizer",)],
        Go(agent="verifier", step=5),
    ),
    (
        "verifier fail removes finish; mandatory analysis still asks the LLM",
        FIRST_VERIFIED,
        [("designer",), ("coder",), ("verifier", True, False)],
        AskLLM(agent="verifier", options=["coder"], step=4),
    ),
    (
        "verifier fail, not mandatory, one option left -> go coder",
        CODER_ONLY,
        [("coder",), ("verifier", True, False)],
        Go(agent="coder", step=3),
    ),
    (
        "verifier fail with optimizer: both agents offered, never finish",
        DEFAULT,
        [("designer",), ("coder",), ("verifier", True, False)],
        AskLLM(agent="verifier", options=["coder", "optimizer"], step=4),
    ),
    (
        "step budget exhausted -> MAX_STEPS",
        _with_max_step(DEFAULT, 3),
        [("designer",), ("coder",), ("verifier", True, False)],
        Finish(reason=FinishReason.MAX_STEPS, step=3),
    ),
    (
        "the last step is never an unverified coder",
        _with_max_step(CODER_ONLY, 3),
        [("coder",), ("verifier", True, False)],
        Finish(reason=FinishReason.MAX_STEPS, step=2,
               detail="max_step 3 leaves no room for coder and the verification of its candidate"),
    ),
    (
        "a coder with room for its verification still runs",
        _with_max_step(CODER_ONLY, 4),
        [("coder",), ("verifier", True, False)],
        Go(agent="coder", step=3),
    ),
    (
        "a budget without room for designer, coder and verifier ends before starting",
        _with_max_step(DEFAULT, 2),
        [],
        Finish(reason=FinishReason.MAX_STEPS, step=0, detail="max_step 2 leaves no room to verify a candidate"),
    ),
    (
        "the coder -> verifier sequence limit stops the loop",
        SEQUENCE_2,
        [("coder",), ("verifier", True, False), ("coder",), ("verifier", True, False)],
        Finish(reason=FinishReason.REPEAT_LIMIT, step=4,
               detail="sequence coder_verifier (coder -> verifier) ran 2 times (its max_repeats)"),
    ),
    (
        "below the sequence limit the coder runs again",
        SEQUENCE_2,
        [("coder",), ("verifier", True, False)],
        Go(agent="coder", step=3),
    ),
    (
        "two options -> ask the LLM",
        _self_looping(3),
        [("designer",)],
        AskLLM(agent="designer", options=["designer", "coder"], step=2),
    ),
    (
        "self-loop over its repeat limit is dropped -> the one option left",
        _self_looping(2),
        [("designer",), ("designer",)],
        Go(agent="coder", step=3),
    ),
]


@pytest.mark.parametrize(("config", "history", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_get_next_agent(config, history, expected):
    assert get_next_agent(_state(*history), config) == expected


def test_verifier_pass_beats_an_exhausted_budget():
    state = _state(("designer",), ("coder",), ("verifier", True, True))
    assert get_next_agent(state, _with_max_step(DEFAULT, 3)) == Finish(reason=FinishReason.VERIFIED, step=3)


def test_self_loop_limit_names_the_repeat_limit():
    state = _state(("designer",), ("designer",))
    only_self = ConductorConfig.model_validate({
        "agent_info": {"designer": {"possible_next_agent": ["designer"], "max_repeats": 2},
                       "coder": {"possible_next_agent": ["finish"]}},
        "start_agent": "coder", "limitation_info": {"required": {"max_step": 9}}})
    assert get_next_agent(state, only_self) == Finish(reason=FinishReason.REPEAT_LIMIT, step=2,
                                                      detail="designer ran 2 times in a row (repeat limit 2)")


@pytest.mark.parametrize(("agents", "nxt", "allowed"), [
    ([], "coder", True),
    (["coder", "verifier"], "coder", True),
    (["coder", "verifier", "coder", "verifier"], "coder", False),
    (["coder", "verifier", "coder"], "verifier", True),
    (["designer", "coder", "verifier", "coder", "verifier"], "coder", False),
    (["coder", "verifier", "designer", "coder", "verifier"], "coder", True),
], ids=["empty", "one repetition", "two repetitions block the third", "the repetition's own verifier runs",
        "a prefix does not count", "only back-to-back repetitions count"])
def test_sequence_limit_blocks_the_agent_that_starts_one_repetition_too_many(agents, nxt, allowed):
    limit = SEQUENCE_2.sequences["coder_verifier"]
    assert sequence_allows(agents, nxt, limit) is allowed
    assert sequence_repeats(["a", "b", "a", "b"], ["a", "b"]) == 2


def test_consecutive_repeats_counts_the_trailing_run_only():
    assert ConductorState().consecutive_repeats == 0
    assert _state(("coder",), ("verifier",), ("coder",), ("coder",)).consecutive_repeats == 2


def test_decisions_round_trip_as_a_discriminated_union():
    adapter = TypeAdapter(Decision)
    for decision in (Go(agent="coder", step=2, suggestion="x"), Finish(reason=FinishReason.MAX_STEPS, step=9),
                     AskLLM(agent="verifier", options=["coder"], step=3)):
        assert adapter.validate_json(adapter.dump_json(decision)) == decision


FAILED_VERIFY = _state(("designer",), ("coder",), ("verifier", True, False))
AFTER_DESIGNER = _state(("designer",))

LLM_CASES = [
    # (id, llm answer, options, state, expected)
    ("plain agent name", "coder", ["designer", "coder"], AFTER_DESIGNER, Go(agent="coder", step=2)),
    (
        "json with suggestion",
        '{"next_agent": "coder", "suggestion": "mask the tail"}',
        ["coder", "optimizer"],
        FAILED_VERIFY,
        Go(agent="coder", step=4, suggestion="mask the tail"),
    ),
    (
        "fenced json",
        'Thinking...\n```json\n{"next_agent": "optimizer", "suggestion": "vectorize"}\n```',
        ["coder", "optimizer"],
        FAILED_VERIFY,
        Go(agent="optimizer", step=4, suggestion="vectorize"),
    ),
    ("model object", LLMDecision(next_agent="designer", suggestion="s"), ["designer", "coder"], AFTER_DESIGNER,
     Go(agent="designer", step=2, suggestion="s")),
    ("dict", {"next_agent": "coder"}, ["designer", "coder"], AFTER_DESIGNER, Go(agent="coder", step=2)),
    ("analyze.j2 format", '{"decision": "coder", "suggestion": "mask"}', ["designer", "coder"], AFTER_DESIGNER,
     Go(agent="coder", step=2, suggestion="mask")),
    ("the decision's case does not matter", '{"decision": "Coder"}', ["coder"], FAILED_VERIFY, Go(agent="coder", step=4)),
    ("a bare name in capitals", "CODER", ["designer", "coder"], AFTER_DESIGNER, Go(agent="coder", step=2)),
    ("valid finish is honoured", "finish", ["finish", "coder"], AFTER_DESIGNER,
     Finish(reason=FinishReason.LLM_DECIDED, step=1)),
    (
        "agent not among options -> coder after failed verify, suggestion kept",
        '{"next_agent": "finish", "suggestion": "looks fine"}',
        ["coder", "optimizer"],
        FAILED_VERIFY,
        Go(agent="coder", step=4, suggestion="looks fine", fallback=True),
    ),
    ("garbage -> coder after failed verify", "I think we are done here!", ["optimizer", "coder"], FAILED_VERIFY,
     Go(agent="coder", step=4, fallback=True)),
    ("broken json -> fallback", '{"next_agent": "cod', ["optimizer", "coder"], FAILED_VERIFY,
     Go(agent="coder", step=4, fallback=True)),
    ("None -> first real option, never finish", None, ["finish", "designer", "coder"], AFTER_DESIGNER,
     Go(agent="designer", step=2, fallback=True)),
    ("dict missing next_agent -> fallback", {"agent": "coder"}, ["designer", "coder"], AFTER_DESIGNER,
     Go(agent="designer", step=2, fallback=True)),
]


@pytest.mark.parametrize(("answer", "options", "state", "expected"), [c[1:] for c in LLM_CASES],
                         ids=[c[0] for c in LLM_CASES])
def test_apply_llm_decision(answer, options, state, expected):
    assert apply_llm_decision(answer, options, state) == expected


def test_fallback_is_finish_only_when_it_is_the_sole_option():
    assert fallback_agent(["finish"], AFTER_DESIGNER) == "finish"
    assert apply_llm_decision("nonsense", ["finish"], AFTER_DESIGNER) == Finish(reason=FinishReason.ROUTED, step=1)


def test_full_default_run_with_one_failed_verification():
    """Drive the policy like the workflow would: designer, coder, fail, coder, pass -> VERIFIED."""
    state, trace = ConductorState(), []
    verdicts = iter([False, True])
    while True:
        decision = get_next_agent(state, DEFAULT)
        if isinstance(decision, AskLLM):
            decision = apply_llm_decision("not a decision", decision.options, state)
        if isinstance(decision, Finish):
            break
        trace.append(decision.agent)
        passed = next(verdicts) if decision.agent == "verifier" else None
        state = state.record(AgentRecord(agent=decision.agent, step=decision.step, verifier_passed=passed))
    assert trace == ["designer", "coder", "verifier", "coder", "verifier"]
    assert decision == Finish(reason=FinishReason.VERIFIED, step=5)


def test_validate_decision_names_the_options_when_refusing():
    assert validate_decision('{"decision": "Coder", "suggestion": "s"}', ["coder", "finish"]) == \
        LLMDecision(next_agent="coder", suggestion="s")
    assert validate_decision("banana", ["coder"]) == Rejected("decision 'banana' not in ['coder']")
    assert isinstance(validate_decision('{"decision": "cod', ["coder"]), Rejected)


@pytest.mark.parametrize(("kw", "due"), [
    (dict(role="coder", llm_configured=True, llm_rejected=3, threshold=3, tried=False), True),
    (dict(role="coder", llm_configured=True, llm_rejected=2, threshold=3, tried=False), False),
    (dict(role="coder", llm_configured=True, llm_rejected=5, threshold=3, tried=True), False),
    (dict(role="coder", llm_configured=False, llm_rejected=5, threshold=3, tried=False), False),
    (dict(role="optimizer", llm_configured=True, llm_rejected=5, threshold=3, tried=False), False),
], ids=["threshold reached", "below the threshold", "tried once already", "offline anyway", "no offline optimizer"])
def test_the_offline_template_is_tried_once_after_n_llm_candidates_fail_verification(kw, due):
    assert bool(offline_fallback_due(**kw)) is due


@pytest.mark.parametrize(("kw", "first"), [
    (dict(role="optimizer", llm_configured=True, rewrites_left=True), True),
    (dict(role="optimizer", llm_configured=True, rewrites_left=False), False),
    (dict(role="optimizer", llm_configured=False, rewrites_left=True), False),
    (dict(role="coder", llm_configured=True, rewrites_left=True), False),
], ids=["optimizer with an LLM", "no rewrite left: the LLM", "offline anyway: no ordering", "the coder asks the LLM"])
def test_the_offline_optimizers_rewrites_go_before_the_llm_until_none_is_left(kw, first):
    assert bool(offline_first(**kw)) is first


@pytest.mark.parametrize(("llm", "rejection", "reason"), [
    (False, Rejection.NO_TEMPLATE, FinishReason.NO_OFFLINE_TEMPLATE),
    (True, Rejection.NO_TEMPLATE, FinishReason.PARSE_FAILED),
    (False, Rejection.DUPLICATE, FinishReason.NO_PROGRESS),
    (True, Rejection.DUPLICATE, FinishReason.NO_PROGRESS),
    (True, Rejection.UNUSABLE, FinishReason.PARSE_FAILED),
], ids=["offline without a template", "LLM failing, no template to fall back to", "offline repeats itself",
        "LLM and offline only repeat rejected candidates", "LLM answers unusable"])
def test_a_step_without_an_answer_ends_with_whose_failure_it_is(llm, rejection, reason):
    assert no_answer_finish(step=3, llm_configured=llm, rejection=rejection, why="w") == \
        Finish(reason=reason, step=3, detail="w")


def test_coder_sees_a_bounded_history_of_attempts():
    ref = ArtifactRef(uri="file:///x", sha256="0" * 64, size=1, media_type="text/x-python")
    attempts = [Attempt(step=i, candidate=ref, verdict=f"v{i}") for i in range(5)]
    assert [a.step for a in recent_attempts(attempts)] == list(range(5 - CODER_HISTORY, 5))


@pytest.mark.parametrize("speedup, best, expected", [
    (1.5, None, True), (1.5, 1.2, True), (1.2, 1.5, False), (1.5, 1.5, False), (None, None, False), (None, 1.2, False),
])
def test_only_a_measured_and_higher_speedup_replaces_the_best_candidate(speedup, best, expected):
    assert faster(speedup, best) is expected


def test_the_best_is_measured_speedup_first_then_modeled_time_and_a_gain_must_be_one_percent():
    def rec(step: int, speedup: float | None = None, modeled: float | None = None) -> AgentRecord:
        return AgentRecord(agent="verifier", step=step, verifier_passed=True, speedup=speedup, modeled_ms=modeled)

    assert better(rec(1), None)
    assert better(rec(2, speedup=1.5), rec(1, speedup=1.2)) and not better(rec(2, speedup=1.205), rec(1, speedup=1.2))
    assert better(rec(2, modeled=0.004), rec(1, modeled=0.009)) and not better(rec(2, modeled=0.00895), rec(1, modeled=0.009))
    assert better(rec(2, speedup=1.1, modeled=0.02), rec(1, speedup=1.0, modeled=0.01))  # measured beats modeled
    assert not better(rec(2), rec(1, modeled=0.009))  # nothing to compare: the best stays
    history = [rec(3, modeled=0.009), AgentRecord(agent="optimizer", step=4),
               AgentRecord(agent="verifier", step=5, verifier_passed=False), AgentRecord(agent="optimizer", step=6),
               rec(7, modeled=0.003)]
    assert best_record(history) == history[-1] and best_record(history[:4]) == history[0]


def test_an_optimizer_rounds_time_limit_is_a_few_times_the_verified_candidates_own_run():
    job = TimeLimit(multiple=200, floor_s=120, ceiling_s=1800)
    assert optimizer_time_limit(job, 30.0) == TimeLimit(multiple=200, floor_s=90, ceiling_s=90)
    assert optimizer_time_limit(job, 5.0) == TimeLimit(multiple=200, floor_s=60, ceiling_s=60)  # the floor
    assert optimizer_time_limit(job, 100.0) == TimeLimit(multiple=200, floor_s=120, ceiling_s=300)
    assert optimizer_time_limit(job, 900.0) == job  # 3x is past the job's own ceiling
    assert optimizer_time_limit(job, None) == job  # no run time recorded: the job's limit
    # the candidate's limit within it: 200x a 0.1 s reference is 20 s, lifted to the floor, capped by the ceiling
    assert optimizer_time_limit(job, 30.0).for_reference(0.1) == 90.0
