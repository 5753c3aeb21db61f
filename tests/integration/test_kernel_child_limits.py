"""A kernel child's limits are prlimit's (`Limits` in activities/kernels/_proc.py), in force before the child's
first line runs, sandboxed or not: the child sets none of its own, so there is one place to change them."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.kernels._proc import FILE_LIMIT_BYTES, MEMORY_LIMIT_BYTES, spawn, wait_all
from activities.sandbox import log_lines


@pytest.mark.parametrize("sandbox", ["bwrap", "off"])
def test_a_kernel_child_runs_under_the_verifiers_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sandbox: str):
    monkeypatch.setenv("FLEETFORGE_SANDBOX", sandbox)
    (tmp_path / "task.py").write_text("raise SystemExit(open('/proc/self/limits').read())\n", encoding="utf-8")
    child = spawn("activities.kernels._child", tmp_path, ["task.py", "out.pt", "0", "1"], gpu=False, timeout_s=120)
    try:
        wait_all({"child": child}, 120, lambda _m: None)
    finally:
        child.kill()
    limits = {line[:26].strip(): line[26:].split()[:2] for line in log_lines(child.log) if line.startswith("Max ")}
    assert limits["Max address space"] == [str(MEMORY_LIMIT_BYTES)] * 2, limits
    assert limits["Max file size"] == [str(FILE_LIMIT_BYTES)] * 2
    assert limits["Max core file size"] == ["0", "0"]
    cpu_soft, cpu_hard = map(int, limits["Max cpu time"])
    assert cpu_soft >= 120 and cpu_hard == cpu_soft + 5
    assert limits["Max processes"] == ["128", "128"]
