"""Tiers from positive evidence (activities/containers/evidence.py): what counts as degenerate text and
which tier a test's evidence reaches; pure."""

from __future__ import annotations

import pytest

from activities.containers.evidence import PROMPTS, degenerate, meets, shortfall, tier_of
from contracts.fleet import Evidence, Tier

N = len(PROMPTS)


@pytest.mark.parametrize("text, why", [
    ("", "empty"), ("   \n", "empty"), ("!!!!!!!!", "no letter or digit"), ("aaaaaaaa", "one character repeated"),
    ("the the the the the the the the", "the same words repeated"), ("\ufffd\ufffd\ufffdab", "replacement"),
])
def test_degenerate_answers_say_why(text: str, why: str):
    assert why in degenerate(text)


@pytest.mark.parametrize("text", [" Paris.", " oxygen: two atoms of hydrogen, one of oxygen.", "42", " five, six"])
def test_ordinary_short_answers_are_sensible(text: str):
    assert degenerate(text) == ""


@pytest.mark.parametrize("evidence, tier", [
    (Evidence(), Tier.NONE),
    (Evidence(healthy=True), Tier.BOOTS),
    (Evidence(healthy=True, lists_model=True, requests=N, answered=0, errors=N), Tier.BOOTS),
    (Evidence(healthy=True, lists_model=True, requests=N, answered=N - 1, errors=1, sensible=N - 1), Tier.BOOTS),
    (Evidence(healthy=True, lists_model=False, requests=N, answered=N, sensible=N), Tier.BOOTS),
    (Evidence(healthy=True, lists_model=True, requests=N, answered=N, sensible=N - 1), Tier.SERVES),
    (Evidence(healthy=True, lists_model=True, requests=N, answered=N, sensible=N), Tier.SENSIBLE),
    (Evidence(healthy=True, lists_model=True, requests=N, answered=N, sensible=N, matched=False), Tier.SENSIBLE),
    (Evidence(healthy=True, lists_model=True, requests=N, answered=N, sensible=N, matched=True), Tier.MATCHES),
    (Evidence(healthy=True, lists_model=True, requests=N, answered=N, sensible=N - 1, matched=True), Tier.SERVES),
    (Evidence(healthy=True, own_test=True), Tier.SERVES),
])
def test_each_tier_needs_the_one_below_and_positive_evidence(evidence: Evidence, tier: Tier):
    assert tier_of(evidence) is tier


def test_a_tier_the_test_cannot_show_is_unprovable_not_the_models_shortfall():
    own = Evidence(healthy=True, own_test=True)
    assert shortfall(own, Tier.SERVES, Tier.SENSIBLE, True)[0]
    full = Evidence(healthy=True, lists_model=True, requests=N, answered=N, sensible=N)
    assert shortfall(full, Tier.SENSIBLE, Tier.MATCHES, False)[0]
    assert not shortfall(full, Tier.SENSIBLE, Tier.MATCHES, True)[0]
    assert meets(Tier.MATCHES, Tier.SERVES) and not meets(Tier.BOOTS, Tier.SERVES)
