"""Which model a server serves, against the row's (issue 40): a server is only evidence about the row's
model when `GET /v1/models` lists that model. Owning the port proves whose server it is, never which
weights it loaded. Pure.

A listed id is the row's model when the row's command loads no other repository (`--model`, `--model-id`
or `serve` naming a repo id other than the row's: then nothing it lists is the row's model) and it is
* the row's model id itself (`acme/m`; repository ids compare without case, as the Hugging Face hub does);
* a name the row's command gives the model with `--served-model-name NAME [NAME ...]` (vLLM);
* a local path whose last components are the row's id (`/models/acme/m`: vLLM and TGI list the path they
  loaded when no served name is given).
"""

from __future__ import annotations

from collections.abc import Sequence

SERVED_NAME_FLAG = "--served-model-name"
MODEL_FLAGS = ("--model", "--model-id")
"""Options that name the weights a server loads (vLLM, TGI); `vllm serve MODEL` names them positionally."""
MAX_LISTED = 5
"""Ids kept as evidence (they ride in workflow history): enough to say what a server serves instead."""


def _values(args: Sequence[str], flag: str, many: bool = False) -> list[str]:
    """Values of `flag` in `args` (`--flag V`, `--flag=V`; with `many`, every word up to the next option)."""
    found: list[str] = []
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name != flag:
            continue
        if eq:
            found.append(inline)
            continue
        for value in args[i + 1:]:
            if value.startswith("-"):
                break
            found.append(value)
            if not many:
                break
    return found


def _is_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~"))


def loaded_models(args: Sequence[str]) -> list[str]:
    """Repository ids the command loads (`--model X`, `--model-id X`, `serve X`); local paths are not ids."""
    named = [v for flag in MODEL_FLAGS for v in _values(args, flag)]
    named += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "serve" and not args[i + 1].startswith("-")]
    return [n for n in named if n and not _is_path(n)]


def other_model(args: Sequence[str], model: str) -> str | None:
    """The first repository the command loads that is not the row's `model` (None: it loads none other)."""
    return next((m for m in loaded_models(args) if m.casefold() != model.casefold()), None)


def served_aliases(args: Sequence[str]) -> tuple[str, ...]:
    """Names the command serves its model under (`--served-model-name A [B ...]`, `--served-model-name=A`)."""
    return tuple(dict.fromkeys(_values(args, SERVED_NAME_FLAG, many=True)))


def _path_of(listed: str, model: str) -> bool:
    return _is_path(listed) and listed.rstrip("/").casefold().endswith("/" + model.casefold())


def identify(listed: Sequence[str], model: str, args: Sequence[str] = ()) -> str | None:
    """The listed id to ask the prompts of when the server lists the row's `model` (its id first, then a
    served name the command `args` give it, then its path), else None; always None when the command loads
    another repository."""
    if other_model(args, model) is not None:
        return None
    aliases = served_aliases(args)
    for match in (lambda n: n.casefold() == model.casefold(), lambda n: n in aliases, lambda n: _path_of(n, model)):
        if hit := next((n for n in listed if match(n)), None):
            return hit
    return None


def shown(listed: Sequence[str]) -> tuple[str, ...]:
    """The listed ids kept as evidence: the first MAX_LISTED, each at most 100 characters."""
    return tuple(n[:100] for n in listed[:MAX_LISTED])
