"""structlog set-up: one event name per line, JSON when not a terminal, pretty when it is.

Logs go to stderr so that `steward chat -m` keeps stdout for the answer alone.

Every string field is redacted just before it is rendered, with the same rules as the
data dir (memory/redact.py): a command waiting for approval, an error message or a
URL can carry a token, and a log file is copied and pasted far more freely than the
data dir is.
"""

from __future__ import annotations

import logging
import sys

import structlog

from memory.redact import redact_obj

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def redact_fields(
    _logger: object, _method: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Mask secrets in every field (nested lists and dicts too) of one log line."""
    return redact_obj(event_dict)


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    lvl = _LEVELS.get(level, logging.INFO)
    pretty = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=True)
        if pretty
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info
            if not pretty
            else structlog.processors.StackInfoRenderer(),
            redact_fields,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # litellm and httpx log through the standard library: keep them quiet unless debugging.
    logging.basicConfig(
        level=logging.WARNING if lvl > logging.DEBUG else logging.DEBUG, stream=sys.stderr
    )
    for name in ("LiteLLM", "litellm", "httpx", "httpcore", "openai", "aiohttp.access"):
        logging.getLogger(name).setLevel(logging.ERROR if lvl > logging.DEBUG else logging.DEBUG)
