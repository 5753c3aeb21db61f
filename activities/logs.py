"""structlog set-up: JSON in deployment, console in a terminal. Activity context (workflow id,
run id, activity type, attempt) is bound by the worker's interceptor, so every line carries it."""

from __future__ import annotations

import logging
import sys

import structlog


def scrub_secrets(_logger: object, _method: str, event: dict) -> dict:
    """No log line carries a secret value of the worker (activities/sandbox/scrub.py), whatever text it quotes."""
    from activities.sandbox.scrub import scrub

    return {k: scrub(v) if isinstance(v, str) else v for k, v in event.items()}


def configure_logging(*, json: bool | None = None, level: int = logging.INFO) -> None:
    if json is None:
        json = not sys.stderr.isatty()
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            scrub_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
