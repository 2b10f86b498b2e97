"""Egress: the one policy for where the model's network hands may connect.

- `policy.py`: `EgressPolicy` (the address rules, the owner's `egress_allow`, Steward's
  own endpoints), `EgressRefused`, `from_settings`;
- `addresses.py`: which addresses are not the internet, this machine's own addresses;
- `urls.py`: URLs parsed the way they are fetched, normalised, found in a person's text;
- `transport.py`: `egress_client`, an httpx client whose every connection (each
  redirect too) is checked and pinned to the checked address;
- `proxy.py`: `EgressProxy`, an HTTP CONNECT / plain-HTTP / SOCKS5 proxy on a Unix
  socket for one shell command granted the network, with that command's host list;
- `bridge.py`: the stdlib-only script the sandbox runs to reach that socket from
  127.0.0.1:PORT (`bridge.SOURCE`).

web_fetch uses the transport; the guardian's `check_fetch` uses the policy's literal
check and the person's URLs (`urls_in`).
"""

from __future__ import annotations

from core.egress.policy import (
    AllowEntry,
    EgressPolicy,
    EgressRefused,
    Endpoint,
    from_settings,
    parse_allow_entry,
)
from core.egress.proxy import Attempt, EgressProxy
from core.egress.urls import Target, normal_url, parse_url, urls_in

__all__ = [
    "AllowEntry",
    "Attempt",
    "EgressPolicy",
    "EgressProxy",
    "EgressRefused",
    "Endpoint",
    "Target",
    "from_settings",
    "normal_url",
    "parse_allow_entry",
    "parse_url",
    "urls_in",
]
