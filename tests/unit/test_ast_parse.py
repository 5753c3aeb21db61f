"""The worker's activity threads parse Python at once (a verify's static check, a compile's task reading); on
CPython 3.11 a bare `ast.parse` then fails now and then with a SystemError that is nobody's (CI, 2026-11-27: a
verify retried under the 22-job load test). `ast_parse.parse` is the one way the worker parses."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from activities.kernels import ast_parse

ROOT = Path(__file__).resolve().parents[2]


class _Cycle:
    """Cyclic garbage whose finalizer runs Python code: the collector runs it mid-parse, and the GIL changes hands."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        sum(range(50))


def test_eight_threads_parsing_while_the_collector_runs_finalizers_all_get_their_tree() -> None:
    """With a bare `ast.parse` in place of the lock, this test failed 3 runs of 3 on CPython 3.11.7 (`AST constructor
    recursion depth mismatch`)."""
    source = (ROOT / "activities/kernels/compiler/candidate.py").read_text()
    expected = len(ast_parse.parse(source).body)
    failures: list[str] = []

    def work() -> None:
        for _ in range(40):
            for _ in range(200):
                _Cycle()
            try:
                assert len(ast_parse.parse(source).body) == expected
            except (SystemError, AssertionError) as e:
                failures.append(repr(e))
                return

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_no_worker_module_parses_python_without_the_lock() -> None:
    bare = [f"{path.relative_to(ROOT)}:{n}" for root in ("activities", "workflows", "client")
            for path in (ROOT / root).rglob("*.py") if path.name != "ast_parse.py"
            for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\bast\.parse\(|PyCF_ONLY_AST", line)]
    assert bare == []
