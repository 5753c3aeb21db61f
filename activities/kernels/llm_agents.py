"""The kernel agents' pure parts: one jinja2 template per agent (activities/kernels/prompts/*.j2)
rendered from the typed request the workflow sent, and one parser per answer format.

Formats: the designer answers a KernelDesign JSON object, the coder and the optimizer one fenced
```python block with the whole candidate, the conductor's analysis `{"decision", "suggestion"}`.
A parse failure is a value (`Rejected`), never an exception: the routing policy retries the agent.
"""

from __future__ import annotations

import re
from pathlib import Path

import jinja2

from activities.llm.structured import Parsed, Rejected, parse_structured
from contracts.kernel import LLMDecision
from contracts.kernel_job import AnalyzeRequest, CodeRequest, DesignRequest, KernelDesign

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(PROMPTS_DIR), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, autoescape=False)
_FENCED_PY = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)
_FENCED_ANY = re.compile(r"```[ \t]*\n(.*?)```", re.DOTALL)

TEMPLATES = {"designer": "designer.j2", "coder": "coder.j2", "optimizer": "optimizer.j2", "conductor": "analyze.j2"}


def design_prompt(req: DesignRequest) -> str:
    return _ENV.get_template(TEMPLATES["designer"]).render(task=req.task, suggestion=req.suggestion)


def code_prompt(req: CodeRequest, sources: list[str]) -> str:
    """`sources` are the texts of `req.attempts`' candidates, in the same order."""
    attempts = [{"step": a.step, "verdict": a.verdict, "source": s} for a, s in zip(req.attempts, sources, strict=True)]
    template = TEMPLATES["optimizer"] if req.role == "optimizer" else TEMPLATES["coder"]
    return _ENV.get_template(template).render(
        task=req.task, on_cpu=req.task.on_cpu, design=req.design, attempts=attempts, feedback=req.feedback,
        mismatches=req.mismatches, suggestion=req.suggestion)


def analyze_prompt(req: AnalyzeRequest) -> str:
    return _ENV.get_template(TEMPLATES["conductor"]).render(
        task=req.task, agent=req.agent, step=req.step, options=req.options, last_result=req.last_result,
        recent=req.recent)


def parse_code(text: str) -> str | Rejected:
    """Exactly one fenced python block (an untagged fence is accepted when it is the only one)."""
    blocks = _FENCED_PY.findall(text or "") or _FENCED_ANY.findall(text or "")
    if not blocks:
        return Rejected("the answer has no fenced ```python block with the candidate")
    if len(blocks) > 1:
        return Rejected(f"the answer has {len(blocks)} fenced python blocks; expected exactly one with the whole candidate")
    source = blocks[0].strip()
    if not source:
        return Rejected("the fenced python block is empty")
    return source + "\n"


def parse_design(text: str) -> KernelDesign | Rejected:
    outcome = parse_structured(text, KernelDesign)
    return outcome.value if isinstance(outcome, Parsed) else outcome


def parse_decision(text: str) -> LLMDecision | Rejected:
    outcome = parse_structured(text, LLMDecision)
    return outcome.value if isinstance(outcome, Parsed) else outcome
