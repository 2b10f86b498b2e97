"""Handlers for downloaders: `curl` and `wget`, what they upload, where they write and
whether what they fetch is run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from core.guardian.decision import Verdict
from core.guardian.knowledge import (
    CURL_UPLOAD_OPTIONS,
    CURL_VALUE_LONG,
    CURL_VALUE_SHORT,
    WGET_UPLOAD_OPTIONS,
    WGET_VALUE_SHORT,
)
from core.guardian.programs.runners import _built_at_run_time
from core.guardian.shell_text import WGET_VALUE_LONG, _Cmd, _Flow, _positionals, _Word

if TYPE_CHECKING:
    from core.guardian.analysis import _Analysis


def _curl(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    _built_at_run_time(a, cmd)
    _note_urls(a, cmd, CURL_VALUE_SHORT, CURL_VALUE_LONG)
    for opt, val in _parse_options(cmd.args, CURL_VALUE_SHORT, CURL_VALUE_LONG):
        if opt in CURL_UPLOAD_OPTIONS:
            a.flag(
                Verdict.APPROVAL, f"{cmd.snippet} sends data to the network ({opt})", ("network",)
            )
        elif (
            opt in ("-X", "--request")
            and val is not None
            and val.text.upper() not in ("GET", "HEAD")
        ):
            a.flag(
                Verdict.APPROVAL, f"{cmd.snippet} sends a {val.text.upper()} request", ("network",)
            )
        elif opt in ("-o", "--output") and val is not None:
            a.check_write(val, cmd.scope, cmd.snippet)
            a._remember_download(val, cmd.scope)
        elif opt in ("-O", "--remote-name", "--remote-name-all"):
            a.check_write(_Word(".", "."), cmd.scope, cmd.snippet, effect="")
            for url in _positionals(cmd.args):
                name = os.path.basename(urlsplit(url.text).path)
                if name:
                    a._remember_download(_Word(name, name), cmd.scope)
                    a.note("writes", _Word(name, name), cmd.scope)
        elif opt == "--output-dir" and val is not None:
            a.check_write(val, cmd.scope, cmd.snippet)
        elif opt in ("-K", "--config"):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} reads its options from a file")
        elif opt in ("-H", "--header") and val is not None and val.text.startswith("@"):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} sends headers read from a file")
        elif opt == "--variable":
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} reads a file or variable it can send on")
    for url in _positionals(cmd.args):
        scheme = urlsplit(url.text).scheme.lower() if "://" in url.text else ""
        if scheme and scheme not in ("http", "https", "ftp", "ftps", "file"):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} uses the {scheme}:// protocol")
        if scheme == "file":  # file:///…/steward.toml is a read like cat's
            local = urlsplit(url.text).path
            a.check_credentials(
                _Word(local, local if url.value is not None else None), cmd.scope, cmd.snippet
            )
    return _Flow("network")


def _wget(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    _built_at_run_time(a, cmd)
    _note_urls(a, cmd, WGET_VALUE_SHORT, WGET_VALUE_LONG)
    to_stdout = False
    named = False
    for opt, val in _parse_options(cmd.args, WGET_VALUE_SHORT, WGET_VALUE_LONG):
        key = opt.split("=", 1)[0]
        if key in WGET_UPLOAD_OPTIONS:
            a.flag(
                Verdict.APPROVAL, f"{cmd.snippet} sends data to the network ({key})", ("network",)
            )
        elif key == "--method":
            method = opt.partition("=")[2] or (val.text if val else "")
            if method.upper() not in ("GET", "HEAD"):
                a.flag(
                    Verdict.APPROVAL,
                    f"{cmd.snippet} sends a {method.upper()} request",
                    ("network",),
                )
        elif key in ("-O", "--output-document"):
            target = val if val is not None else _Word(opt.partition("=")[2], opt.partition("=")[2])
            named = True
            if target.text == "-":
                to_stdout = True
            else:
                a.check_write(target, cmd.scope, cmd.snippet)
                a._remember_download(target, cmd.scope)
        elif key in ("-P", "--directory-prefix"):
            target = val if val is not None else _Word(opt.partition("=")[2], opt.partition("=")[2])
            a.check_write(target, cmd.scope, cmd.snippet)
            named = True
        elif key in ("-o", "-a", "--output-file", "--append-output") and val is not None:
            a.check_write(val, cmd.scope, cmd.snippet)
    if not named:
        a.check_write(_Word(".", "."), cmd.scope, cmd.snippet, effect="")
        for url in _positionals(cmd.args):
            name = os.path.basename(urlsplit(url.text).path)
            if name:
                a._remember_download(_Word(name, name), cmd.scope)
                a.note("writes", _Word(name, name), cmd.scope)
    return _Flow("network") if to_stdout or named else _Flow()


def _note_urls(
    a: _Analysis, cmd: _Cmd, short_values: frozenset[str], long_values: frozenset[str]
) -> None:
    """The words that are neither options nor their values are what it fetches."""
    values = {id(val) for _, val in _parse_options(cmd.args, short_values, long_values) if val}
    for url in _positionals(cmd.args):
        if id(url) not in values:
            a.note("fetches", url.value if url.value is not None else url.raw)


def _parse_options(
    words: list[_Word], short_values: frozenset[str], long_values: frozenset[str]
) -> Iterator[tuple[str, _Word | None]]:
    """(option, value) pairs: -XPOST, -X POST, --request=POST, --request POST, -sSLo file."""
    i = 0
    while i < len(words):
        text = words[i].text
        if text == "--":
            return
        if text.startswith("--"):
            opt, eq, val = text.partition("=")
            if eq:
                yield opt, _Word(val, val)
            elif opt in long_values and i + 1 < len(words):
                yield opt, words[i + 1]
                i += 1
            else:
                yield opt, None
        elif text.startswith("-") and len(text) > 1:
            for k, ch in enumerate(text[1:], start=1):
                if ch in short_values:
                    rest = text[k + 1 :]
                    if rest:
                        yield f"-{ch}", _Word(rest, rest)
                    elif i + 1 < len(words):
                        yield f"-{ch}", words[i + 1]
                        i += 1
                    else:
                        yield f"-{ch}", None
                    break
                yield f"-{ch}", None
        i += 1
