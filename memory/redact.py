"""Secret redaction: a key pasted in chat must never reach the data dir or its git history.

Everything the store writes (front matter, body, commit message) passes through
`redact` / `redact_obj` first. A secret is replaced by `[REDACTED:<kind>]` so a reader
still sees *that* something was there and what it was, and the text around it stays
intact (a rule learned from "401 with token=…" is still useful without the token).

Why patterns and not only entropy: provider prefixes (`sk-ant-`, `ghp_`, `xoxb-`…)
are exact and cheap, and they catch short keys an entropy test would miss. Entropy
is the last net, and only next to a word like key/token/secret, because on its own it
would also eat git SHAs, UUIDs, base64 images and long identifiers.

What is deliberately *not* redacted (the negative cases in tests/test_redact.py):
40-hex git SHAs, UUIDs, paths, e-mail addresses, `git@host:org/repo`, ordinary prose
("the password is wrong"), and code that *names* a secret without containing one
(`password = get_password()`, `token: str | None = None`, `api_key=settings.api_key`).

Redaction is idempotent: `redact(redact(x)) == redact(x)`.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import re
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

T = TypeVar("T")

#: Marker left in place of a secret. Kept free of characters the patterns below
#: match as secret material, so a second pass leaves it alone.
MARKER = "[REDACTED:{kind}]"
_MARKER_RE = re.compile(r"\[REDACTED:[a-z_]+\]")

# Characters a token is made of (base64, base64url, hex, and the separators keys use).
_TOK = r"A-Za-z0-9_\-"


def _discord_first_segment(m: re.Match[str]) -> bool:
    """A Discord bot token starts with base64(user id): decoding it gives digits.

    Checking this keeps dotted look-alikes (hostnames, version strings) intact.
    """
    seg = m.group("uid")
    try:
        decoded = base64.urlsafe_b64decode(seg + "=" * (-len(seg) % 4))
    except (binascii.Error, ValueError):
        return False
    return decoded.isdigit() and 15 <= len(decoded) <= 20


def _not_a_port(m: re.Match[str]) -> bool:
    """`https://host:8080/users/@alice/` is a port and a path, not `user:password@`."""
    return re.match(r"\d+(?:[/?#]|$)", m.group("pw")) is None


def _not_a_hash(m: re.Match[str]) -> bool:
    """A 40-hex git SHA has the length of an AWS secret key; it is kept."""
    return _HEX_ONLY.fullmatch(m.group("s")) is None


_HEX_ONLY = re.compile(r"[0-9a-fA-F]+")


@dataclass(frozen=True, slots=True)
class Pattern:
    """One kind of secret: the regex, which group is the secret, an optional extra check."""

    kind: str
    regex: re.Pattern[str]
    #: Lower-case strings, one of which must occur in the lower-cased text for the
    #: regex to be tried at all: a substring test is ~100x cheaper than a regex scan.
    needles: tuple[str, ...] = ()
    #: Group replaced by the marker (0 = the whole match); the rest is context kept.
    group: int | str = 0
    check: Callable[[re.Match[str]], bool] | None = None


def _p(
    kind: str,
    rx: str,
    needles: tuple[str, ...] = (),
    *,
    group: int | str = 0,
    check: Callable[[re.Match[str]], bool] | None = None,
    flags: int = 0,
) -> Pattern:
    return Pattern(kind, re.compile(rx, flags), needles, group, check)


_B = r"(?<![A-Za-z0-9_])"  # not inside a longer word or key

# Order matters: whole blocks first (a PEM body would otherwise feed the entropy
# rule line by line), then exact provider formats, then context rules.
PATTERNS: tuple[Pattern, ...] = (
    # -----BEGIN [RSA|EC|OPENSSH|ENCRYPTED|PGP ...] PRIVATE KEY[ BLOCK]----- … END.
    # Also a pasted block that was cut before its END line (to the next blank line).
    _p(
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
        r"(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
        r"|.*?(?=\r?\n[ \t]*\r?\n|\Z))",
        ("private key",),
        flags=re.S,
    ),
    # JWT: header.payload.signature, both JSON parts base64url of '{"'.
    _p("jwt", rf"(?<![{_TOK}])eyJ[{_TOK}]{{8,}}\.eyJ[{_TOK}]{{8,}}\.[{_TOK}]*", ("eyj",)),
    # https://user:password@host — the user and host stay: they are useful context.
    # A password may hold `/` and `@` (`https://u:pa/ss@wo@rd@host/`, as curl and git
    # accept it): it runs to the last `@` of the word that is followed by a host name.
    _p(
        "url_password",
        r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s/:@'\"<>`]+:(?P<pw>[^\s'\"<>`]+)@"
        r"(?=[A-Za-z0-9\[][A-Za-z0-9.\-\[\]:]*(?:[/?#\s'\"<>`]|$))",
        ("://",),
        group="pw",
        check=_not_a_port,
    ),
    _p(
        "slack_webhook",
        r"https://hooks\.slack\.com/services/T[A-Z0-9]+/B[A-Z0-9]+/[A-Za-z0-9]+",
        ("hooks.slack.com",),
    ),
    _p(
        "discord_webhook",
        r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]+",
        ("/api/webhooks/",),
    ),
    _p("anthropic_key", rf"(?<![{_TOK}])sk-ant-[{_TOK}]{{20,}}", ("sk-ant-",)),
    _p("openrouter_key", rf"(?<![{_TOK}])sk-or-[{_TOK}]{{20,}}", ("sk-or-",)),
    # OpenAI: sk-…, sk-proj-…, sk-svcacct-…, sk-admin-…; a real key always has a digit.
    _p("openai_key", rf"(?<![{_TOK}])sk-(?=[{_TOK}]*\d)[{_TOK}]{{20,}}", ("sk-",)),
    _p("stripe_key", _B + r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}", ("_live_", "_test_")),
    _p("stripe_webhook_secret", _B + r"whsec_[A-Za-z0-9]{24,}", ("whsec_",)),
    _p(
        "github_token",
        _B + r"gh[pousr]_[A-Za-z0-9]{30,}",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    ),
    _p("github_token", _B + r"github_pat_[A-Za-z0-9_]{22,}", ("github_pat_",)),
    _p("gitlab_token", _B + r"glpat-[A-Za-z0-9_\-]{20,}", ("glpat-",)),
    # xoxb/xoxp/xoxa/xoxo/xoxs/xoxr, refresh tokens xoxe-…, and rotated xoxe.xoxp-….
    _p("slack_token", _B + r"(?:xoxe\.)?xox[abposre]-[A-Za-z0-9\-]{10,}", ("xox",)),
    _p("slack_app_token", _B + r"xapp-\d-[A-Za-z0-9\-]{10,}", ("xapp-",)),
    _p(
        "aws_access_key_id",
        r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Z0-9])",
        ("akia", "asia", "abia", "acca"),
    ),
    # An AWS secret access key has no prefix: 40 base64 characters. Named by an
    # assignment it is caught below; bare, it is recognised next to the access key id
    # it belongs to (already a marker here) or after the word "secret".
    _p(
        "aws_secret_key",
        r"(?:\[REDACTED:aws_access_key_id\][^A-Za-z0-9/+]{1,6}"
        r"|(?i:\bsecret(?:[ _\-]?(?:access[ _\-]?)?key)?\b)[^A-Za-z0-9/+\n]{1,6}"
        r"(?:\w+[^A-Za-z0-9/+\n]+){0,3}?)"
        r"(?<![A-Za-z0-9/+=])(?P<s>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
        # The id is a marker by now, but needles are looked for in the original text.
        ("akia", "asia", "abia", "acca", "secret"),
        group="s",
        check=_not_a_hash,
    ),
    _p("google_api_key", _B + r"AIza[0-9A-Za-z_\-]{35}(?![A-Za-z0-9_\-])", ("aiza",)),
    _p("huggingface_token", _B + r"hf_[A-Za-z0-9]{30,}", ("hf_",)),
    _p("npm_token", _B + r"npm_[A-Za-z0-9]{36}", ("npm_",)),
    _p("sendgrid_key", _B + r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}", ("sg.",)),
    # Telegram: <bot id>:AA<33 chars>.
    _p(
        "telegram_bot_token",
        r"(?<![A-Za-z0-9_:])\d{8,10}:AA[A-Za-z0-9_\-]{33}(?![A-Za-z0-9_\-])",
        (":aa",),
    ),
    # Discord bot token: base64(user id) . timestamp . hmac.
    _p(
        "discord_token",
        rf"(?<![{_TOK}.])(?P<uid>[{_TOK}]{{23,28}})\.[{_TOK}]{{6,7}}\.[{_TOK}]{{27,40}}"
        rf"(?![{_TOK}])",
        (".",),
        check=_discord_first_segment,
    ),
    # HTTP auth headers (and the same words in curl commands or logs).
    _p(
        "bearer_token",
        r"(?i)\bbearer\s+(?P<t>[A-Za-z0-9._~+/\-]{16,}=*)",
        ("bearer",),
        group="t",
    ),
    _p(
        "basic_auth",
        r"(?i)\bauthorization\s*:\s*basic\s+(?P<t>[A-Za-z0-9+/]{8,}=*)",
        ("basic",),
        group="t",
    ),
)

# --- name = value assignments (env, YAML, JSON, URL query, CLI flags) -------------

# A name that holds a secret: it ends with one of these words (`OPENAI_API_KEY`,
# `db.password`, `X-Api-Key`, `client_secret`), but not `tokens`, `max_tokens`,
# `primary_key` or `token_type`.
_SECRET_WORD = (
    r"(?:password|passwd|passphrase|pwd|secret|token|api[_\-]?key|apikey"
    r"|access[_\-]?key|secret[_\-]?key|private[_\-]?key|auth[_\-]?key|credentials?)"
)
# Found by the secret word, then the name is extended backwards by hand: a lazy
# name prefix inside the regex costs O(n²) on long `a_a_a_…` runs.
_ASSIGN = re.compile(
    rf"""
    (?P<word>{_SECRET_WORD})
    (?P<q>["']?)                     # closing quote of a JSON / Python dict key
    (?P<pre>[ \t]*)(?P<sep>=>|=|:)(?![=:])(?P<post>[ \t]*)
    (?P<value>"[^"\n]*"|'[^'\n]*'|\$\{{[^}}\n]*\}}|[^\s"'`,;&()\[\]{{}}<>|]+)
    """,
    re.IGNORECASE | re.VERBOSE,
)
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")
_NAME_MAX = 40
# `--password hunter2`, `--api-key sk…`: command lines pasted in chat.
_FLAG = re.compile(
    r"(?i)(?<![A-Za-z0-9_\-])--(?P<name>password|passwd|token|api-key|apikey|secret|client-secret)"
    r"[ \t]+(?P<value>(?!-)[^\s\"'`]+|\"[^\"\n]*\"|'[^'\n]*')"
)
# "my password is hunter2" — only when the value does not look like a word.
_PROSE = re.compile(
    r"(?i)\b(?P<name>password|passwd|passphrase|pwd)\s+(?:is|was)\s*:?\s+"
    r"(?P<value>\S*[0-9!@#$%^&*+=?~]\S*)"
)
# "password hunter2!" with no "is", ":" or "=": the same rule on the value (it must
# hold a digit or a symbol, so "password reset" stays), never a path, an option, a
# variable or shell syntax, and not `pwd` (a command: `pwd && ls`).
_PROSE_BARE = re.compile(
    r"(?i)\b(?P<name>password|passwd|passphrase)[ \t]+"
    r"(?P<value>(?![-/~$&|<>(\[{]|\.{1,2}/)(?=[^\s]{4,})\S*[0-9!@#$%^&*+=?~]\S*)"
)

_PLACEHOLDER = re.compile(
    r"""^(?:
        |\$\{?[A-Za-z_][A-Za-z0-9_]*\}?      # $VAR, ${VAR}
        |\$\{\{.*\}\}|\{\{.*\}\}              # ${{ secrets.X }}, {{ var }}
        |<[^<>]*>                             # <your key here>
        |%\([a-z_]+\)s|%s                     # Python formatting
        |\*+|x{3,}|X{3,}|.*\.\.\.|.*…         # masked already, or an example cut short
        |null|none|nil|true|false|~|\|[-+]?|>[-+]?
        |(?:os\.)?environ.*|env:.*|vault:.*|keyring:.*
    )$""",
    re.IGNORECASE | re.VERBOSE,
)
# Values that name a type or refer to another variable: code, not a secret.
_TYPE_NAMES = frozenset(
    {"str", "bytes", "int", "float", "bool", "any", "secretstr", "optional", "union", "dict"}
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z_]*")  # letters only: `pw`, `token`, `api_key`
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")  # settings.api_key, self.token
_PATH = re.compile(r"^(?:/|~/|\./|\.\./|[A-Za-z]:\\)")


def _kind_for(name: str) -> str:
    n = re.sub(r"[_.\-]", "", name.lower())
    if "secretaccesskey" in n and ("aws" in n or n.startswith("secretaccess")):
        return "aws_secret_key"
    if any(w in n for w in ("password", "passwd", "passphrase", "pwd")):
        return "password"
    if "secret" in n:
        return "secret"
    if "token" in n:
        return "token"
    return "api_key"


def _is_password_name(name: str) -> bool:
    return _kind_for(name) in ("password", "secret", "aws_secret_key")


def _unquote(value: str) -> tuple[str, str]:
    """(inner text, quote char or '')."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1], value[0]
    return value, ""


def _looks_like_secret_value(name: str, raw: str, text: str, end: int, spaced: bool) -> bool:
    """Is `raw` (the value after `name=`/`name:`) a secret rather than code or a reference?"""
    inner, quote = _unquote(raw)
    v = inner.strip()
    if not v or _MARKER_RE.fullmatch(v) or _PLACEHOLDER.match(v) or _PATH.match(v):
        return False
    if _MARKER_RE.search(v):
        return False
    if not quote:
        nxt = text[end : end + 1]
        if nxt in ("(", "["):  # get_password(), os.environ["X"]
            return False
        if _DOTTED.fullmatch(v) or v.lower() in _TYPE_NAMES:
            return False
        if _IDENT.fullmatch(v):
            # A bare word: a variable in code (`password = pw`, `f(token=token)`),
            # unless it is the whole value of an env / query assignment.
            rest = text[end:].lstrip(" \t")[:1]
            if spaced or rest in (",", ")", "}", "|", "]"):
                return False
    if _is_password_name(name):
        return True
    # token / key names: short or prose values are not keys ("token: expired").
    return len(v) >= 8 and not re.search(r"\s", v)


def _yaml_rest_of_line(text: str, m: re.Match[str], name_start: int) -> tuple[int, bool]:
    """For `name: value more words`: where the value ends, and whether it is a value at all.

    At the start of a line (`  password: correct horse staple`, a YAML key) the value
    is the rest of the line, comment excluded. In the middle of a sentence
    ("a secret: it ends with…") words after the first one mean prose, not a value.
    """
    vend = m.end("value")
    line_end = text.find("\n", vend)
    line_end = len(text) if line_end < 0 else line_end
    rest = text[vend:line_end]
    tail = rest.strip()
    if not tail or tail[0] in "#,}&;":
        return vend, True
    line_start = text.rfind("\n", 0, name_start) + 1
    if text[line_start:name_start].strip(" \t") not in ("", "-"):
        return vend, False
    comment = re.search(r"[ \t]#", rest)
    value_end = vend + len((rest[: comment.start()] if comment else rest).rstrip())
    return value_end, True


def _replace_assignments(text: str) -> str:
    out: list[str] = []
    last = 0
    for m in _ASSIGN.finditer(text):
        if m.start() < last:
            continue  # inside a value already replaced
        start = m.start("word")
        while start > 0 and m.start("word") - start < _NAME_MAX and text[start - 1] in _NAME_CHARS:
            start -= 1
        name, value = text[start : m.end("word")], m.group("value")
        _, quote = _unquote(value)
        value_end = m.end("value")
        # `password = pw` (spaces around `=`) is code; `PASSWORD=pw` is an env line.
        sep_spaced = m.group("sep") == "=" and bool(m.group("pre") or m.group("post"))
        # First the token after the separator: code (`password: str | None`) stops here.
        if not _looks_like_secret_value(name, value, text, value_end, sep_spaced):
            continue
        if not quote and m.group("sep") == ":":
            value_end, is_value = _yaml_rest_of_line(text, m, start)
            if not is_value:
                continue
            value = text[m.start("value") : value_end]
            if not _looks_like_secret_value(name, value, text, value_end, False):
                continue
        out.append(text[last : m.start("value")])
        out.append(f"{quote}{MARKER.format(kind=_kind_for(name))}{quote}")
        last = value_end
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def _replace_flags_and_prose(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        inner, quote = _unquote(m.group("value"))
        if not inner or _PLACEHOLDER.match(inner) or _MARKER_RE.search(inner):
            return m.group(0)
        value = inner
        tail = ""
        while value and value[-1] in ".,;:!?)`":  # sentence punctuation is not the secret
            tail = value[-1] + tail
            value = value[:-1]
        if not value:
            return m.group(0)
        marker = MARKER.format(kind=_kind_for(m.group("name")))
        head = text[m.start() : m.start("value")]
        return f"{head}{quote}{marker}{quote}{tail}"

    text = _FLAG.sub(sub, text)
    text = _PROSE.sub(sub, text)
    return _PROSE_BARE.sub(sub, text)


# --- high-entropy strings near a secret-ish word ----------------------------------

_NEAR_WORD = re.compile(
    r"(?i)(?<![a-z])(?:api[ _\-]?key|key|token|secret|password|passwd|passphrase"
    r"|credential|apikey|auth)s?(?![a-z])"
)
_CANDIDATE = re.compile(r"(?<![A-Za-z0-9+/=_\-.])[A-Za-z0-9+/_\-.]{20,}=*")
_HEX = re.compile(r"[0-9a-fA-F]+")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_WORDISH_SEGMENTS = re.compile(r"(?:[a-z]+|[0-9]+)(?:[_\-.](?:[a-z]+|[0-9]+))+")
_FILE_EXT = re.compile(r"\.[A-Za-z]{1,5}$")
_WINDOW = 40  # characters before the candidate, on the same line, searched for a word


def shannon_entropy(s: str) -> float:
    """Bits per character; random base62 ≈ 5, English words ≈ 3–3.5, hex ≤ 4."""
    if not s:
        return 0.0
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def looks_random(s: str) -> bool:
    """Could `s` be a generated key rather than a word, id, hash, path or name?"""
    core = s.rstrip("=").rstrip(".")
    if len(core) < 20:
        return False
    if not (re.search(r"[0-9]", core) and re.search(r"[A-Za-z]", core)):
        return False
    if _HEX.fullmatch(core) and len(core) in (7, 12, 40):  # git SHAs (short and full)
        return False
    if _UUID.fullmatch(core) or _WORDISH_SEGMENTS.fullmatch(core):
        return False
    if core.startswith(("/", "./", "~", "..")) or "//" in core or _FILE_EXT.search(core):
        return False
    classes = sum(bool(re.search(rx, core)) for rx in ("[a-z]", "[A-Z]", "[0-9]"))
    if classes < 3 and len(core) < 32:
        return False
    return shannon_entropy(core) >= 3.3


def _replace_high_entropy(text: str) -> str:
    out: list[str] = []
    last = 0
    for m in _CANDIDATE.finditer(text):
        token = m.group(0)
        line_start = text.rfind("\n", 0, m.start()) + 1
        before = text[max(line_start, m.start() - _WINDOW) : m.start()]
        if not _NEAR_WORD.search(before) or not looks_random(token):
            continue
        trail = len(token) - len(token.rstrip("."))
        out.append(text[last : m.start()])
        out.append(MARKER.format(kind="secret"))
        out.append(token[len(token) - trail :] if trail else "")
        last = m.end()
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


# --- public API ---------------------------------------------------------------


def _apply(pattern: Pattern, text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        secret = m.group(pattern.group) or ""
        if _MARKER_RE.fullmatch(secret) or (pattern.group and _PLACEHOLDER.match(secret)):
            return m.group(0)
        if pattern.check is not None and not pattern.check(m):
            return m.group(0)
        start, end = m.span(pattern.group)
        whole_start = m.start()
        s = m.group(0)
        marker = MARKER.format(kind=pattern.kind)
        return s[: start - whole_start] + marker + s[end - whole_start :]

    return pattern.regex.sub(sub, text)


def redact(text: str) -> str:
    """Replace every secret found in `text` by `[REDACTED:<kind>]`; everything else is kept."""
    if len(text) < _SHORTEST:
        return text
    if len(text) <= _MEMO_CHARS:
        return _redact_short(text)
    return _redact(text)


@functools.lru_cache(maxsize=1024)
def _redact_short(text: str) -> str:
    """`redact` of a short text, remembered: a task's request and reply are redacted for
    its journal record, its done line, its episode, its transcript and its log lines,
    ~4 of every 5 redactions of a message were of a text redacted before (~0.3 ms a
    message). The patterns never change in a process, so neither does the
    answer; at most ~1,000 texts of at most _MEMO_CHARS characters are kept."""
    return _redact(text)


def _redact(text: str) -> str:
    lowered = text.lower()
    present = {n for n in _NEEDLES if n in lowered}  # once, not once per pattern
    for pattern in PATTERNS:
        if not pattern.needles or not present.isdisjoint(pattern.needles):
            text = _apply(pattern, text)
    # The rules below all start from a secret-ish word: without one, skip their scans
    # (the log writer redacts every field of every line, so this is the common case).
    # Steward's own field names that merely contain such a word do not count: every
    # episode has `tokens_in`/`tokens_out`, which made each one pay every scan.
    if "tokens_" in lowered:
        lowered = _OWN_FIELDS.sub("", lowered)
    if not any(word in lowered for word in _CONTEXT_WORDS):
        return text
    text = _replace_assignments(text)
    text = _replace_flags_and_prose(text)
    return _replace_high_entropy(text)


_NEEDLES = frozenset(n for p in PATTERNS for n in p.needles)
#: Shorter text cannot hold a secret any rule here would recognise.
_SHORTEST = 8
#: Texts up to this long have their redaction remembered (`_redact_short`).
_MEMO_CHARS = 2000
#: Every word _SECRET_WORD, _FLAG, _PROSE and _NEAR_WORD start from contains one of these.
_CONTEXT_WORDS = ("pass", "pwd", "secret", "token", "key", "credential", "auth")
#: Keys of Steward's own episode front matter (at a line's start) that contain a context
#: word but never introduce a secret; left out of the context-word test only.
_OWN_FIELDS = re.compile(r"^tokens_(?:in|out):", re.MULTILINE)


_SECRET_KEY_NAME = re.compile(rf"(?i)^[A-Za-z0-9_.\-]*{_SECRET_WORD}$")


def redact_obj(obj: T) -> T:
    """Redact every string inside dicts, lists and tuples (front matter, tool arguments).

    A string stored under a secret-looking key (`password`, `api_key`, `SLACK_BOT_TOKEN`)
    is redacted whole even when it has no recognisable shape — `{"password": "hunter"}`
    carries no pattern, only its key says what it is. Other types pass through unchanged.
    """
    return cast(T, _redact_obj(obj, None))


def _redact_obj(obj: Any, key: Any) -> Any:
    if isinstance(obj, str):
        if isinstance(key, str) and _SECRET_KEY_NAME.match(key):
            v = obj.strip()
            if v and not _PLACEHOLDER.match(v) and not _MARKER_RE.search(v) and not _PATH.match(v):
                if _is_password_name(key) or (len(v) >= 8 and not re.search(r"\s", v)):
                    return MARKER.format(kind=_kind_for(key))
        return redact(obj)
    if isinstance(obj, dict):
        return {k: _redact_obj(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_redact_obj(v, key) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_redact_obj(v, key) for v in obj)
    return obj


# --- URLs shown to people (settings, status, health) ------------------------------

_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"<>`]+")
#: Query (or fragment) parameter names whose value is a credential whatever it looks
#: like: `?key=abc`, `?api-key=`, `?access_token=…`, `&sig=…`, `?X-Amz-Signature=…`
#: (a short word such as key or sig counts alone or after a separator: not `monkey`).
_SECRET_PARAM = re.compile(
    r"(?:^|[_.\-]|api|access|secret|private|subscription)(?:key|sig|pass|auth)$"
    r"|(?:token|secret|password|passwd|pwd|signature|credentials?)$",
    re.IGNORECASE,
)


def redact_shown(text: str) -> str:
    """A setting or status line about to be shown (`/healthz`, `steward doctor`, the
    start-up log, the dashboard): `redact`, and in every URL the userinfo password
    (`https://user:[REDACTED:url_password]@host/`) and the value of each query or
    fragment parameter named like a credential (`?key=`, `?token=`, `&sig=`), however
    short or plain it is. A person configured the URL, so nothing is guessed: a shown
    URL never carries its secret."""
    text = redact(text)
    if "://" not in text:
        return text
    return _URL.sub(lambda m: _redact_url(m.group(0)), text)


def _redact_url(url: str) -> str:
    scheme, _, rest = url.partition("://")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    at = authority.rfind("@")
    if at >= 0:
        user, colon, password = authority[:at].partition(":")
        if colon and password and not _MARKER_RE.fullmatch(password):
            authority = f"{user}:{MARKER.format(kind='url_password')}{authority[at:]}"
    path, hash_, fragment = tail.partition("#")
    path, question, query = path.partition("?")
    if question:
        query = _redact_params(query)
    if hash_ and "=" in fragment:
        fragment = _redact_params(fragment)
    return f"{scheme}://{authority}{path}{question}{query}{hash_}{fragment}"


def _redact_params(query: str) -> str:
    parts = []
    for part in query.split("&"):
        name, eq, value = part.partition("=")
        if eq and value and _SECRET_PARAM.search(name) and not _MARKER_RE.search(value):
            part = f"{name}={MARKER.format(kind=_kind_for(name))}"
        parts.append(part)
    return "&".join(parts)


def kinds() -> list[str]:
    """Every `<kind>` a marker can carry (for docs and the report)."""
    names = {p.kind for p in PATTERNS}
    names |= {"password", "secret", "token", "api_key", "aws_secret_key"}
    return sorted(names)
