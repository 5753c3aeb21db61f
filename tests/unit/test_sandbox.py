"""safe_join: every plan/LLM/user path stays inside the workspace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from activities.sandbox import safe_join
from contracts.errors import Err, FleetforgeError


@pytest.mark.parametrize("rel", [
    "/etc/passwd", "~/x", "..", "../x", "a/../../x", "a/..", "a\x00b", "", "a\\b", "..\\x",
])
def test_rejects_escapes(tmp_path: Path, rel: str) -> None:
    with pytest.raises(FleetforgeError) as e:
        safe_join(tmp_path, rel)
    assert e.value.code is Err.PATH_ESCAPE
    assert repr(rel) in str(e.value)


def test_rejects_symlink_escape(tmp_path: Path) -> None:
    root, outside = tmp_path / "ws", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    (root / "filelink").symlink_to(outside / "secret")
    for rel in ("link", "link/secret", "filelink"):
        with pytest.raises(FleetforgeError) as e:
            safe_join(root, rel)
        assert e.value.code is Err.PATH_ESCAPE


def test_accepts_nested_and_inside_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "logs").mkdir(parents=True)
    (root / "alias").symlink_to(root / "logs")
    assert safe_join(root, "input/model.onnx") == root.resolve() / "input" / "model.onnx"
    assert safe_join(root, "a/./b/c.txt") == root.resolve() / "a" / "b" / "c.txt"
    assert safe_join(root, "alias/x.log") == root.resolve() / "logs" / "x.log"
    assert safe_join(root, ".") == root.resolve()
    assert not (root / "input").exists(), "safe_join must not create anything"


def test_root_itself_may_be_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    os.symlink(real, link)
    assert safe_join(link, "x") == real.resolve() / "x"
