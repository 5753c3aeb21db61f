"""A job command's options from the job's declaration (client/job_options.py): flag, type, default,
bounds and help as the contract states them. The command declares a parameter `opts` where they go;
`with_options` puts the options there in its signature (what typer reads) and hands the command their
values as `opts`, keyed by the SDK's names."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, get_args

import annotated_types
import typer

from client.job_options import JobOptions, Resolved

F = TypeVar("F", bound=Callable[..., Any])

Opts = dict[str, Any]
"""What a command receives as `opts`: {SDK keyword: value}."""


def typer_option(r: Resolved) -> Any:
    bounds: dict[str, Any] = {}
    for c in r.constraints:
        if isinstance(c, annotated_types.Ge):
            bounds["min"] = c.ge
        elif isinstance(c, annotated_types.Le):
            bounds["max"] = c.le
        elif isinstance(c, annotated_types.Gt) and int in (r.annotation, *get_args(r.annotation)):
            bounds["min"] = c.gt + 1  # a float's open bound is the contract's to refuse
    return typer.Option(r.option.cli_flag, metavar=r.option.metavar, help=_sentence(r.help), **bounds)


def _sentence(text: str) -> str:
    """A description as CLI help: a sentence ("cpu-interpreter ..." and "int8/w8a16 ..." keep their case)."""
    first = text.split(" ", 1)[0]
    return (text[:1].upper() + text[1:] if first.isalpha() and first.islower() else text) + (
        "." if text and not text.endswith(".") else "")


def with_options(job: JobOptions) -> Callable[[F], F]:
    """Give a command the job's CLI options in place of its `opts` parameter."""
    declared = [r for r in job.resolved() if r.option.cli]

    def wrap(command: F) -> F:
        sig = inspect.signature(command, eval_str=True)  # the command module's names, resolved there
        params: list[inspect.Parameter] = []
        for p in sig.parameters.values():
            if p.name == "opts":
                params += [inspect.Parameter(r.option.key, inspect.Parameter.KEYWORD_ONLY, default=r.default,
                                             annotation=Annotated[r.annotation, typer_option(r)]) for r in declared]
            else:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(command)
        def run(**kw: Any) -> Any:
            opts = {r.option.key: kw.pop(r.option.key) for r in declared}
            return command(**kw, opts=opts)

        run.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run  # type: ignore[return-value]

    return wrap
