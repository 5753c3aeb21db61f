"""Containment for everything untrusted: paths from plans and LLMs (`safe_join`), child processes that run
LLM-written code or parse users' files (`spawn_child`), and text that leaves them (`scrub`)."""

from activities.sandbox.child import (
    Child,
    Limits,
    SandboxMode,
    SandboxPolicy,
    configure,
    confinement_note,
    exit_description,
    hidden_by,
    log_lines,
    mode,
    proc_stat,
    shareable,
    spawn_child,
    unavailable,
    wait_children,
)
from activities.sandbox.paths import safe_join
from activities.sandbox.scrub import scrub

__all__ = ["Child", "Limits", "SandboxMode", "SandboxPolicy", "configure", "confinement_note", "exit_description",
           "hidden_by", "log_lines", "mode", "proc_stat", "safe_join", "scrub", "shareable", "spawn_child", "unavailable",
           "wait_children"]
