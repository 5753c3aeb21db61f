"""Asking a healthy server on a row's port what it serves, the same way for a container (docker runner)
and a sandboxed command (process runner): whose server it is, which model it lists (identity.py), then
the row's probe URL or the fixed prompt set (evidence.PROMPTS, greedy) through `POST /v1/completions` (the
legacy completions endpoint, not chat: it needs no chat template, so base and chat models answer it alike).
Every wait heartbeats, so a cancellation reaches the activity within its heartbeat timeout."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from activities.containers.evidence import MAX_TOKENS, PROMPTS, SENSIBLE_LATENCY_S, UNPROVABLE, degenerate, meets, shortfall, tier_of
from activities.containers.identity import identify, other_model, shown
from contracts.fleet import Evidence, TestPhase, Tier
from contracts.fleet_job import RunTestRequest

Heartbeat = Callable[[str], None]
HEARTBEAT_S = 2.0
COMPLETION_TIMEOUT_S = 60.0
"""A first completion may compile kernels or warm caches: generous, and the wait heartbeats."""
PROBE_BUDGET_S = len(PROMPTS) * COMPLETION_TIMEOUT_S + 30.0
"""The longest `probe_server` takes once the server is healthy (the test's own time is for becoming healthy)."""
MISMATCH = "[fleetforge] model mismatch:"
"""The log line's start when the row's own server lists other models (the taxonomy reads it: MODEL_MISMATCH)."""
T = TypeVar("T")


def http(url: str, timeout_s: float, payload: dict | None = None) -> tuple[int, str]:
    """(HTTP status or 0 when unreachable, body or error text): a GET, or a JSON POST of `payload`."""
    if not url.startswith(("http://", "https://")):
        return 0, f"probe URL {url!r} must be http(s)"
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 (scheme checked above)
            return resp.status, resp.read(65536).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, f"HTTP {e.code} from {url}: {e.read(300).decode('utf-8', 'replace').strip()}"
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        return 0, f"{'POST' if data else 'GET'} {url} failed: {getattr(e, 'reason', e)}"


async def beating(aw: Awaitable[T], heartbeat: Heartbeat, what: str) -> T:
    """Await `aw`, heartbeating every HEARTBEAT_S meanwhile (a slow probe must not look like a dead worker)."""
    task = asyncio.ensure_future(aw)
    try:
        while not (await asyncio.wait({task}, timeout=HEARTBEAT_S))[0]:
            heartbeat(what)
        return task.result()
    finally:
        task.cancel()


async def probe_get(url: str, heartbeat: Heartbeat, timeout_s: float = 10.0) -> tuple[int, str]:
    return await beating(asyncio.to_thread(http, url, timeout_s), heartbeat, f"probing {url}")


def _json(body: str) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None


def model_ids(body: str) -> list[str]:
    """The model ids of an OpenAI `/v1/models` answer."""
    data = _json(body)
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list):
        return []
    return [m["id"] for m in models if isinstance(m, dict) and isinstance(m.get("id"), str)]


def completion_text(body: str) -> str | None:
    """The first choice's text of an OpenAI completion answer (None: not a completion)."""
    data = _json(body)
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    text = choices[0].get("text")
    return text if isinstance(text, str) else ""


async def probe_server(port: int, req: RunTestRequest, args: Sequence[str], owns: Callable[[], Awaitable[bool]],
                       owner: str, heartbeat: Heartbeat) -> tuple[TestPhase, str, Evidence]:
    """(phase, what keeps it below the required tier or "", evidence) of the healthy server on `port`.

    It must list the row's model (identity.identify, with the command's `args`): a server that lists others
    is MISMATCH when `owns()` (the row's own `owner` holds the socket: its command deployed another model),
    IDENTITY otherwise (a stranger's server: we cannot tell). A server that lists no model is judged only with
    the row's probe URL and a socket provably its own. Then the probe URL must answer a GET with 2xx (its own
    test: SERVES at most), or the row's model must answer the prompt set."""
    server = f"http://127.0.0.1:{port}"
    status, body = await probe_get(f"{server}/v1/models", heartbeat)
    listed = model_ids(body) if 200 <= status < 300 else []
    asked = identify(listed, req.model_name, args)
    seen = Evidence(healthy=True, listed=shown(listed))
    owned = False
    if asked is None:
        owned = await owns()
        if listed and owned:
            loads = other_model(args, req.model_name)
            return TestPhase.MISMATCH, (
                f"{MISMATCH} the row's server lists {list(shown(listed))}, not {req.model_name!r}"
                + (f" (its command loads {loads})" if loads else "") + f": its command deployed another model "
                f"(serve {req.model_name}, or name its weights --served-model-name {req.model_name})"
            ), seen.model_copy(update={"owner": True})
        if not owned:
            what = f"lists {list(shown(listed))}" if listed else f"lists no model ({body[:120]})"
            return TestPhase.IDENTITY, (f"the server on port {port} {what}, not {req.model_name!r}, and its listening "
                                        f"socket is not provably {owner}'s"), seen
        if not req.probe_url:
            return TestPhase.PROBE, f"GET /v1/models lists no model: {body[:300]}", seen.model_copy(update={"owner": True})
    if req.probe_url:
        status, body = await probe_get(req.probe_url, heartbeat)
        evidence = seen.model_copy(update={"lists_model": asked is not None, "asked": asked or "", "owner": owned,
                                           "own_test": 200 <= status < 300,
                                           "check": f"GET {req.probe_url} -> {status or 'no answer'}"})
        if not evidence.own_test:
            return TestPhase.PROBE, f"GET {req.probe_url}: {body[:300]}", evidence
        if meets(tier_of(evidence), req.require_tier):
            return TestPhase.PROBE, "", evidence
        return TestPhase.PROBE, f"{UNPROVABLE}: {shortfall(evidence, Tier.SERVES, req.require_tier, True)[1]}", evidence
    assert asked is not None
    evidence = (await ask_prompts(server, asked, req.reference, heartbeat)).model_copy(update={"listed": seen.listed})
    tier = tier_of(evidence)
    if meets(tier, req.require_tier):
        return TestPhase.PROBE, "", evidence
    unprovable, why = shortfall(evidence, tier, req.require_tier, req.reference is not None)
    return TestPhase.PROBE, f"{UNPROVABLE}: {why}" if unprovable else f"POST /v1/completions (model {asked}): {why}", evidence


async def ask_prompts(server: str, model: str, reference: str | None, heartbeat: Heartbeat) -> Evidence:
    """Send the fixed prompt set to `model` (greedy, MAX_TOKENS each) and grade the answers; a server that
    does not answer at all (connection refused, timeout) is asked nothing further."""
    url = f"{server}/v1/completions"
    answered = errors = sensible = 0
    slowest, note, first = 0.0, "", None
    for prompt in PROMPTS:
        t0 = time.monotonic()
        status, body = await beating(asyncio.to_thread(
            http, url, COMPLETION_TIMEOUT_S, {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                              "temperature": 0}), heartbeat, f"probing {url}")
        took = time.monotonic() - t0
        slowest = max(slowest, took)
        text = completion_text(body) if 200 <= status < 300 else None
        if first is None:
            first = text
        if text is None:
            errors += 1
            note = note or f"{prompt!r}: {body[:160]}"
            if status == 0:
                break
            continue
        answered += 1
        why = degenerate(text) or (f"took {took:.1f}s > {SENSIBLE_LATENCY_S:g}s" if took > SENSIBLE_LATENCY_S else "")
        if why:
            note = note or f"{prompt!r}: {why}"
        else:
            sensible += 1
    matched = None if reference is None else (first is not None and first.strip() == reference.strip())
    if matched is False and not note:
        # the whole answer (16 tokens): a person copies it into the row's `reference` cell
        note = f"greedy answer {(first or '').strip()[:300]!r} is not the reference {reference.strip()[:60]!r}"
    return Evidence(healthy=True, lists_model=True, asked=model, requests=answered + errors, answered=answered,
                    errors=errors, sensible=sensible, slowest_s=round(slowest, 3), matched=matched, note=note)
