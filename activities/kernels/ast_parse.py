"""`ast.parse` that activity threads can share.

CPython 3.11 counts the AST constructor's recursion depth in one per-interpreter counter. When two activity
threads parse at once and a garbage-collector finalizer hands the GIL over mid-parse, the counts mix and the parse
raises `SystemError: AST constructor recursion depth mismatch` (python/cpython#106905): a verify activity then fails
for a reason that is nobody's. Every parse in the worker goes through one lock, so they take turns."""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    """`ast.parse(source)`, one thread at a time (SyntaxError as ast.parse raises it)."""
    with _LOCK:
        return ast.parse(source)
