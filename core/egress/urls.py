"""URLs as the egress rules see them: parsed once (the way httpx will connect), compared
after normalisation, and collected from what a person wrote in the conversation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from core.egress.addresses import normal_host, valid_host
from core.egress.policy import DEFAULT_PORTS

#: An http(s) URL in running text; stops at spaces, quotes, angle brackets and the `|`
#: of Slack's `<url|label>`.
_URL_IN_TEXT = re.compile(r"""https?://[^\s<>"'`|\\]+""", re.IGNORECASE)
_TRAILING = ".,;:!?*_~"
_PAIRS = {")": "(", "]": "[", "}": "{"}


@dataclass(frozen=True, slots=True)
class Target:
    """An http(s) URL: normalised (`url`), and the host and port it connects to."""

    url: str
    scheme: str
    #: ASCII (IDNs in their xn-- form), lower case, IPv6 without brackets.
    host: str
    port: int


def parse_url(text: str) -> Target:
    """The URL as it will be fetched; ValueError (a sentence) when it is not an http(s)
    URL with a valid host, or when parsers disagree about its host (`a.com\\@b.com`)."""
    raw = text.strip()
    try:
        parts = urlsplit(raw)
        url = httpx.URL(raw)
    except (ValueError, httpx.InvalidURL) as exc:
        raise ValueError(f"`{raw[:200]}` is not a valid URL ({exc})") from None
    scheme = url.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"only http:// and https:// URLs can be fetched, not `{raw[:200]}`")
    host = normal_host(url.raw_host.decode("ascii", errors="replace"))
    if not host:
        raise ValueError(f"`{raw[:200]}` names no host")
    if normal_host(parts.hostname or "") != normal_host(url.host):
        raise ValueError(
            f"`{raw[:200]}` is ambiguous: its host reads as {parts.hostname!r} or {url.host!r}; "
            "write the URL without a user name, backslashes or spaces"
        )
    if not valid_host(host):
        raise ValueError(f"`{host}` in `{raw[:200]}` is not a valid host name")
    port = url.port or DEFAULT_PORTS[scheme]
    netloc = f"[{host}]" if ":" in host else host
    if port != DEFAULT_PORTS[scheme]:
        netloc += f":{port}"
    if url.userinfo:
        netloc = url.userinfo.decode("ascii", errors="replace") + "@" + netloc
    path = url.raw_path.decode("ascii", errors="replace") or "/"
    return Target(f"{scheme}://{netloc}{path}", scheme, host, port)


def normal_url(text: str) -> str | None:
    """`parse_url(text).url`, or None for what is not a fetchable URL."""
    try:
        return parse_url(text).url
    except ValueError:
        return None


def _trim(url: str) -> str:
    """Drop what ends a sentence, not a URL: trailing punctuation, a closing bracket
    without its opening one (`(see https://x/a)`)."""
    while url:
        last = url[-1]
        if last in _TRAILING:
            url = url[:-1]
        elif last in _PAIRS and url.count(last) > url.count(_PAIRS[last]):
            url = url[:-1]
        else:
            break
    return url


def urls_in(texts: Iterable[str]) -> frozenset[str]:
    """The normalised http(s) URLs written in `texts` (what a person said)."""
    found: set[str] = set()
    for text in texts:
        if "://" not in text:
            continue
        for match in _URL_IN_TEXT.finditer(text):
            url = normal_url(_trim(match.group()))
            if url is not None:
                found.add(url)
    return frozenset(found)
