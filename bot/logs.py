"""structlog set-up: one event name per line, JSON when not a terminal, pretty when it is.

Logs go to stderr so that `steward chat -m` keeps stdout for the answer alone. The
interactive `steward chat` sends them to `<data dir>/steward-chat.log`: on the terminal
a log line would land in the middle of the prompt or of a streamed answer, and what
matters to the person there (a retry, a failed tool) is already shown by the chat.

Every string field is redacted just before it is rendered, with the same rules as the
data dir (memory/redact.py): a command waiting for approval, an error message or a
URL can carry a token, and a log file is copied and pasted far more freely than the
data dir is.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TextIO

import structlog

from bot.startup.log_format import pretty_logs
from memory.redact import redact_obj

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

#: Where the interactive `steward chat` logs, inside the data dir.
CHAT_LOG_NAME = "steward-chat.log"


def open_log_file(path: Path) -> TextIO | None:
    """Open `path` for appending (line-buffered), or None when it can't be written.

    None lets the caller fall back to stderr: a data dir that can't be created is
    reported a moment later with its own message (bot/app.ensure_dir).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "a", encoding="utf-8", buffering=1)
    except OSError:
        return None


class TolerantPrintLogger(structlog.PrintLogger):
    """A PrintLogger whose line is dropped, not raised, when its stream fails.

    Why: a log line is never a reason to stop. With stderr a pipe whose reader had gone
    (`steward run 2>&1 | head`, a log shipper that died), every line raised
    BrokenPipeError, including the shutdown's own: SIGTERM then never reached the
    index's close, aiosqlite's connection thread (not a daemon) stayed, and the process
    hung at exit for good."""

    def msg(self, message: str) -> None:
        try:
            super().msg(message)
        except (OSError, ValueError):  # broken pipe, full disk, a closed file
            pass

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


class TolerantPrintLoggerFactory(structlog.PrintLoggerFactory):
    def __call__(self, *args: object) -> structlog.PrintLogger:
        return TolerantPrintLogger(self._file)


def redact_fields(
    _logger: object, _method: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Mask secrets in every field (nested lists and dicts too) of one log line."""
    return redact_obj(event_dict)


def configure_logging(
    level: str = "info", fmt: str = "auto", *, stream: TextIO | None = None
) -> None:
    """Route structlog and the standard library's logging to `stream` (default stderr)."""
    lvl = _LEVELS.get(level, logging.INFO)
    out = stream if stream is not None else sys.stderr
    pretty = pretty_logs(fmt, out)
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=out.isatty())
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
        logger_factory=TolerantPrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    # litellm and httpx log through the standard library: keep them quiet unless debugging.
    logging.basicConfig(level=logging.WARNING if lvl > logging.DEBUG else logging.DEBUG, stream=out)
    # Python's own warnings (a library's DeprecationWarning) follow the logs.
    logging.captureWarnings(stream is not None)
    for name in ("LiteLLM", "litellm", "httpx", "httpcore", "openai", "aiohttp.access"):
        logging.getLogger(name).setLevel(logging.ERROR if lvl > logging.DEBUG else logging.DEBUG)
