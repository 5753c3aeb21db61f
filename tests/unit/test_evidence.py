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


# -- which model a server serves (activities/containers/identity.py) ------------------------------------------

from activities.containers.identity import identify, loaded_models, other_model, served_aliases  # noqa: E402


@pytest.mark.parametrize("listed, args, asked", [
    (["acme/liar-1b"], [], "acme/liar-1b"),
    (["Acme/Liar-1B"], [], "Acme/Liar-1B"),
    (["someone/else"], [], None),
    (["someone/else", "acme/liar-1b"], [], "acme/liar-1b"),
    (["liar"], ["--served-model-name", "liar"], "liar"),
    (["liar"], [], None),
    (["liar"], ["--model", "someone/else", "--served-model-name", "liar"], None),
    (["acme/liar-1b"], ["--model", "someone/else", "--served-model-name", "acme/liar-1b"], None),
    (["/models/acme/liar-1b"], ["--model", "/models/acme/liar-1b"], "/models/acme/liar-1b"),
    (["/models/other/liar-1b"], [], None),
    (["acme/liar-1b-instruct"], [], None),
    ([], [], None),
])
def test_a_server_lists_the_rows_model_only_by_its_id_a_served_name_or_its_path(listed, args, asked):
    """A false Yes is the worst bug: another model listed, or a command that loads another repository and
    names it as the row's, is never the row's model."""
    assert identify(listed, "acme/liar-1b", args) == asked


@pytest.mark.parametrize("args, aliases", [
    (["--model", "acme/m", "--served-model-name", "m", "chat-m", "--port", "8000"], ("m", "chat-m")),
    (["--served-model-name=m"], ("m",)),
    (["--port", "8000"], ()),
])
def test_served_names_are_the_values_of_served_model_name(args, aliases):
    assert served_aliases(args) == aliases


def test_the_models_a_command_loads_are_repository_ids_not_paths():
    assert loaded_models(["--model-id", "acme/m", "--model", "./weights", "serve", "x/y"]) == ["acme/m", "x/y"]
    assert other_model(["serve", "ACME/m"], "acme/M") is None and other_model(["--model", "x/y"], "acme/m") == "x/y"


@pytest.mark.parametrize("evidence, line", [
    (Evidence(healthy=True, lists_model=True, listed=("acme/m",), asked="acme/m", requests=N, answered=N, sensible=N,
              slowest_s=0.21),
     "healthy; lists its model as acme/m; asked it 3 prompts: 3/3 answered, 0 errors, 3 sensible, slowest 0.2s"),
    (Evidence(healthy=True, listed=("someone/else",), owner=True),
     "healthy; lists someone/else, not its model"),
    (Evidence(healthy=True, owner=True, own_test=True, check="GET http://127.0.0.1:8000/ok -> 200"),
     "healthy; lists no model; its own process holds the port; own test passed: GET http://127.0.0.1:8000/ok -> 200"),
    (Evidence(healthy=True, own_test=True, check="exit 0 (self-test)"), "own test passed: exit 0 (self-test)"),
    (Evidence(healthy=True, lists_model=True, requests=N, answered=N, sensible=N, slowest_s=0.1),
     "healthy; lists its model; asked its model 3 prompts: 3/3 answered, 0 errors, 3 sensible, slowest 0.1s"),
    (Evidence(), "not healthy"),
])
def test_the_evidence_line_says_what_was_asked_and_answered(evidence: Evidence, line: str):
    assert evidence.line() == line


def test_a_server_that_lists_another_model_never_reaches_serves():
    other = Evidence(healthy=True, listed=("someone/else",), owner=True, requests=N, answered=N, sensible=N)
    assert tier_of(other) is Tier.BOOTS
