"""How a failed model call is classified: worth a retry or not, which kind, how long
the provider asked us to wait.

Shared by the client (core/model/client.py), which retries and words the failure,
and its worker processes (core/model/worker_main.py), which send a failure's facts
back to it (`failure_info`, read again as a `WorkerCallError`).
"""

from __future__ import annotations

import json
import re
from typing import Any


class LLMError(Exception):
    """The model could not be reached or answered with an error, after retries.

    Its text is for a person: what happened and what to do, never the server's address
    or the provider's raw error, which `detail` says (for the log and `steward doctor`).
    """

    def __init__(self, message: str, *, kind: str, retryable: bool, detail: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
        self.detail = detail


class NoAnswer(Exception):
    """An attempt heard nothing from the model for `llm_timeout` seconds (the client's own
    deadline, which holds whatever the HTTP library does with a silent server): retried
    like a timeout."""


class EmptyAnswer(Exception):
    """The model's stream ended without a single chunk (not retried)."""


class WorkerCallError(Exception):
    """A model call that failed in a worker, as the retry and wording code reads it: the
    exception's class names, status, Retry-After, whether the answer was unreadable."""

    def __init__(self, text: str, info: dict[str, Any]) -> None:
        super().__init__(text)
        self.class_names: list[str] = list(info.get("names") or [])
        #: The class names of the exceptions it was raised from (`error_kind` reads them).
        self.cause_names: list[str] = list(info.get("causes") or [])
        self.status_code: int | None = info.get("status_code")
        self.malformed: bool = bool(info.get("malformed"))
        self.body: Any = info.get("body")
        after = info.get("retry_after")
        self.litellm_response_headers = {"retry-after": str(after)} if after is not None else {}


def failure_info(exc: BaseException) -> tuple[str, dict[str, Any]]:
    """What a worker sends back about a failed call: its text, and the facts
    `WorkerCallError` carries (picklable whatever litellm raised)."""
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    return str(exc), {
        "names": [cls.__name__ for cls in type(exc).__mro__],
        "causes": [name for cause in _causes(exc) for name in _own_names(cause)],
        "status_code": status if isinstance(status, int) else None,
        "malformed": is_malformed(exc),
        "retry_after": retry_after(exc),
        "body": body if isinstance(body, (str, dict, list)) else None,
    }


_RETRYABLE = (
    "NoAnswer",
    "RateLimitError",
    "InternalServerError",
    "ServiceUnavailableError",
    "APIConnectionError",
    "Timeout",
    "APITimeoutError",
    "BadGatewayError",
)


#: A provider's answer that could not be parsed (cut-off or non-JSON body, no choices,
#: bytes that are not UTF-8),
#: in the wordings litellm and the json module use. litellm reports these as a 500
#: (InternalServerError) or a mid-stream failure, but a retry gets the same answer.
_MALFORMED = re.compile(
    r"Expecting (?:value|property name|',' delimiter|':' delimiter)"
    r"|Unterminated string|Extra data|Invalid control character|Invalid \\escape"
    r"|JSONDecodeError|no 'choices'|Invalid response object|is not valid JSON"
    r"|codec can't decode byte|UnicodeDecodeError",
    re.IGNORECASE,
)


def is_malformed(exc: BaseException) -> bool:
    """The provider answered, but with something that is not a response: every retry
    would fail the same way."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "malformed", False) is True:  # said by a worker (WorkerCallError)
            return True
        if isinstance(current, (json.JSONDecodeError, UnicodeDecodeError)):
            return True
        if _MALFORMED.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def is_retryable(exc: BaseException) -> bool:
    """Worth another attempt: rate limits, timeouts, connection and server errors, but not
    an answer that fails the same way every time (unparsable; a 4xx other than 408/429)."""
    if is_malformed(exc) or _no_key(exc):
        return False
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return False
    return any(name in _RETRYABLE for name in _names(exc))


def _names(exc: BaseException) -> list[str]:
    """The class names of the exception, or of the one a worker process caught."""
    told = getattr(exc, "class_names", None)
    if isinstance(exc, WorkerCallError) and told:
        return list(told)
    return _own_names(exc)


def _own_names(exc: BaseException) -> list[str]:
    return [cls.__name__ for cls in type(exc).__mro__]


def _causes(exc: BaseException) -> list[BaseException]:
    """The exceptions `exc` was raised from or while handling, nearest first."""
    seen = {id(exc)}
    found: list[BaseException] = []
    current = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


#: A connection that could not be made, wherever in the chain (litellm reports a refused
#: connection to an OpenAI-compatible server as an InternalServerError, "Connection
#: error.", raised from openai's APIConnectionError).
_UNREACHED = {"APIConnectionError", "ConnectError", "ConnectionRefusedError", "ConnectTimeout"}


#: A key that was never given, in the words of the OpenAI client (which litellm wraps in
#: an InternalServerError, status 500): a configuration to fix, not an outage to retry.
_NO_KEY = re.compile(r"Missing credentials|api_key client option must be set")


def _no_key(exc: BaseException) -> bool:
    return any(_NO_KEY.search(str(e)) for e in (exc, *_causes(exc)))


def _unreached(exc: BaseException) -> bool:
    if isinstance(exc, WorkerCallError):
        return bool(_UNREACHED.intersection(exc.cause_names))
    return any(_UNREACHED.intersection(_own_names(cause)) for cause in _causes(exc))


def retry_after(exc: BaseException) -> float | None:
    """Find a Retry-After header wherever litellm put the provider's response headers."""
    candidates: list[Any] = [getattr(exc, "litellm_response_headers", None)]
    response = getattr(exc, "response", None)
    candidates.append(getattr(response, "headers", None))
    for headers in candidates:
        if not headers:
            continue
        try:
            value = headers.get("retry-after") or headers.get("Retry-After")
        except AttributeError:
            continue
        if value is None:
            continue
        try:
            return max(0.0, float(value))
        except (TypeError, ValueError):
            return None
    return None


#: "The request is longer than the context window" in the wordings litellm does not map
#: to ContextWindowExceededError itself (llama-cpp-python's server says "Requested tokens
#: (5000) exceed context window of 2048"), so they too get the advice that fits.
_CONTEXT_WORDING = re.compile(
    r"exceeds? (?:the )?(?:available |maximum )?context (?:window|length|size)"
    r"|context[_ ]length[_ ]exceeded",
    re.IGNORECASE,
)


def error_kind(exc: BaseException) -> str:
    """The kind of failure, which picks the advice a person reads (`LLMError.kind`)."""
    names = _names(exc)
    if is_malformed(exc):
        return "malformed"
    if "BadRequestError" in names and _CONTEXT_WORDING.search(str(exc)):
        return "context_window"
    if "InternalServerError" in names and _no_key(exc):
        return "no_key"
    if "InternalServerError" in names and _unreached(exc):
        return "connection"
    for name, kind in (
        ("NoAnswer", "timeout"),
        ("EmptyAnswer", "empty"),
        ("RateLimitError", "rate_limit"),
        ("Timeout", "timeout"),
        ("APITimeoutError", "timeout"),
        ("AuthenticationError", "auth"),
        ("NotFoundError", "not_found"),
        # Before BadRequestError, its base class: otherwise a message too long for the
        # model is worded as a configuration problem ("check STEWARD_MODEL").
        ("ContextWindowExceededError", "context_window"),
        ("BadRequestError", "bad_request"),
        ("APIConnectionError", "connection"),
        ("InternalServerError", "server_error"),
        ("ServiceUnavailableError", "server_error"),
    ):
        if name in names:
            return kind
    return "error"


def falls_back(exc: BaseException) -> bool:
    """Worth asking the next model of the fallback chain (core/model/client.py): what is
    retried (rate limit, 5xx, timeout, connection), and a request longer than this model's
    context window (another model may read more). Not a refused request (400: the request
    itself, which the next model would most likely refuse too) nor a refused key (401,
    403): a configuration mistake to fix, not an outage to ride out; falling back would
    hide it behind a notice on every message, and spend on another model, until someone
    read the log."""
    return is_retryable(exc) or error_kind(exc) == "context_window"
