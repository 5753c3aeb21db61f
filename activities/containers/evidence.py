"""Verdict tiers from positive evidence (issue 25): the fixed prompt set a served model is asked, what
counts as a degenerate answer, and the tier a test's evidence reaches. Pure.

vLLM's model tests grade the same way (strict match with a reference's greedy output, then sensible
output, then "it runs"); OME's benchmark reported success while every request got 404: here a tier is
only reached on what the server did answer, never on the absence of an error."""

from __future__ import annotations

import unicodedata

from contracts.fleet import Evidence, Tier

PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Water is made of hydrogen and",
    "One, two, three, four,",
)
"""Sent with temperature 0 (greedy): the first one's answer is what a row's `reference` is compared with."""
MAX_TOKENS = 16
SENSIBLE_LATENCY_S = 30.0
"""Slowest answer a SENSIBLE model may give to one short prompt (a CPU server needs seconds, not minutes)."""


def degenerate(text: str) -> str:
    """Why an answer is not sensible text ("" when it is): empty, no letter or digit, mostly replacement
    or control characters, one character repeated, or the same word over and over."""
    stripped = text.strip()
    if not stripped:
        return "empty answer"
    if not any(ch.isalnum() for ch in stripped):
        return f"no letter or digit in {stripped[:20]!r}"
    odd = sum(1 for ch in stripped if ch == "\ufffd" or unicodedata.category(ch) in ("Cc", "Cs", "Co"))
    if odd * 10 > len(stripped):
        return "mostly replacement or control characters"
    if len(stripped) >= 4 and len(set(stripped.replace(" ", ""))) == 1:
        return f"one character repeated ({stripped[:12]!r})"
    words = stripped.split()
    if len(words) >= 4 and len(set(words)) * 4 <= len(words):
        return f"the same words repeated ({' '.join(words[:4])!r} ...)"
    return ""


def tier_of(ev: Evidence) -> Tier:
    """The highest tier the evidence reaches; each needs the one below."""
    if not ev.healthy:
        return Tier.NONE
    serves = ev.own_test or (ev.lists_model and ev.requests > 0 and ev.answered == ev.requests and not ev.errors)
    if not serves:
        return Tier.BOOTS
    if ev.own_test or ev.sensible < len(PROMPTS):
        return Tier.SERVES
    return Tier.MATCHES if ev.matched else Tier.SENSIBLE


def meets(tier: Tier, required: Tier) -> bool:
    """`tier` is at least `required`; nothing that never became healthy passes (a required NONE counts as BOOTS)."""
    return tier is not Tier.NONE and tier.rank >= required.rank


UNPROVABLE = "[fleetforge] tier unprovable"
"""The log line's start when the required tier cannot be proven for the row (the taxonomy reads it: Error)."""


def shortfall(ev: Evidence, tier: Tier, required: Tier, has_reference: bool) -> tuple[bool, str]:
    """(unprovable, why) for a test below `required`: unprovable when the test could never show it (no
    reference for MATCHES, a pass/fail test for SENSIBLE or more), else what the model's answers lacked."""
    if required is Tier.MATCHES and not has_reference:
        return True, "MATCHES needs a reference answer for the row (a `reference` column)"
    if ev.own_test and required.rank > Tier.SERVES.rank:
        return True, (f"{required.value} needs the docker runner's prompt set; this row's own test (process/script "
                      "runner or probe URL) says pass or fail only")
    return False, f"reached {tier.value}, --require-tier is {required.value}" + (f": {ev.note}" if ev.note else "")
