"""The suite's file order (tests/conftest.py): `make test` hands whole files to its xdist processes in this order,
so the long files must come first or one process ends the run alone."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import pytest_collection_modifyitems


class _Item:
    """What the hook reads of a collected test: its file and its markers."""

    def __init__(self, name: str, path: str, slow: bool = False):
        self.name, self.path, self.slow = name, Path(path), slow

    def get_closest_marker(self, marker: str) -> object | None:
        return object() if marker == "slow" and self.slow else None


def test_files_with_a_slow_test_come_first_then_the_files_with_most_tests_each_keeping_its_order():
    items = [_Item("a1", "a.py"), _Item("a2", "a.py"), _Item("b1", "b.py"), _Item("c1", "c.py"),
             _Item("c2", "c.py", slow=True), _Item("d1", "d.py"), _Item("d2", "d.py"), _Item("d3", "d.py"),
             _Item("e1", "e.py", slow=True)]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.name for i in items] == ["c1", "c2", "e1", "d1", "d2", "d3", "a1", "a2", "b1"]
