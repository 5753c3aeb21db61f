"""The LLM fleet command writer's pure parts: the prompt (jinja2 templates in prompts/, compiled at
import time so a replay renders the same text) and the answer parser.

The workflow asks through workflows/_llm.py `ask` on the agent ladder (workflows/agent_ladder.py):
an answer that yields no `docker run` line is a typed rejection (`Unusable`), and so is a command the
policy refuses; each refusal is one attempt of the row, fed back to the LLM with its reason. Whatever
the LLM says is only a candidate: the policy check (with the row's slot) decides whether it may run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2

from activities.containers.offline_writer import writer_policy
from activities.containers.policy import extract_command
from contracts.errors import FleetforgeError
from contracts.fleet_job import CommandWriterContext
from contracts.messages import ChatRequest, Message

AGENT = "fleet-command-writer"
LOG_TAIL_CHARS = 1500
"""How much of an earlier attempt's log goes into the prompt (the full log is in the store)."""

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
_ENV = jinja2.Environment(loader=jinja2.DictLoader({p.name: p.read_text() for p in sorted(PROMPTS_DIR.glob("*.j2"))}),
                          undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
_SYSTEM = _ENV.get_template("command_writer_system.j2")
_REQUEST = _ENV.get_template("command_writer_request.j2")
"""Compiled at import time: the workflow sandbox forbids the loader's locks, and replays see the same text."""


def chat_request(ctx: CommandWriterContext) -> ChatRequest:
    """The writer's conversation for one attempt: the rules, then the row, host and earlier failures."""
    root = writer_policy(ctx.hardware).mount_roots[0]
    previous = [p.model_copy(update={"log_tail": p.log_tail[-LOG_TAIL_CHARS:]}) for p in ctx.previous]
    return ChatRequest(
        messages=[Message.system(_SYSTEM.render(mount_root=root)),
                  Message.user(_REQUEST.render(row=ctx.row, hardware=ctx.hardware, attempt=ctx.attempt, previous=previous,
                                               slot=ctx.slot))],
        agent=AGENT, temperature=0.0, stream=False)


@dataclass(frozen=True)
class Usable:
    command: str


@dataclass(frozen=True)
class Unusable:
    reason: str


def parse_answer(text: str) -> Usable | Unusable:
    """The answer's command (one fenced ```bash block or a bare line), or why there is none."""
    try:
        return Usable(extract_command(text))
    except FleetforgeError as e:
        return Unusable(e.message)
