"""The guardian's policy as data: config/policy.toml plus a deployment's overlay.

The package: `schema` (pydantic models of a policy file and the `PolicyDoc` they
give, file reading), `merge` (the overlay rules, the compiled `Policy` the engine
reads), `overlay` (comment-preserving edits of the overlay with tomlkit, and the
`OverlayView` data that `/policy` renders). Import from `core.policy`.

Why a separate module: the lists people read and argue with (what is allowed, what
asks first, what is refused, where credentials live) belong in a file they can open,
while the engine that applies them (core/guardian/) stays code. This module reads
and validates both files, merges them under the overlay rules, and edits the
overlay's `[[always_allow]]` rules without touching anything else a person wrote.

Overlay rules (also written at the top of config/policy.toml):
- the overlay may tighten anything (more approval, forbid, credential, protected
  entries, options that run programs or write paths; a lower `max_delete_files`);
- it may relax approval → allow only by adding names to an allow list or through an
  exact `[[always_allow]]` rule;
- a forbidden class always wins: nothing in an overlay turns a forbid into an allow.
A relaxation the overlay asks for but cannot get is not an error: it is kept as a
note that `/policy` and `steward policy show` print.

Every mistake is a `PolicyError` naming the file, the key and the fix; the guardian
turns it into "refuse every call" (fail-closed), never into "ignore the file".
"""

from __future__ import annotations

from core.policy.merge import (
    Credential,
    McpRules,
    NameTable,
    Policy,
    Subcommands,
    canonical_args,
    merge,
    rule_match,
    url_host,
)
from core.policy.overlay import (
    OVERLAY_HEADER,
    OverlayView,
    overlay_text_with_rule,
    overlay_text_without_rule,
    render_document,
    render_rule,
    toml_str,
)
from core.policy.schema import (
    BUILTIN_NAME,
    DIGEST_PREFIX,
    HOST_PREFIX,
    MISSING,
    NO_SUBCOMMAND,
    RULE_ARGUMENT,
    AlwaysAllowRule,
    CredentialSpec,
    McpToolsSpec,
    OptionRisks,
    PolicyDoc,
    PolicyError,
    SubcommandSpec,
    builtin_path,
    parse_document,
    parse_text,
    read_document,
    rule_id,
)

__all__ = [
    "BUILTIN_NAME",
    "DIGEST_PREFIX",
    "HOST_PREFIX",
    "MISSING",
    "NO_SUBCOMMAND",
    "OVERLAY_HEADER",
    "RULE_ARGUMENT",
    "AlwaysAllowRule",
    "Credential",
    "CredentialSpec",
    "McpRules",
    "McpToolsSpec",
    "NameTable",
    "OptionRisks",
    "OverlayView",
    "Policy",
    "PolicyDoc",
    "PolicyError",
    "SubcommandSpec",
    "Subcommands",
    "builtin_path",
    "canonical_args",
    "merge",
    "overlay_text_with_rule",
    "overlay_text_without_rule",
    "parse_document",
    "parse_text",
    "read_document",
    "render_document",
    "render_rule",
    "rule_id",
    "rule_match",
    "toml_str",
    "url_host",
]
