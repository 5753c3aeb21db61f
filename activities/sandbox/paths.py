"""Sandboxed joins: every path that comes from a plan, an LLM or a user is workspace-relative."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from contracts.errors import Err, FleetforgeError


def safe_join(root: Path, rel: str) -> Path:
    """`root / rel`, refusing absolute paths, `..`, NUL bytes, backslashes and symlink escapes.

    Raises FleetforgeError(PATH_ESCAPE) naming the offending path; never touches the filesystem
    beyond resolving existing symlinks.
    """
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise FleetforgeError(Err.PATH_ESCAPE, f"path {rel!r} is empty or contains a NUL byte")
    if "\\" in rel:
        raise FleetforgeError(Err.PATH_ESCAPE, f"path {rel!r} contains a backslash; use workspace-relative POSIX paths")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or rel.startswith("~"):
        raise FleetforgeError(Err.PATH_ESCAPE, f"path {rel!r} is absolute; paths must be workspace-relative")
    if any(part == ".." for part in pure.parts):
        raise FleetforgeError(Err.PATH_ESCAPE, f"path {rel!r} contains '..'; paths must stay inside the workspace")
    root = root.resolve()
    candidate = (root / pure).resolve()
    if candidate != root and root not in candidate.parents:
        raise FleetforgeError(Err.PATH_ESCAPE, f"path {rel!r} resolves outside the workspace (symlink escape)")
    return candidate
