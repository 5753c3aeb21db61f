"""The conductor's routing and its ends: pure functions over ConductorState and ConductorConfig (no I/O).

Which agent runs next obeys workflow.yaml (possible_next_agent, single_agent and sequence repeat
limits, mandatory_llm_analysis, max_step) plus two rules of our own: an agent whose product the
verifier must check only runs when the step budget still leaves room for that verification (so the
last step is never an unverified coder), and a failed verification never routes to `finish`.
"""

from __future__ import annotations

from activities.kernels.llm_agents import parse_decision, validate_decision
from activities.llm.structured import Rejected
from contracts.kernel import (
    FINISH,
    AgentName,
    AgentRecord,
    AskLLM,
    ConductorConfig,
    ConductorState,
    Finish,
    FinishReason,
    Go,
    LLMDecision,
    SequenceLimit,
    TimeLimit,
)
from contracts.kernel_job import Attempt, Rejection

CODER_HISTORY = 2
"""How many earlier candidates (with their verdicts) the coder's prompt shows."""
ANALYSIS_HISTORY = 8
"""How many earlier trace lines the routing analysis sees (the attempt history, bounded)."""
ROUTING_LLM_ANSWERS = 2
"""Routing answers per decision (the first and one repair) before the deterministic rule decides."""


def get_next_agent(state: ConductorState, config: ConductorConfig) -> Go | Finish | AskLLM:
    """Which agent runs next. The returned step is the one that agent would run as."""
    step = state.step + 1
    last = state.last
    if last is None:
        if not _room_to_verify(config.start_agent, step, config):
            return Finish(reason=FinishReason.MAX_STEPS, step=0,
                          detail=f"max_step {config.max_step} leaves no room to verify a candidate")
        return Go(agent=config.start_agent, step=step)

    if last.agent == AgentName.VERIFIER and _optimizing(state):
        return optimizer_done(state, config)
    if last.agent == AgentName.VERIFIER and last.verifier_passed:
        if _optimizer_fits(state, config):
            return Go(agent=AgentName.OPTIMIZER, step=step)
        return Finish(reason=FinishReason.VERIFIED, step=state.step)

    if step > config.max_step:
        return Finish(reason=FinishReason.MAX_STEPS, step=state.step)

    if not last.parsed_ok:  # the ladder already repaired and fell back: nothing left to ask
        return Finish(reason=FinishReason.PARSE_FAILED, step=state.step)

    options, dropped = _options(state, config)
    if not options:
        if dropped:
            reason, detail = dropped[0]
            return Finish(reason=reason, step=state.step, detail=detail)
        return Finish(reason=FinishReason.NO_OPTIONS, step=state.step)
    if len(options) == 1 and last.agent not in config.mandatory_analysis:
        if options[0] == FINISH:
            return Finish(reason=FinishReason.ROUTED, step=state.step)
        return Go(agent=options[0], step=step)
    return AskLLM(agent=last.agent, options=options, step=step)


def decided(decision: LLMDecision, state: ConductorState, *, fallback: bool = False) -> Go | Finish:
    """A validated routing decision as the next step (`finish` chosen by the LLM ends the run)."""
    if decision.next_agent == FINISH:
        return Finish(reason=FinishReason.LLM_DECIDED if not fallback else FinishReason.ROUTED, step=state.step)
    return Go(agent=decision.next_agent, step=state.step + 1, suggestion=decision.suggestion, fallback=fallback)


def apply_llm_decision(answer: str | dict | LLMDecision | None, options: list[str], state: ConductorState) -> Go | Finish:
    """The LLM's answer if it names an option, else the deterministic `fallback_agent` (never a silent finish)."""
    checked = validate_decision(answer, options)
    if not isinstance(checked, Rejected):
        return decided(checked, state)
    parsed = parse_decision(answer)
    suggestion = parsed.suggestion if isinstance(parsed, LLMDecision) else ""
    return decided(LLMDecision(next_agent=fallback_agent(options, state), suggestion=suggestion), state, fallback=True)


def fallback_agent(options: list[str], state: ConductorState) -> str:
    """Deterministic choice: the coder after a failed verification, else the first real agent;
    `finish` only when it is the sole option."""
    last = state.last
    if last is not None and last.agent == AgentName.VERIFIER and last.verifier_passed is False:
        if AgentName.CODER in options:
            return AgentName.CODER
    agents = [o for o in options if o != FINISH]
    return agents[0] if agents else FINISH


def offline_fallback_due(*, role: str, llm_configured: bool, llm_rejected: int, threshold: int, tried: bool) -> str:
    """Why the coder should answer with the offline template this round instead of the LLM (empty: it
    should not): the verifier rejected `threshold` LLM candidates and the offline one was not tried."""
    if role != AgentName.CODER or not llm_configured or tried or llm_rejected < threshold:
        return ""
    return f"the verifier rejected {llm_rejected} LLM candidates; trying the offline template's candidate"


def offline_first(*, role: str, llm_configured: bool, rewrites_left: bool) -> str:
    """Why an optimizer round asks the offline optimizer before the LLM (empty: it should not). Its rewrites are
    deterministic, cost no token and the cost model predicts each one's gain, so with an LLM configured they still
    go first, and the LLM is asked for what they cannot do: in the round where none is left, and after it."""
    if role != AgentName.OPTIMIZER or not llm_configured or not rewrites_left:
        return ""
    return "the offline optimizer's rewrites go first (deterministic, no tokens); the LLM is asked once none is left"


def no_answer_finish(*, step: int, llm_configured: bool, rejection: Rejection | None, why: str) -> Finish:
    """How the run ends when an agent's ladder gave no answer at all."""
    if rejection is Rejection.DUPLICATE:
        return Finish(reason=FinishReason.NO_PROGRESS, step=step, detail=why)
    if rejection is Rejection.NO_TEMPLATE and not llm_configured:
        return Finish(reason=FinishReason.NO_OFFLINE_TEMPLATE, step=step, detail=why)
    return Finish(reason=FinishReason.PARSE_FAILED, step=step, detail=why)


def faster(speedup: float | None, best: float | None) -> bool:
    """Is a passing candidate with `speedup` better than the best so far (unmeasured never is)?"""
    return speedup is not None and (best is None or speedup > best)


SOL_STOP = 0.95
"""The optimizer stops once the best candidate reaches this fraction of the speed of light (Meta's KernelAgent
stops at 95 % of the roofline)."""
NO_GAIN_ROUNDS = 2
"""...or after this many optimizer rounds in a row that delivered nothing better (a wrong or slower rewrite is
reverted: the best verified candidate stands)."""
MIN_GAIN = 0.01
"""A candidate replaces the best only when it is at least 1 % faster (modeled times are deterministic, measured
ones are medians: noise never wins)."""


OPTIMIZER_TIME_MULTIPLE = 3.0
"""An optimizer round's candidate may run at most this many times as long as the verified candidate it tries to
beat did in its own verification...: the job already has its kernel, and a rewrite can run far slower under the
interpreter (the retired `blocks` rewrite gave AlexNet's first convolution 8x the programs: 42 s -> 224 s a job),
so the rounds must not multiply the job's time."""
OPTIMIZER_TIME_FLOOR_S = 60.0
"""...and never less than this (a candidate's child pays its start and torch import whatever the kernel)."""


def optimizer_time_limit(limit: TimeLimit, best_candidate_s: float | None) -> TimeLimit:
    """The time limit for verifying an optimizer round's candidate: the job's, with its ceiling lowered to
    OPTIMIZER_TIME_MULTIPLE x the best verified candidate's own run (`durations["candidate"]`), at least
    OPTIMIZER_TIME_FLOOR_S. A rewrite past it is reverted like a wrong one; the best verified candidate stands."""
    if best_candidate_s is None:
        return limit
    cap = round(max(OPTIMIZER_TIME_FLOOR_S, OPTIMIZER_TIME_MULTIPLE * best_candidate_s), 1)
    if cap >= limit.ceiling_s:
        return limit
    return limit.model_copy(update={"ceiling_s": cap, "floor_s": min(limit.floor_s, cap)})


def better(new: AgentRecord, best: AgentRecord | None) -> bool:
    """Does a passing verification's candidate beat the best so far? The first verified one always does; after
    that by measured speedup when both were measured (a GPU), else by modeled time; a candidate with neither never
    replaces one."""
    if best is None:
        return True
    if new.speedup is not None and best.speedup is not None:
        return new.speedup > best.speedup * (1 + MIN_GAIN)
    if new.modeled_ms is not None and best.modeled_ms is not None:
        return new.modeled_ms < best.modeled_ms * (1 - MIN_GAIN)
    return False


def best_record(history: list[AgentRecord]) -> AgentRecord | None:
    """The verification whose candidate is the best so far (the one the job would deliver)."""
    best = None
    for rec in history:
        if rec.agent == AgentName.VERIFIER and rec.verifier_passed and better(rec, best):
            best = rec
    return best


def rounds_without_gain(history: list[AgentRecord]) -> int:
    """How many optimizer rounds (optimizer, then the verification of its candidate) in a row, at the end of the
    history, delivered nothing better than the best before them."""
    n = 0
    i = len(history) - 1
    while i >= 1 and history[i].agent == AgentName.VERIFIER and history[i - 1].agent == AgentName.OPTIMIZER:
        before = best_record(history[:i - 1])
        if history[i].verifier_passed and better(history[i], before):
            break
        n += 1
        i -= 2
    return n


def recent_attempts(attempts: list[Attempt]) -> list[Attempt]:
    """The bounded history the coder sees: the last CODER_HISTORY candidates, oldest first."""
    return attempts[-CODER_HISTORY:]


def sequence_repeats(agents: list[str], pattern: list[str]) -> int:
    """How many times `pattern` ran back to back at the end of `agents`."""
    n, end = 0, len(agents)
    while end >= len(pattern) and agents[end - len(pattern):end] == pattern:
        n += 1
        end -= len(pattern)
    return n


def sequence_allows(agents: list[str], nxt: str, limit: SequenceLimit) -> bool:
    """Would running `nxt` start or complete a repetition of `limit.pattern` beyond `max_repeats`?
    (Blocking the repetition's first agent keeps a coder's candidate from going unverified.)"""
    pattern = limit.pattern
    for k, agent in enumerate(pattern):
        if agent != nxt:
            continue
        head = pattern[:k]
        if head and agents[len(agents) - len(head):] != head:
            continue
        before = agents[:len(agents) - len(head)] if head else agents
        if sequence_repeats(before, pattern) >= limit.max_repeats:
            return False
    return True


def _optimizing(state: ConductorState) -> bool:
    """Did the last verification check an optimizer's candidate while a verified one already exists? Then its
    verdict, pass or fail, ends an optimizer round (the coder is not asked again: the job has its kernel)."""
    h = state.history
    return len(h) >= 2 and h[-2].agent == AgentName.OPTIMIZER and best_record(h[:-2]) is not None


def _room_to_verify(agent: str, step: int, config: ConductorConfig) -> bool:
    """Can a candidate this agent leads to still be verified within max_step (agents that cannot reach
    the verifier always can run)?"""
    if agent == AgentName.VERIFIER or AgentName.VERIFIER not in config.agent_info:
        return True
    distance = config.steps_to(agent, AgentName.VERIFIER)
    return distance is None or step + distance - 1 <= config.max_step


def _options(state: ConductorState, config: ConductorConfig) -> tuple[list[str], list[tuple[FinishReason, str]]]:
    """The agents (or finish) that may run next, and why the others were dropped."""
    last = state.last
    assert last is not None
    step = state.step + 1
    agents = state.agents
    options: list[str] = []
    dropped: list[tuple[FinishReason, str]] = []
    for a in config.next_agents(last.agent):
        if a == FINISH:
            if not (last.agent == AgentName.VERIFIER and last.verifier_passed is False):
                options.append(a)
            continue
        if a == last.agent and state.consecutive_repeats >= config.repeat_limit(a):
            dropped.append((FinishReason.REPEAT_LIMIT, f"{a} ran {state.consecutive_repeats} times in a row "
                                                       f"(repeat limit {config.repeat_limit(a)})"))
            continue
        blocked = next((name for name, lim in config.sequences.items() if not sequence_allows(agents, a, lim)), None)
        if blocked is not None:
            lim = config.sequences[blocked]
            dropped.append((FinishReason.REPEAT_LIMIT, f"sequence {blocked} ({' -> '.join(lim.pattern)}) ran "
                                                       f"{lim.max_repeats} times (its max_repeats)"))
            continue
        if not _room_to_verify(a, step, config):
            dropped.append((FinishReason.MAX_STEPS, f"max_step {config.max_step} leaves no room for {a} and the "
                                                    "verification of its candidate"))
            continue
        options.append(a)
    return options, dropped


def _optimizer_fits(state: ConductorState, config: ConductorConfig) -> bool:
    """An optimizer round needs two steps (the optimizer and the verification of its candidate), a speed to
    beat (measured on a GPU, else modeled), and the stop rules not met: the best is under SOL_STOP of the speed
    of light, and fewer than NO_GAIN_ROUNDS optimizer rounds in a row delivered nothing better."""
    if AgentName.OPTIMIZER not in config.next_agents(AgentName.VERIFIER) or state.step + 2 > config.max_step:
        return False
    if any(not sequence_allows(state.agents, AgentName.OPTIMIZER, lim) for lim in config.sequences.values()):
        return False
    best = best_record(state.history)
    if best is None or (best.speedup is None and best.modeled_ms is None):
        return False
    if best.speedup is None and best.sol_fraction is not None and best.sol_fraction >= SOL_STOP:
        return False
    return rounds_without_gain(state.history) < NO_GAIN_ROUNDS


def optimizer_done(state: ConductorState, config: ConductorConfig) -> Go | Finish:
    """After a verification that ended an optimizer round, pass or fail: another round when the stop rules allow,
    else finish with the best verified candidate (a wrong or slower rewrite is never delivered)."""
    if _optimizer_fits(state, config):
        return Go(agent=AgentName.OPTIMIZER, step=state.step + 1)
    best = best_record(state.history)
    if best is not None and best.speedup is None and best.sol_fraction is not None and best.sol_fraction >= SOL_STOP:
        why = f"the best candidate is at {best.sol_fraction:.0%} of the speed of light (modeled)"
    elif rounds_without_gain(state.history) >= NO_GAIN_ROUNDS:
        why = f"{NO_GAIN_ROUNDS} optimizer rounds in a row without a faster verified candidate"
    else:
        why = "no room for another optimizer round"
    return Finish(reason=FinishReason.VERIFIED, step=state.step, detail=f"optimizer stopped: {why}")
