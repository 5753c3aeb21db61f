"""Secret hygiene: text that leaves a child (log excerpts, exception messages) on its way into history,
prompts, results or logs loses the worker's secret values first.

A secret is the value of an environment variable whose name says it holds one (KEY, TOKEN, SECRET,
PASSWORD, CREDENTIAL, ...) or a credential embedded in a connection URL (`scheme://user:pass@host`).
Values are read from the environment at each call, so a key set after start-up is covered too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

MASK = "[redacted]"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTH|SESSION|COOKIE|PRIVATE",
                         re.IGNORECASE)
MIN_SECRET_CHARS = 6
"""Shorter values (`1`, `true`, `us-east-1`) would mask ordinary words; no real key is that short."""
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s@:]+:[^/\s@]+)@")


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values to mask, longest first (so a key that contains another is masked whole)."""
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= MIN_SECRET_CHARS}
    for v in env.values():  # credentials inside URLs held by any variable (DATABASE_URL, S3 endpoints, ...)
        for m in _URL_CREDENTIALS.finditer(v):
            password = m.group("userinfo").split(":", 1)[1]
            if len(password) >= MIN_SECRET_CHARS:
                values.add(password)
    return sorted(values, key=len, reverse=True)


def scrub(text: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` with every secret value of the worker's environment and every URL credential masked."""
    if not text:
        return text
    for value in secret_values(environ):
        text = text.replace(value, MASK)
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
