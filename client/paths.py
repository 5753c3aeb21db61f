"""The one rule for what a user's reference names on the client's machine (every command, every
front door): a `file://` URI or a path (relative to the caller's working directory, `~` expanded)
that exists here is a local input the SDK uploads; anything else (s3://, upload://, a catalog
name, a path that does not exist here) goes to the worker as written."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse


def local_path(reference: str, cwd: Path | None = None) -> Path | None:
    """The existing local file or folder `reference` names, made absolute; None when it names none."""
    parsed = urlparse(reference)
    if parsed.scheme == "file":
        path = Path(unquote(parsed.path))
    elif len(parsed.scheme) > 1:  # s3://, upload://, http://; a one-letter scheme is a Windows drive
        return None
    else:
        path = Path(reference).expanduser()
    if not path.is_absolute():
        path = (cwd or Path.cwd()) / path
    return path.resolve() if path.exists() else None


def is_uri(reference: str) -> bool:
    return len(urlparse(reference).scheme) > 1
