"""The conductor's routing: pure functions over ConductorState and ConductorConfig (no I/O)."""

from __future__ import annotations

import json
import re

from pydantic import ValidationError

from contracts.kernel import (
    FINISH,
    AgentName,
    AskLLM,
    ConductorConfig,
    ConductorState,
    Finish,
    FinishReason,
    Go,
    LLMDecision,
)
from contracts.kernel_job import Attempt, Provider

OFFLINE_TEMPLATE_AGENTS = frozenset({AgentName.DESIGNER, AgentName.CODER})
"""Agents the offline provider can answer for (deterministic templates)."""

CODER_HISTORY = 2
"""How many earlier candidates (with their verdicts) the coder's prompt shows."""

_FENCED_JSON = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)


def get_next_agent(state: ConductorState, config: ConductorConfig) -> Go | Finish | AskLLM:
    """Which agent runs next. The returned step is the one that agent would run as."""
    step = state.step + 1
    last = state.last
    if last is None:
        return Go(agent=config.start_agent, step=step)

    if last.agent == AgentName.VERIFIER and last.verifier_passed:
        if _optimizer_fits(state, config):
            return Go(agent=AgentName.OPTIMIZER, step=step)
        return Finish(reason=FinishReason.VERIFIED, step=state.step)

    if step > config.max_step:
        return Finish(reason=FinishReason.MAX_STEPS, step=state.step)

    if not last.parsed_ok:
        if state.consecutive_repeats < config.repeat_limit(last.agent):
            return Go(agent=last.agent, step=step, suggestion=last.suggestion)
        return Finish(reason=FinishReason.PARSE_FAILED, step=state.step)

    options = _options(state, config)
    if not options:
        return Finish(reason=FinishReason.NO_OPTIONS, step=state.step)
    if len(options) == 1 and last.agent not in config.mandatory_analysis:
        if options[0] == FINISH:
            return Finish(reason=FinishReason.ROUTED, step=state.step)
        return Go(agent=options[0], step=step)
    return AskLLM(agent=last.agent, options=options, step=step)


def apply_llm_decision(
    decision: str | dict | LLMDecision | None, options: list[str], state: ConductorState
) -> Go | Finish:
    """Turn the LLM's answer into a decision. An unusable answer (unparseable, or an agent not in
    `options`) falls back to `fallback_agent`, never to a silent finish."""
    step = state.step + 1
    parsed = _parse_decision(decision)
    if parsed is not None and parsed.next_agent in options:
        if parsed.next_agent == FINISH:
            return Finish(reason=FinishReason.LLM_DECIDED, step=state.step)
        return Go(agent=parsed.next_agent, step=step, suggestion=parsed.suggestion)
    agent = fallback_agent(options, state)
    if agent == FINISH:
        return Finish(reason=FinishReason.ROUTED, step=state.step)
    return Go(agent=agent, step=step, suggestion=parsed.suggestion if parsed else "", fallback=True)


def fallback_agent(options: list[str], state: ConductorState) -> str:
    """Deterministic choice: the coder after a failed verification, else the first real agent;
    `finish` only when it is the sole option."""
    last = state.last
    if last is not None and last.agent == AgentName.VERIFIER and last.verifier_passed is False:
        if AgentName.CODER in options:
            return AgentName.CODER
    agents = [o for o in options if o != FINISH]
    return agents[0] if agents else FINISH


def provider_for(agent: str, state: ConductorState, config: ConductorConfig, requested: Provider) -> Provider:
    """The requested provider, except on an agent's last allowed retry after unusable LLM answers:
    then the offline templates answer (offline is the fallback, so a run does not end on parsing)."""
    if requested == "offline" or agent not in OFFLINE_TEMPLATE_AGENTS:
        return requested
    last = state.last
    if (last is not None and last.agent == agent and not last.parsed_ok
            and state.consecutive_repeats + 1 >= config.repeat_limit(agent)):
        return "offline"
    return requested


def faster(speedup: float | None, best: float | None) -> bool:
    """Is a passing candidate with `speedup` better than the best so far (unmeasured never is)?"""
    return speedup is not None and (best is None or speedup > best)


def recent_attempts(attempts: list[Attempt]) -> list[Attempt]:
    """The bounded history the coder sees: the last CODER_HISTORY candidates, oldest first."""
    return attempts[-CODER_HISTORY:]


def _options(state: ConductorState, config: ConductorConfig) -> list[str]:
    last = state.last
    assert last is not None
    options = [
        a
        for a in config.next_agents(last.agent)
        if a == FINISH or a != last.agent or state.consecutive_repeats < config.repeat_limit(a)
    ]
    if last.agent == AgentName.VERIFIER and last.verifier_passed is False:
        options = [a for a in options if a != FINISH]
    return options


def _optimizer_fits(state: ConductorState, config: ConductorConfig) -> bool:
    """An optimizer round needs two steps (the optimizer and the verification of its candidate) and
    a measured speed to beat: on the CPU interpreter there is none, so a verified kernel finishes.
    After an optimizer round, another one only if that round made the kernel faster."""
    if AgentName.OPTIMIZER not in config.next_agents(AgentName.VERIFIER) or state.step + 2 > config.max_step:
        return False
    speeds = [r.speedup for r in state.history if r.agent == AgentName.VERIFIER and r.verifier_passed]
    if speeds[-1] is None:
        return False
    earlier = [s for s in speeds[:-1] if s is not None]
    return not earlier or speeds[-1] > max(earlier)


def _parse_decision(decision: str | dict | LLMDecision | None) -> LLMDecision | None:
    if isinstance(decision, LLMDecision):
        return decision
    if isinstance(decision, dict):
        try:
            return LLMDecision.model_validate(decision)
        except ValidationError:
            return None
    if not isinstance(decision, str) or not decision.strip():
        return None
    text = decision.strip()
    fenced = _FENCED_JSON.search(text)
    candidate = fenced.group(1) if fenced else text
    if candidate.startswith("{"):
        try:
            return _parse_decision(json.loads(candidate))
        except json.JSONDecodeError:
            return None
    return LLMDecision(next_agent=text.lower()) if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) else None
