"""Every command the README and docs/*.md show still parses, so the docs cannot drift from the code.

What counts as a documented command:
* in a fenced block tagged ```bash, ```sh, ```shell or ```console: every command that runs `fleetforge`,
  `python -m MODULE` (or `python3`, `.venv/bin/python`) or `make`, after any `VAR=value` prefix, in any
  segment of the line (`a && b`, `a | b`, `$(a)`, a trailing `&`); `#` starts a comment; a trailing `\\`
  continues the line;
* in running text: an inline `fleetforge ...` span (only its command path and option names are checked,
  since prose may name a command without its arguments).

How each is checked, without running anything:
* `fleetforge ...` is parsed by the real CLI (the click command typer builds from `client.cli.app`, every
  command's body replaced by a no-op): unknown commands or options, missing arguments, bad values and a
  job id that names no job fail here, with the file and line;
* `python -m MODULE ...`: the module must exist; one of ours is run up to its `ArgumentParser.parse_args`
  (which parses the documented arguments, then stops);
* `make TARGET ... VAR=value`: each target is a rule of the Makefile.

To show something that is not a command to run (output, a transcript, a sketch with placeholders), tag its
block ```text (or any other non-shell tag). Placeholders that parse (`convert/RUN_ID`, `model.onnx`) may stay
in shell blocks; `[--option]` or `a|b` alternatives do not parse: write one real command per line instead.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.main import get_command

from contracts.errors import FleetforgeError

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_TAGS = {"bash", "sh", "shell", "console"}
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "$(", "`"}
PYTHONS = {"python", "python3", ".venv/bin/python", "$(BIN)/python"}
COMPLETION = {"--install-completion", "--show-completion"}
"""typer's own root options: their callbacks install or print a completion script, so they are only looked up."""


@dataclass(frozen=True)
class Command:
    where: str
    argv: tuple[str, ...]
    inline: bool = False

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.argv)}"


def _logical_lines(block: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Join `\\`-continued lines; drop a `$ ` prompt."""
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in block:
        text = line.rstrip()
        if pending is None and text.startswith("$ "):
            text = text[2:]
        if pending is not None:
            number, text = pending[0], pending[1] + " " + text.lstrip()
        if text.endswith("\\"):
            pending = (number, text[:-1])
            continue
        pending = None
        joined.append((number, text))
    return joined


def _segments(line: str) -> list[list[str]]:
    """The simple commands of one shell line: split at separators and substitutions, comments and
    redirections dropped."""
    line = re.sub(r"\s\d?(>>?|<)&?\s*\S+", " ", line)
    lexer = shlex.shlex(line.replace("$(", " $( "), posix=True, punctuation_chars=";&|()`")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segments: list[list[str]] = [[]]
    for token in lexer:
        if token in SEPARATORS or set(token) <= set(";&|()`$"):
            segments.append([])
        else:
            segments[-1].append(token)
    return [s for s in segments if s]


def _ours(words: list[str]) -> list[str] | None:
    """The argv when the segment runs fleetforge, python -m or make (after VAR=value prefixes), else None."""
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]
    if not words:
        return None
    if Path(words[0]).name == "fleetforge" or words[0] == "make":
        return words
    if words[0] in PYTHONS and len(words) > 2 and words[1] == "-m":
        return words
    return None


def documented_commands() -> list[Command]:
    found: list[Command] = []
    for doc in DOCS:
        name = doc.relative_to(ROOT).as_posix()
        lines = doc.read_text().splitlines()
        fence: str | None = None
        block: list[tuple[int, str]] = []
        for number, line in enumerate(lines, 1):
            opened = re.match(r"\s*```(\w*)", line)
            if fence is None and opened:
                fence, block = opened.group(1).lower(), []
                continue
            if fence is not None and line.strip().startswith("```"):
                if fence in SHELL_TAGS:
                    for at, text in _logical_lines(block):
                        for words in _segments(text):
                            if (argv := _ours(words)) is not None:
                                found.append(Command(f"{name}:{at}", tuple(argv)))
                fence = None
                continue
            if fence is not None:
                block.append((number, line))
                continue
            for span in re.findall(r"`(fleetforge [^`]+)`", line):
                words = [w for w in shlex.split(span) if "..." not in w and "…" not in w]
                found.append(Command(f"{name}:{number}", tuple(words), inline=True))
    return found


COMMANDS = documented_commands()


def _parser_only() -> Any:
    """The real CLI as typer builds it (its own click), every command's body a no-op: parsing and its
    validation only."""
    from client.cli import app

    root = get_command(app)
    assert root.commands, "the CLI registers its commands"

    def strip(cmd: Any) -> None:
        cmd.callback = None
        for sub in getattr(cmd, "commands", {}).values():
            strip(sub)

    strip(root)
    return root


CLI = _parser_only()


def _command_path(argv: list[str]) -> tuple[Any, list[str]]:
    """The (sub)command an argv names and the arguments left for it."""
    cmd, rest = CLI, list(argv)
    while getattr(cmd, "commands", None) and rest and not rest[0].startswith("-"):
        sub = cmd.commands.get(rest[0])
        assert sub is not None, f"no command {rest[0]!r} (commands: {', '.join(sorted(cmd.commands))})"
        cmd, rest = sub, rest[1:]
    return cmd, rest


def _option_names(cmd: Any) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}


def check_fleetforge(c: Command) -> None:
    args = list(c.argv[1:])
    cmd, rest = _command_path(args)
    unknown = [a.split("=")[0] for a in rest if a.startswith("--") and a.split("=")[0] not in _option_names(cmd)]
    assert not unknown, f"{c}: {cmd.name} has no option {', '.join(unknown)}"
    if c.inline:
        return
    args = [a for a in args if a not in COMPLETION]
    if not args:
        return
    try:
        CLI.main(args=args, prog_name="fleetforge", standalone_mode=False)
    except typer.Exit as e:  # --version, --help
        assert e.exit_code == 0, f"{c}: exit {e.exit_code}"
    except typer.TyperException as e:
        pytest.fail(f"{c}: does not parse: {e.format_message()}")
    except FleetforgeError as e:  # an argument's own check (a job id that names no job)
        pytest.fail(f"{c}: refused: {e.message}")


def _module_file(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"no module {module}"
    origin = Path(spec.origin) if spec.origin else None
    ours = origin is not None and ROOT in origin.parents and "site-packages" not in origin.parts
    return origin if ours else None


class _Parsed(Exception):
    pass


def check_python_module(c: Command) -> None:
    module, args = c.argv[2], list(c.argv[3:])
    source = _module_file(module)
    if source is None or not args:
        return  # a third-party module (it exists), or ours without arguments to parse
    tree = ast.parse(source.read_text())
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert "parse_args" in calls, f"{c}: {module} takes no arguments (no argparse parser)"
    # Run main() in a child up to its parse_args: it parses the documented arguments, then stops.
    probe = (
        "import argparse, importlib, sys\n"
        "def stop(self, args=None, namespace=None):\n"
        "    original(self, args, namespace)\n"
        "    raise SystemExit(0)\n"
        "original = argparse.ArgumentParser.parse_args\n"
        "argparse.ArgumentParser.parse_args = stop\n"
        f"sys.argv = {[module, *args]!r}\n"
        f"importlib.import_module({module!r}).main()\n"
        "raise SystemExit('main() returned without parsing its arguments')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{c}: does not parse: {done.stderr.strip().splitlines()[-1:]}"


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {t for line in text.splitlines() if (m := re.match(r"([A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)*)\s*:(?!=)", line))
            for t in m.group(1).split()}


def check_make(c: Command) -> None:
    targets = [a for a in c.argv[1:] if not a.startswith("-") and "=" not in a]
    missing = sorted(set(targets) - make_targets())
    assert not missing, f"{c}: the Makefile has no target {', '.join(missing)}"


def check(c: Command) -> None:
    if Path(c.argv[0]).name == "fleetforge":
        check_fleetforge(c)
    elif c.argv[0] == "make":
        check_make(c)
    else:
        check_python_module(c)


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_documented_command_parses(command: Command) -> None:
    check(command)


def test_the_docs_show_each_job_command() -> None:
    """The extraction itself works: the job commands and the two make targets are found where users read."""
    shown = {(Path(c.argv[0]).name, c.argv[1]) for c in COMMANDS if not c.inline}
    for job in ("inspect", "convert", "kernel", "fleet-test", "dev"):
        assert ("fleetforge", job) in shown, job
    assert {("make", "demo"), ("make", "test")} <= shown


@pytest.mark.parametrize("line, expected", [
    ("fleetforge list --rows   # what waits", [["fleetforge", "list", "--rows"]]),
    ("FOO=1 fleetforge dev & fleetforge list", [["fleetforge", "dev"], ["fleetforge", "list"]]),
    ("T=$(openssl rand -hex 16) fleetforge mcp", [["fleetforge", "mcp"]]),
    ("cd x && .venv/bin/python -m bench.bench_load --cpus 2", [[".venv/bin/python", "-m", "bench.bench_load", "--cpus", "2"]]),
    ("temporal workflow list", []),
    ("fleetforge list --json > jobs.json 2>&1", [["fleetforge", "list", "--json"]]),
])
def test_commands_are_found_in_any_segment_of_a_shell_line(line: str, expected: list[list[str]]) -> None:
    assert [w for s in _segments(line) if (w := _ours(s))] == expected


@pytest.mark.parametrize("argv, problem", [
    (["fleetforge", "convert", "m.onnx", "--no-such-option"], "no option --no-such-option"),
    (["fleetforge", "convrt", "m.onnx"], "no command 'convrt'"),
    (["fleetforge", "kernel"], "does not parse"),
    (["fleetforge", "show", "not a job id!"], "refused"),
    (["fleetforge", "--install-completion", "bash"], "No such command 'bash'"),
    (["make", "no-such-target"], "no target no-such-target"),
    (["python", "-m", "bench.bench_load", "--no-such-flag"], "does not parse"),
])
def test_a_command_that_no_longer_parses_fails(argv: list[str], problem: str) -> None:
    with pytest.raises((AssertionError, pytest.fail.Exception)) as ei:
        check(Command("doc.md:1", tuple(argv)))
    assert problem in str(ei.value)


def test_a_valid_command_passes_without_running_anything(tmp_path: Path) -> None:
    check(Command("doc.md:1", ("fleetforge", "convert", str(tmp_path / "m.onnx"), "--soc", "sm8550", "--precision",
                              "int8", "--wait")))
    check(Command("doc.md:1", ("python", "-m", "bench.bench_load", "--help")))
    assert not list(tmp_path.iterdir()), "parsing ran nothing"


def _links(doc: Path) -> list[Path]:
    """The files a markdown page links to by relative path."""
    return [(doc.parent / t).resolve() for t in re.findall(r"\]\(([^)#\s:]+)(?:#[^)]*)?\)", doc.read_text())]


def test_every_docs_page_is_reachable_from_the_readme_and_every_relative_link_resolves() -> None:
    """A page is found from the README or from a page it links (docs/kernel.md -> docs/kernel-verifier.md)."""
    broken = [f"{doc.relative_to(ROOT)}: {target}" for doc in DOCS for target in _links(doc) if not target.exists()]
    assert not broken, broken
    seen, todo = set(), [(ROOT / "README.md").resolve()]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.is_file():
            continue
        seen.add(page)
        todo += _links(page)
    unreachable = [p.name for p in DOCS[1:] if p.resolve() not in seen]
    assert not unreachable, f"no link leads from README.md to {', '.join(unreachable)}: link it from its job's page"


def test_the_readme_stays_a_two_minute_read() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 12 * 1024, f"README.md is {size} bytes: move the detail into a docs/ page (issue 41: <= 12 KB)"
