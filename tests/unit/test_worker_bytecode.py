"""The worker writes its workflow modules' bytecode: the workflow sandbox imports a workflow's module
afresh for every run, and without a .pyc (PYTHONDONTWRITEBYTECODE=1) each run compiled it again."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import pytest

from worker import WORKFLOW_SOURCES, cache_bytecode


def pyc_of(source: Path) -> Path:
    return Path(importlib.util.cache_from_source(str(source)))


def test_bytecode_is_written_despite_dont_write_bytecode_and_imports_use_it(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # what PYTHONDONTWRITEBYTECODE=1 sets
    source = tmp_path / "row.py"
    source.write_text("X = 1\n")
    cache_bytecode(tmp_path)
    assert pyc_of(source).is_file()
    written = pyc_of(source).stat().st_mtime_ns
    cache_bytecode(tmp_path)
    assert pyc_of(source).stat().st_mtime_ns == written, "an up-to-date .pyc is left alone"
    loader = importlib.machinery.SourceFileLoader("row", str(source))
    monkeypatch.setattr(loader, "source_to_code", lambda *a, **k: pytest.fail("the import compiled the source again"))
    assert loader.get_code("row") is not None


def test_a_folder_the_worker_cannot_write_is_left_as_it_is(tmp_path: Path):
    (tmp_path / "row.py").write_text("X = 1\n")
    (tmp_path / "__pycache__").write_text("a file where the cache folder would be")  # unwritable, even for root
    cache_bytecode(tmp_path)
    assert (tmp_path / "__pycache__").is_file()


def test_by_default_the_workflow_modules_get_their_bytecode():
    cache_bytecode()
    assert pyc_of(WORKFLOW_SOURCES / "model_test.py").is_file()
