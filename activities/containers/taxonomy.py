"""Error taxonomy for model tests: (exit code, log tail, phase) -> category, remedy, one-line reason.

Table-driven: the first rule whose regex matches the log tail wins (rules are ordered from the
most specific cause to the most generic), then exit codes, then the phase. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from contracts.fleet import Classification, ErrorCategory, Remedy, TestPhase

C, R = ErrorCategory, Remedy


@dataclass(frozen=True)
class Rule:
    category: ErrorCategory
    remedy: Remedy
    pattern: re.Pattern[str]
    reason: str


def _rule(category: ErrorCategory, remedy: Remedy, reason: str, *patterns: str) -> Rule:
    return Rule(category, remedy, re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE), reason)


RERUN = "then rerun fleetforge fleet-test on this CSV (Error rows are retested)"
"""How a person retries the rows they fixed: the verdicts are in the CSV, so a new fleet tests only the rest."""
RETEST = "then clear the row's status and rerun fleetforge fleet-test on this CSV"
"""A No row is skipped by the next run: a person who changed it clears its status to test it again."""


DAEMON_LOST = "[fleetforge] the docker daemon stopped answering during this test"
"""The runner's line when the daemon went away while the row's container ran: a daemon that stops (a
restart, an upgrade) stops its containers, so how the container ended is the engine's doing."""

_UNREACHABLE = _rule(C.DOCKER_UNREACHABLE, R.NEW_COMMAND,
                     f"docker daemon unreachable: start it (or fix DOCKER_HOST) for the containers worker, {RERUN}",
                     r"Cannot connect to the Docker daemon", r"Is the docker daemon running\?",
                     r"error during connect:", r"Cannot connect to Podman", r"unable to connect to Podman socket")

ENGINE_RULES: tuple[Rule, ...] = (
    # The docker engine's (and podman's) own refusals: the model never ran, so never a No. Every pattern
    # is a real text, listed with its source in tests/unit/test_docker_error_table.py (one test each).
    _rule(C.DOCKER_UNREACHABLE, R.NEW_COMMAND,
          "the docker daemon went away while the container ran (a restart stops every container): the "
          f"container's end is the engine's, not the model's; keep the daemon up during a fleet, {RERUN}",
          re.escape(DAEMON_LOST)),
    _UNREACHABLE,
    _rule(C.DOCKER_UNREACHABLE, R.HUMAN,
          f"no permission on the docker socket: add the containers worker's user to the docker group, {RERUN}",
          r"permission denied while trying to connect to the Docker daemon socket"),
    _rule(C.GPU_UNAVAILABLE, R.HUMAN,
          f"host has no GPU for this row: set gpus/gpu_count to what it has or use a GPU host, {RERUN}",
          r"could not select device driver \S* ?with capabilities: \[\[gpu\]\]",
          r"Unknown runtime specified nvidia", r"unknown or invalid runtime name: nvidia",
          r"error gathering device information while adding custom device \S*nvidia",
          r"nvidia-container-cli: initialization error", r"NVIDIA driver (?:on your system is too old|not loaded)",
          r"Found no NVIDIA driver on your system"),
    _rule(C.HOST_LIMIT, R.HUMAN,
          f"host out of disk, memory or processes: free them on the containers worker's host, {RERUN}",
          r"no space left on device", r"can't fork: Resource temporarily unavailable",
          r"fork/exec [^\n]*: resource temporarily unavailable", r"cannot allocate memory",
          r"Range of CPUs is from [\d.]+ to [\d.]+, as there are only \d+ CPUs available"),
    _rule(C.DOCKER_ENGINE, R.HUMAN,
          f"container name in use: remove the leftover (docker rm -f NAME), {RERUN}",
          r"Conflict\. The container name \S+ is already in use", r"the container name \S+ is already in use"),
    _rule(C.DOCKER_ENGINE, R.NEW_COMMAND,
          "the image cannot run the command's program (OCI runtime)",
          r"OCI runtime (?:create|exec) failed[^\n]*(?:executable file not found|no such file or directory|"
          r"permission denied)", r"OCI runtime attempted to invoke a command that was not found",
          r"executable file not found in \$PATH"),
    _rule(C.NO_COMMAND, R.HUMAN, f"the image runs nothing by default: give the row a `command` that starts its "
          f"server, {RERUN}",
          r"Error response from daemon: No command specified"),
    _rule(C.TIER_UNPROVABLE, R.HUMAN, f"the required tier cannot be shown for this row: give it a reference answer "
          f"or lower --require-tier, {RERUN}", r"\[fleetforge\] tier unprovable"),
    _rule(C.DOCKER_ENGINE, R.NEW_COMMAND, "the docker engine refused the command's options",
          r"invalid argument \"[^\"]*\" for \"--?[\w-]+\" flag", r"Minimum memory limit allowed is",
          r"unknown flag: --[\w-]+"),
)
"""Checked before the model's own failures: a daemon text in a log is the engine's answer, not the model's."""

ENGINE_FALLBACK = _rule(C.DOCKER_ENGINE, R.NEW_COMMAND, "the docker engine refused the container",
                        r"OCI runtime (?:create|exec|start) failed", r"failed to create shim task",
                        r"docker: Error response from daemon:", r"the docker engine refused to start the container")
"""Any other refusal of `docker run` (the runner's own line says the engine, not the container, failed):
after the specific rules (a port already allocated is PORT_IN_USE)."""

RULES: tuple[Rule, ...] = (
    _rule(C.IMAGE_NOT_FOUND, R.NEW_COMMAND, "image not found",
          r"Unable to find image", r"pull access denied", r"manifest (?:for \S+ )?unknown",
          r"repository does not exist", r"No such image"),
    _rule(C.TRANSIENT, R.TEMPORAL_RETRY, "infrastructure hiccup", r"toomanyrequests", r"TLS handshake timeout",
          r"Connection reset by peer"),
    _rule(C.AUTH, R.HUMAN, f"gated model: set HF_TOKEN (with access) for the containers worker, restart it, {RERUN}",
          r"Cannot access gated repo", r"GatedRepoError", r"\b40[13] Client Error",
          r"Access to model \S+ is restricted", r"You are trying to access a gated repo",
          r"Invalid (?:user )?token", r"RepositoryNotFoundError"),
    _rule(C.TRUST_REMOTE_CODE, R.NEW_COMMAND, "model needs --trust-remote-code",
          r"requires you to execute the (?:configuration|modeling) file",
          r"contains custom code which must be executed",
          r"(?:set the option|pass the argument) `?trust_remote_code=True"),
    _rule(C.UNSUPPORTED_ARCH, R.HUMAN, f"architecture not supported: set the row's runtime/image to one that does, {RETEST}",
          r"Model architectures? \[[^\]]*\] (?:are|is) not supported",
          r"architectures? \[[^\]]*\] (?:are|is) not supported",
          r"Unsupported model type", r"does not recognize this architecture",
          r"model type `?\w+`? but Transformers does not recognize", r"Unsupported architecture"),
    _rule(C.CUDA_OOM, R.NEW_COMMAND, "GPU memory too small for this configuration",
          r"CUDA out of memory", r"OutOfMemoryError", r"CUDA error: out of memory",
          r"larger than the maximum number of tokens that can be stored in KV cache",
          r"No available memory for the cache blocks", r"Not enough memory to handle",
          r"insufficient memory for the KV cache", r"KV cache is needed, which is larger than the available KV cache"),
    _rule(C.PORT_IN_USE, R.HUMAN, f"port in use: another process holds this row's port; stop it or change port_range, {RERUN}",
          r"address already in use", r"port is already allocated", r"Address in use"),
    _rule(C.NOT_HEALTHY, R.NEW_COMMAND, "the command exited before it served on its port: a server keeps running "
          "while it is probed; a command that tests itself and exits needs --process-mode self-test",
          r"\[fleetforge\] the command exited \(code 0\) before a server answered"),
)

_MAX_SEQ = re.compile(r"max seq len \((\d+)\)")
_KV_TOKENS = re.compile(r"stored in KV cache \((\d+)\)")
_PORT = re.compile(r"(?:bind|listen)[^\n]*?[:( ](\d{2,5})\)?[^\n]*?address already in use|"
                   r"address already in use[^\n]*?:(\d{2,5})|0\.0\.0\.0:(\d{2,5})|127\.0\.0\.1:(\d{2,5})",
                   re.IGNORECASE)

_EXIT_REASONS = {
    125: "container exited with code 125",
    137: "container was killed (exit 137: SIGKILL, often the host OOM killer)",
    139: "container crashed (exit 139: segmentation fault)",
}


def daemon_unreachable(text: str) -> bool:
    """The docker CLI's answer says the daemon is not there (stopped, restarting, wrong socket)."""
    return bool(_UNREACHABLE.pattern.search(text))


def _last_marker(log: str, start: str) -> str:
    """The runner's own last line that starts with `start`, without it (the command's output comes before)."""
    line = next((ln for ln in reversed(log.splitlines()) if ln.startswith(start)), "")
    return line.removeprefix(start).strip()[:400]


def _first_line(text: str, pattern: re.Pattern[str]) -> str:
    for line in text.splitlines():
        if pattern.search(line):
            return line.strip()[:160]
    return ""


def _facts(category: ErrorCategory, log: str) -> dict[str, str]:
    facts: dict[str, str] = {}
    if category is C.CUDA_OOM:
        if m := _MAX_SEQ.search(log):
            facts["max_seq_len"] = m.group(1)
        if m := _KV_TOKENS.search(log):
            facts["kv_tokens"] = m.group(1)
    elif category is C.PORT_IN_USE:
        for line in log.splitlines():
            if re.search(r"already in use|already allocated", line, re.IGNORECASE):
                if m := _PORT.search(line):
                    facts["port"] = next(g for g in m.groups() if g)
                    break
    return facts


def classify(exit_code: int | None, log_tail: str, phase: TestPhase | str) -> Classification:
    """Why a model test failed, what to do about it, and a one-line reason for a person."""
    phase = TestPhase(phase)
    log = log_tail or ""
    if phase is TestPhase.POLICY:
        line = log.strip().splitlines()[0][:160] if log.strip() else "command rejected by policy"
        return Classification(category=C.POLICY_REJECTED, remedy=R.NEW_COMMAND, reason=line)
    if phase is TestPhase.HIDDEN:  # our sandbox, never the model: what to share is in the runner's line
        line = _last_marker(log, "[fleetforge] hidden by the sandbox:")
        return Classification(category=C.SANDBOX_HIDDEN, remedy=R.HUMAN, reason=f"{line}, {RERUN}")
    if phase is TestPhase.MISMATCH:
        line = _last_marker(log, "[fleetforge] model mismatch:")
        return Classification(category=C.MODEL_MISMATCH, remedy=R.NEW_COMMAND, reason=f"{line}; {RETEST}")
    if phase is TestPhase.IDENTITY:
        line = next((ln for ln in reversed(log.splitlines()) if "probe:" in ln), "").split("probe:", 1)[-1].strip()
        return Classification(category=C.FOREIGN_SERVER, remedy=R.HUMAN, reason=(
            "the server on this row's port is not provably the row's own: stop whatever else serves there (or run "
            f"the containers worker as root so it can see who owns the port), {RERUN} (probe: {line[:160]})"))
    for rule in (*RULES[:1], *ENGINE_RULES, *RULES[1:], ENGINE_FALLBACK):  # a missing image first: its own remedy
        if rule.pattern.search(log):
            line = _first_line(log, rule.pattern)
            if rule.remedy is R.HUMAN or rule in ENGINE_RULES:  # what to do first (CSV notes are cut at 200 characters), then the evidence
                hit = rule.pattern.search(line)  # None when the match lies past the line's first 160 characters
                evidence = line[hit.start():] if hit else line
                reason = f"{rule.reason} (log: {evidence[:210 - len(rule.reason)]})" if line else rule.reason
            else:
                reason = f"{rule.reason}: {line}" if line else rule.reason
            return Classification(category=rule.category, remedy=rule.remedy, reason=reason,
                                  facts=_facts(rule.category, log))
    if exit_code in _EXIT_REASONS:
        return Classification(category=C.CRASHED, remedy=R.NEW_COMMAND, reason=_EXIT_REASONS[exit_code],
                              facts={"exit_code": str(exit_code)})
    last = next((ln.strip()[:160] for ln in reversed(log.splitlines()) if ln.strip()), "")
    if exit_code not in (None, 0):
        reason = f"container exited with code {exit_code}" + (f": {last}" if last else "")
        return Classification(category=C.CRASHED, remedy=R.NEW_COMMAND, reason=reason,
                              facts={"exit_code": str(exit_code)})
    if phase is TestPhase.TIMEOUT:
        return Classification(category=C.TIMEOUT, remedy=R.NEW_COMMAND,
                              reason="the test did not finish within --test-timeout" + (f"; last log: {last}" if last else ""))
    if phase is TestPhase.HEALTH:
        return Classification(category=C.NOT_HEALTHY, remedy=R.NEW_COMMAND,
                              reason="server did not become healthy in time" + (f"; last log: {last}" if last else ""))
    if phase is TestPhase.PROBE:
        return Classification(category=C.PROBE_FAILED, remedy=R.NEW_COMMAND,
                              reason="inference probe failed" + (f": {last}" if last else ""))
    return Classification(category=C.UNKNOWN, remedy=R.NEW_COMMAND,
                          reason="unknown failure" + (f": {last}" if last else ""))
