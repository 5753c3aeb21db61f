"""argv for external (argv-driven) tools, rendered from a validated spec. No shell strings, no
pass-through: only flags the spec declares. Paths stay workspace-relative; the executor runs the
program with cwd = the workspace root, so the same argv is valid on any worker."""

from __future__ import annotations

from typing import Any

from contracts.convert import ToolSpec
from contracts.errors import Err, FleetforgeError


def build_argv(spec: ToolSpec, params: dict[str, Any]) -> list[str]:
    if not spec.program:
        raise FleetforgeError(Err.COMPILER_ERROR, f"tool {spec.name} is in-process; it takes params, not argv")
    argv = [spec.program]
    for arg in spec.args:  # spec order: deterministic argv
        if arg.name not in params or params[arg.name] is None:
            continue
        value = params[arg.name]
        flag = arg.flag or f"--{arg.name}"
        if arg.type == "bool":
            if value:
                argv.append(flag)
            continue
        if arg.type == "list":  # one flag per item
            for item in value:
                argv += [flag, str(item)]
            continue
        argv += [flag, str(value)]
    return argv
