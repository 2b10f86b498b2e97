"""`steward doctor`: check the set-up end to end and say, for each problem, what to do."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

from bot.app import ensure_dir, ensure_workspace
from config.model_chain import FallbackModel
from config.settings import ConfigError, Settings
from core.clock import Clock
from core.model.client import LLMClient, Target, litellm_knows_price, load_litellm
from core.model.errors import LLMError
from core.model.local.runtime import (
    INSTALL_HINT,
    MODEL_ALIAS,
    MODEL_LABEL,
    Availability,
    LocalModelError,
    availability,
    embedded_wanted,
    provider_key_present,
    server_for,
)
from memory.redact import redact_shown


@dataclass(slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warn: bool = False


def _dirs(settings: Settings) -> list[Check]:
    checks = []
    for key in ("data_dir", "workspace"):
        path = getattr(settings, key)
        try:
            ensure_workspace(settings) if key == "workspace" else ensure_dir(path, key)
            checks.append(Check(key, True, f"{path} is writable"))
        except ConfigError as exc:
            checks.append(Check(key, False, str(exc), f"set STEWARD_{key.upper()}"))
    return checks


def _sandbox(settings: Settings) -> Check:
    """Whether shell commands run in the OS sandbox here, and if not why
    (docs/safety.md#sandbox)."""
    from core.sandbox import SandboxRequired, parse_user, setup

    try:
        found = setup(
            settings.sandbox,
            settings.workspace,
            user=parse_user(settings.sandbox_user),
            hand_over_workspace=False,
        )
    except SandboxRequired as exc:
        return Check("sandbox", False, str(exc), "see docs/safety.md#sandbox")
    if found.fallback:
        return Check(
            "sandbox",
            True,
            found.describe(),
            'make user namespaces available, or set sandbox = "off" to opt out '
            "(see docs/safety.md#sandbox)",
            warn=True,
        )
    return Check("sandbox", True, found.describe())


async def _mcp(settings: Settings) -> list[Check]:
    """Each declared MCP server, started (or reached) once the way `steward run` would,
    with its tools counted or the reason it failed (docs/mcp.md)."""
    if not settings.mcp.servers:
        return []
    from bot.cli.mcp import probe_all
    from core.mcp import State

    checks = []
    for status in await probe_all(settings):
        name = f"mcp {status.name}"
        if status.state == State.DISABLED:
            checks.append(Check(name, True, "disabled (enabled = false)"))
        elif status.state == State.CONNECTED:
            count = len(status.tools)
            checks.append(Check(name, True, f"connected, {count} tool{'s' if count != 1 else ''}"))
        else:
            checks.append(
                Check(
                    name,
                    False,
                    f"{status.server.where()}: {status.detail}",
                    f"fix [mcp.servers.{status.name}] in {status.server.origin}, or set "
                    "enabled = false (docs/mcp.md); `steward mcp call` tests one tool",
                )
            )
    return checks


def _port(settings: Settings) -> Check:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((settings.host, settings.port))
        except OSError as exc:
            return Check(
                "web chat",
                True,
                f"{settings.host}:{settings.port} is in use ({exc.strerror}); "
                "fine if Steward is running",
                "otherwise set STEWARD_PORT to a free port",
                warn=True,
            )
    exposed = settings.host not in ("127.0.0.1", "localhost", "::1")
    if exposed:
        return Check(
            "web chat",
            bool(settings.web_password),
            f"will listen on {settings.host}:{settings.port}, beyond this machine",
            "set STEWARD_WEB_PASSWORD (required there) and put HTTPS in front, "
            "or keep STEWARD_HOST=127.0.0.1",
            warn=bool(settings.web_password),
        )
    return Check("web chat", True, f"http://{settings.host}:{settings.port} is free")


def _web_login(settings: Settings) -> Check:
    """Where the web chat's login comes from; never the token itself (doctor output gets
    pasted into bug reports)."""
    from memory.login_token import TokenError, read_token, token_path

    path = token_path(settings.data_dir)
    password = " STEWARD_WEB_PASSWORD also logs in (user owner)." if settings.web_password else ""
    try:
        token = read_token(settings.data_dir)
    except TokenError as exc:
        return Check("web login", False, str(exc), f"delete {path}; `steward run` makes a new one")
    if token is None:
        return Check(
            "web login",
            True,
            f"no token yet: `steward run` creates {path} and prints the login URL on its "
            f"terminal.{password}",
        )
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        return Check(
            "web login",
            True,
            f"token in {path} is readable by others (mode {mode:o})",
            f"chmod 600 {path} (`steward run` also does), then `steward login --new`",
            warn=True,
        )
    return Check(
        "web login",
        True,
        f"token in {path} (only you can read it); the login URL is printed by `steward run` "
        f"on its terminal, and by `steward login`.{password}",
    )


async def _model(settings: Settings) -> list[Check]:
    if not settings.model_configured:
        if embedded_wanted(settings):
            found = availability(settings.local_model_path.strip())
            if found.ok:
                return await _local_model(settings, found)
            return [
                Check(
                    "model",
                    False,
                    "no model configured (STEWARD_MODEL is empty), and the tiny local model "
                    f"can't run: {found.reason}",
                    "set STEWARD_MODEL (and the provider key); see "
                    "docs/configuration.md#the-model. " + INSTALL_HINT,
                )
            ]
        key = provider_key_present(os.environ)
        return [
            Check(
                "model",
                False,
                "no model configured (STEWARD_MODEL is empty)"
                + (f"; {key} is set, so the tiny local model is not used" if key else ""),
                "set STEWARD_MODEL (and the provider key); see docs/configuration.md#the-model",
            )
        ]
    litellm = load_litellm()
    main = Target(settings.model.strip(), settings.api_base.strip(), settings.api_key)
    chain = [main, *(_target(f) for f in settings.fallback_models)]
    checks = []
    for number, target in enumerate(chain):
        checks += await _one_model(settings, litellm, target, number)
    return checks


def _target(entry: FallbackModel) -> Target:
    return Target(entry.model, entry.api_base, entry.key(os.environ))


async def _one_model(settings: Settings, litellm: Any, target: Target, number: int) -> list[Check]:
    """One model of the chain: its provider key, a one-token ping, and its price. A
    fallback's checks are named after it, so a broken one is found before an outage needs
    it (docs/configuration.md#fallback-models)."""
    model = target.model
    name = "model" if number == 0 else f"fallback model {number} ({model})"
    where = (
        "STEWARD_MODEL"
        if number == 0
        else f"entry {number} of fallback_models (STEWARD_FALLBACK_MODELS)"
    )
    checks = []
    if not target.api_base:
        try:
            env = litellm.validate_environment(model=model)
        except Exception as exc:  # unknown provider prefix and the like
            return [
                Check(
                    name,
                    False,
                    f"litellm does not understand {model!r}: {exc}",
                    f"fix {where}: use a provider/model string, e.g. openai/gpt-4.1-mini",
                )
            ]
        missing = [] if target.api_key else env.get("missing_keys") or []
        if missing:
            key_name = "provider key" if number == 0 else f"{name}: provider key"
            return [
                Check(key_name, False, f"{', '.join(missing)} not set", f"export {missing[0]}=...")
            ]
        if number == 0:
            checks.append(Check("provider key", True, "present"))
    client = LLMClient(
        model=model,
        clock=Clock(),
        api_base=target.api_base,
        api_key=target.api_key,
        timeout=min(settings.llm_timeout, 30.0),
        retries=0,
        max_tokens=1,
        stream=False,
    )
    price = _price(litellm, model, settings)
    try:
        await client.complete([{"role": "user", "content": "ping"}])
        checks.append(Check(name, True, f"{client.describe()} answered; {price[0]}"))
    except LLMError as exc:
        # Whoever runs doctor runs Steward: the server and the provider's words too.
        said = f"{exc.detail}. {exc}" if exc.detail else str(exc)
        fix = "see the message above" if number == 0 else f"fix or remove {where}"
        checks.append(Check(name, False, said, fix))
        return checks
    if not price[1]:
        checks.append(
            Check(
                f"price of {model}",
                True,
                "litellm has no price for it and model_prices does not name it: its cost is "
                "unknown (spend and budgets count its tokens, not dollars)",
                f'set [model_prices."{model}"] input = ... output = ... (USD per million '
                "tokens) in steward.toml, or STEWARD_MODEL_PRICES; see "
                "docs/configuration.md#model-prices",
                warn=True,
            )
        )
    return checks


def _price(litellm: Any, model: str, settings: Settings) -> tuple[str, bool]:
    """Where the model's price comes from, said for doctor, and whether it has one."""
    own = settings.model_prices.get(model)
    if own is not None:
        return f"priced by model_prices ({own.input:g}/{own.output:g} USD per M tokens)", True
    if litellm_knows_price(model):
        return "priced by litellm's table", True
    return "no price known", False


async def _local_model(settings: Settings, found: Availability) -> list[Check]:
    """The embedded model: say plainly that it is a tiny one, then start it and ask it."""
    checks = [
        Check(
            "model",
            True,
            f"no model configured: using the tiny local model {MODEL_LABEL} "
            f"({settings.local_model_mode}; weights {found.gguf})",
            "it does simple jobs only; for real work set STEWARD_MODEL and its key "
            "(see docs/local-model.md)",
            warn=True,
        )
    ]
    assert found.gguf is not None
    log_path = settings.data_dir / "local-model.log"
    server = server_for(settings, found.gguf, log_path=log_path, max_restarts=0)
    t0 = time.monotonic()
    try:
        url = await server.ensure()
        client = LLMClient(
            model=f"openai/{MODEL_ALIAS}",
            clock=Clock(),
            api_base=url,
            api_key="sk-local",
            timeout=30.0,
            retries=0,
            max_tokens=1,
            stream=False,
        )
        await client.complete([{"role": "user", "content": "ping"}])
        checks.append(
            Check(
                "local model server",
                True,
                f"llama.cpp started and answered in {time.monotonic() - t0:.1f}s",
            )
        )
    except (LocalModelError, LLMError) as exc:
        # A crash is said as what it was (signal, last log lines, fix), not as the
        # connection error the request saw.
        said = server.death_report() or str(exc)
        checks.append(Check("local model server", False, said, f"see {log_path}"))
    finally:
        await server.stop()
    return checks


def _mounts_webhook(adapter: object) -> bool:
    """Whether the adapter, as configured, receives on a webhook (Slack in Socket Mode
    and Telegram polling don't): its routes, mounted on a scratch application."""
    add_routes = getattr(adapter, "add_routes", None)
    if add_routes is None:
        return False
    from aiohttp import web

    scratch = web.Application()
    add_routes(scratch)
    return bool(len(scratch.router.routes()))


async def _channels(settings: Settings) -> list[Check]:
    """Per configured platform: settings problems, then a real credential check, then the
    live health of a running Steward (its /healthz), if one answers."""
    from bot.channels import build_adapter, configured_platforms
    from config.platforms import PLATFORMS

    checks = [Check("channels", True, "terminal and local web chat are always available")]
    live = await _live_health(settings)
    specs = configured_platforms(settings)
    if not specs:
        titles = ", ".join(p.title for p in PLATFORMS)
        none = f"none configured ({titles}: see docs/platforms/README.md)"
        checks.append(Check("chat platforms", True, none))
    for spec in specs:
        problems = spec.problems(spec.config(settings))
        if problems:
            see = f"see docs/platforms/{spec.name}.md"
            checks.append(Check(spec.name, False, " ".join(problems), see))
            continue
        try:
            adapter = build_adapter(spec, settings)
            who = await asyncio.wait_for(adapter.check_credentials(), 20)  # type: ignore[attr-defined]
        except Exception as exc:
            checks.append(
                Check(
                    spec.name,
                    False,
                    f"credentials rejected or unreachable: {exc}",
                    f"check the STEWARD_{spec.name.upper()}_* settings",
                )
            )
            continue
        if settings.public_url.strip() and _mounts_webhook(adapter):
            who = f"{who}; webhook {settings.public_url.strip().rstrip('/')}{spec.webhook_path}"
        state = live.get(spec.name) if live else None
        if state is None:
            checks.append(Check(spec.name, True, f"credentials OK ({who}); not running here"))
        elif state["state"] in ("down", "deaf"):
            checks.append(
                Check(
                    spec.name,
                    False,
                    f"credentials OK ({who}) but the running channel is {state['state']}: "
                    f"{state['detail']}",
                    "see the adapter.* log lines of `steward run`",
                )
            )
        else:
            checks.append(
                Check(
                    spec.name,
                    True,
                    f"{who}; running: {state['state']} ({state['reconnects']} reconnects)",
                )
            )
    if live and live.get("_undelivered"):
        checks.append(
            Check(
                "delivery",
                True,
                f"{live['_undelivered']} undelivered message(s) kept in "
                f"{settings.data_dir}/outbox/undelivered.jsonl",
                "read them there",
                warn=True,
            )
        )
    memory = (live or {}).get("_memory")
    if memory and not memory.get("ok", True):
        for failure in memory.get("failing") or []:
            checks.append(
                Check(
                    "memory writes",
                    False,
                    f"the running Steward cannot save {failure['kind']} files: "
                    f"{failure['reason']} ({failure['count']} failed since {failure['since']}, "
                    f"last {failure['path']})",
                    f"free space in (or fix) {settings.data_dir}; writes resume by themselves",
                )
            )
    return checks


async def _live_health(settings: Settings) -> dict[str, Any] | None:
    """The /healthz of a Steward running with these settings, or None."""
    import aiohttp

    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(
                f"http://{host}:{settings.port}/healthz", timeout=aiohttp.ClientTimeout(total=2)
            ) as r:
                data = await r.json()
    except Exception:
        return None
    channels = dict(data.get("channels") or {})
    channels["_undelivered"] = data.get("undelivered", 0)
    channels["_memory"] = data.get("memory")
    return channels


def _memory(settings: Settings) -> Check:
    """Damaged memory files: those set aside in quarantine/ (memory/quarantine.py), and
    those still in place that the next start will set aside. Reads only: a running
    Steward may own the data dir."""
    from memory.quarantine import CLEAR, Quarantine

    quarantine = Quarantine(settings.data_dir)
    held = quarantine.files()
    waiting = quarantine.damaged()
    if not held and not waiting:
        return Check("memory", True, "every rule, approval and indexed episode reads")
    lines = []
    if held:
        lines.append(f"{len(held)} damaged file(s) set aside in {quarantine.root}:")
        lines += [
            f"    {q.path}: {q.reason}" + (f" (since {q.since})" if q.since else "") for q in held
        ]
    if waiting:
        if lines:
            lines.append("  and")
        lines.append(f"{len(waiting)} damaged file(s) the next start will set aside:")
        lines += [f"    {p.relative_to(quarantine.data_dir)}: {why}" for p, why in waiting]
    return Check("memory", False, "\n".join(lines), CLEAR)


def _snapshots(settings: Settings) -> Check:
    """Workspace snapshots (/undo): on or off, and how much disk the store uses."""
    if not settings.snapshots:
        return Check("snapshots", True, "off: tasks cannot be undone (snapshots = false)")
    from core.snapshots import store_report

    return Check(
        "snapshots",
        True,
        f"{store_report(settings.data_dir, settings)}; kept {settings.snapshot_keep_days:g} days, "
        f"at most {settings.snapshot_keep_count} tasks",
    )


async def run_doctor(settings: Settings) -> int:
    checks: list[Check] = [Check("config", True, _config_summary(settings))]
    checks += _dirs(settings)
    checks.append(_port(settings))
    checks.append(_web_login(settings))
    checks.append(_sandbox(settings))
    checks += await _mcp(settings)
    checks += await _model(settings)
    checks += await _channels(settings)
    checks.append(_memory(settings))
    checks.append(_snapshots(settings))
    failed = 0
    for c in checks:
        mark = "!" if c.warn else ("✓" if c.ok else "✗")
        # Doctor output gets pasted into bug reports: a URL setting (api_base, a server)
        # or an error naming one is shown without its password or token.
        print(f"{mark} {c.name}: {redact_shown(c.detail)}")
        if c.fix and (not c.ok or c.warn):
            print(f"    fix: {redact_shown(c.fix)}")
        failed += 0 if c.ok else 1
    print("all good" if not failed else f"{failed} problem(s) to fix", file=sys.stderr)
    return 0 if not failed else 1


def _config_summary(settings: Settings) -> str:
    custom = sorted(k for k, v in settings.sources.items() if v != "default")
    if not custom:
        return "defaults only (no steward.toml, no STEWARD_* variables)"
    shown = ", ".join(f"{k} ({settings.sources[k]})" for k in custom if k != "api_key")
    return f"loaded; set: {shown}"
