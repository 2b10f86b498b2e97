"""`DiscordChannel`: the adapter itself, and discord.py's ``Client`` that feeds it.

Its lifecycle and restart loop (with backoff), health, the gateway events handed to
the parsers and on to the dispatcher (messages, edits and deletions attributed to
their author, button presses and held interactions, slash commands), and the REST
delivery calls (messages with buttons and files, edits, typing, ephemeral notes).
Parsing lives in adapters/discord/inbound.py, rendering in adapters/discord/render.py,
error translation in adapters/discord/errors.py. One class over ~550 lines: its parts
share the live gateway session and the maps of delivered messages and held interactions.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import discord
import discord.gateway
import discord.http
import structlog
import yarl
from discord import app_commands

from adapters.base import ChannelDefaults
from adapters.discord.errors import _guard, _snowflake, _trace, delivery_error
from adapters.discord.inbound import (
    parse_command,
    parse_delete,
    parse_edit,
    parse_message,
    parse_press,
)
from adapters.discord.render import (
    MAX_BUTTONS,
    MAX_LABEL,
    _params,
    discord_files,
    fit_files,
    message_payload,
    text_with_files,
)
from adapters.runtime import Health, Inflight
from core.backoff import Backoff
from core.events import (
    Attachment,
    Button,
    Capabilities,
    DeliveryError,
    Dispatch,
    Inbound,
    MessageRef,
)
from core.recent import Recent
from memory.channel_store import ChannelStore

log = structlog.get_logger("adapters.discord")

#: discord.py's own targets; an adapter without overrides restores them, because the
#: attributes are process-global and a previous instance may have redirected them.
DISCORD_API_URL = "https://discord.com/api/v10"
DISCORD_GATEWAY_URL = "wss://gateway.discord.gg/"

#: Interaction tokens live 15 minutes; keep a margin so a followup never races expiry.
INTERACTION_TTL = 14 * 60.0

INTENT_HINT = (
    "Discord closed the gateway with 4014 (disallowed intents): enable the MESSAGE CONTENT "
    "intent in the Discord developer portal (Applications → your app → Bot → Privileged "
    "Gateway Intents), then restart Steward"
)
AUTH_FAILED = (
    "Discord closed the gateway with 4004 (authentication failed): the token in "
    "STEWARD_DISCORD_TOKEN was refused; reset it in the developer portal and set it again"
)
#: Delivered messages remembered (id -> author, space) to attribute raw deletions.
DELIVERED_KEPT = 1024
#: First delay before restarting a gateway loop that crashed; doubles up to the cap
#: (with jitter) for as long as the client runs: each restart opens a new session, and
#: Discord allows only so many IDENTIFYs a day.
RESTART_DELAY = 1.0
RESTART_DELAY_MAX = 60.0


@dataclass(slots=True)
class _Held:
    """An interaction kept to answer later through its webhook (15-minute token)."""

    interaction: discord.Interaction
    message_id: str
    expires: float


class _Gateway(discord.Client):
    """discord.py's Client with its events routed to the adapter."""

    def __init__(self, adapter: DiscordChannel, **options: Any) -> None:
        super().__init__(**options)
        self.adapter = adapter
        self.tree = app_commands.CommandTree(self)
        adapter._register_commands(self.tree)

    async def setup_hook(self) -> None:
        await self.adapter._sync_commands(self)

    async def on_connect(self) -> None:  # READY: a new gateway session
        self.adapter._on_session(self)

    async def on_resumed(self) -> None:
        self.adapter._on_resumed()

    async def on_disconnect(self) -> None:
        self.adapter._on_disconnect()

    async def on_message(self, message: discord.Message) -> None:
        self.adapter._on_message(self, message)

    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        self.adapter._on_edit(self, payload)

    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        self.adapter._on_delete(self, payload)

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        if interaction.type is discord.InteractionType.component:
            await self.adapter._on_press(interaction)

    async def on_error(self, event_method: str, /, *args: Any, **kwargs: Any) -> None:
        log.exception("adapter.event_failed", channel="discord", event=event_method)


class DiscordChannel(ChannelDefaults):
    """A Discord bot: DMs and @-mentions in, messages with buttons out."""

    name = "discord"
    capabilities = Capabilities(
        buttons=True,
        edit=True,
        typing=True,
        threads=True,
        streams_text=False,
        shows_tool_status=False,
        interactive=True,
        max_length=2000,
        max_buttons=MAX_BUTTONS,
        max_label_length=MAX_LABEL,
    )

    def __init__(
        self,
        *,
        token: str,
        api_url: str = "",
        gateway_url: str = "",
        guild_ready_timeout: float = 2.0,
        ready_timeout: float = 10.0,
    ) -> None:
        """``api_url``: REST base (``…/api/v10``; a bare origin gets ``/api/v10``);
        ``gateway_url``: the first gateway URL (``ws(s)://…``). Empty = Discord's own.
        ``ready_timeout``: how long `start` waits for the first READY before returning
        with health still "starting" (the connection keeps trying in the background)."""
        self._token = token.strip()
        self._api_url = _rest_base(api_url) if api_url else DISCORD_API_URL
        self._gateway_url = gateway_url or DISCORD_GATEWAY_URL
        self._guild_ready_timeout = guild_ready_timeout
        self._ready_timeout = ready_timeout
        self.health = Health(self.name)
        self._client: _Gateway | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._dispatch: Dispatch | None = None
        self._stopping = False
        self._inflight = Inflight(self.name)
        #: (conversation, user) -> the button press to answer privately (ephemeral).
        self._presses: dict[tuple[str, str], _Held] = {}
        #: conversation -> a deferred slash command whose answer is the next send.
        self._commands: dict[str, _Held] = {}
        #: message id -> (author id, guild id) of the messages delivered as input, newest last.
        self._delivered: Recent[int, tuple[str, str | None]] = Recent(DELIVERED_KEPT)
        #: Delays between restarts of a crashed gateway loop.
        self._restarts = Backoff(RESTART_DELAY, RESTART_DELAY_MAX)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def from_settings(
        cls, cfg: Mapping[str, str], settings: Any, store: ChannelStore | None = None
    ) -> DiscordChannel:
        """The adapter from its registry settings (config/platforms.py)."""
        return cls(token=cfg["token"], api_url=cfg["api_url"], gateway_url=cfg["gateway_url"])

    def _redirect(self) -> None:
        # Public class attributes, read on every Route() and every first connect.
        discord.http.Route.BASE = self._api_url
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(self._gateway_url)

    def _new_client(self) -> _Gateway:
        # Steward never joins voice: without this, every start logs "PyNaCl is not
        # installed, voice will NOT be supported", which reads like a fault.
        discord.VoiceClient.warn_nacl = False
        discord.VoiceClient.warn_dave = False
        intents = discord.Intents.default()
        intents.message_content = True
        intents.dm_messages = True
        intents.guild_messages = True
        return _Gateway(
            self,
            intents=intents,
            guild_ready_timeout=self._guild_ready_timeout,
            http_trace=_trace(),
            allowed_mentions=discord.AllowedMentions.none(),
            max_messages=None,
            chunk_guilds_at_startup=False,
        )

    async def start(self, dispatch: Dispatch) -> None:
        """Log in (REST), register the slash commands, open the gateway in a task.

        Waits up to ``ready_timeout`` for READY. Raises `DeliveryError` when Discord
        refuses us for good (bad token, MESSAGE CONTENT intent not enabled:
        ``transient=False``) or is unreachable at login (``transient=True``); health
        says the same. A gateway that is merely slow keeps connecting in the background.
        """
        if self._client is not None:
            raise RuntimeError("DiscordChannel is already started")
        self._dispatch = dispatch
        self._stopping = False
        self._ready = asyncio.Event()
        self._redirect()
        self.health.begin()
        self.health.starting("logging in")
        client = self._new_client()
        self._client = client
        try:
            await client.login(self._token)
        except asyncio.CancelledError:
            await client.close()
            self._client = None
            raise
        except Exception as exc:
            await client.close()
            self._client = None
            err = delivery_error("login", exc)
            if err is None:
                raise
            self._down(str(err))
            raise err from exc
        self.health.starting("connecting to the gateway")
        self._task = asyncio.create_task(self._run(client), name="discord-gateway")
        ready = asyncio.create_task(self._ready.wait())
        await asyncio.wait(
            {ready, self._task}, timeout=self._ready_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        ready.cancel()
        if self.health.state == "down":
            # Refused for good: release the session now, so that a later start() (after
            # the operator fixed the token or the portal setting) begins from scratch.
            detail = self.health.detail
            await self.stop()
            self.health.set("down", detail)  # stop() said "stopped"; the reason stays
            raise DeliveryError(detail, transient=False)
        log.info("adapter.started", channel=self.name, state=self.health.state)

    async def _run(self, client: _Gateway) -> None:
        """discord.py's connect loop (it reconnects and resumes by itself), restarted
        when it dies of something it does not handle, e.g. an event it cannot parse."""
        self._restarts.reset()
        while not client.is_closed():
            try:
                await client.connect(reconnect=True)
                return
            except discord.PrivilegedIntentsRequired:
                self._down(INTENT_HINT)
                return
            except discord.ConnectionClosed as exc:
                self._down(AUTH_FAILED if exc.code == 4004 else f"gateway closed: {exc}")
                return
            except Exception as exc:
                if self._stopping or client.is_closed():
                    return
                delay = self._restarts.next_delay()
                log.exception("adapter.gateway_failed", channel=self.name, retry_in=delay)
                self.health.lost(f"gateway loop failed: {type(exc).__name__}")
                if client.ws is not None:
                    with contextlib.suppress(Exception):
                        await client.ws.close(code=4000)
                await asyncio.sleep(delay)

    async def stop(self) -> None:
        """Close the gateway and HTTP session; in-flight dispatches are cancelled."""
        self._stopping = True
        await self._inflight.cancel_all()
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, 5.0)
            except TimeoutError:
                log.warning("adapter.stop_timeout", channel=self.name)
            except Exception:
                log.debug("adapter.stop_gateway_error", channel=self.name, exc_info=True)
        self._presses.clear()
        self._commands.clear()
        self._delivered.clear()
        self._dispatch = None
        self.health.stopped()
        log.info("adapter.stopped", channel=self.name)

    async def check_credentials(self) -> str:
        """For `steward doctor`: GET /users/@me → ``"bot NAME (ID)"``, or `DeliveryError`."""
        self._redirect()
        http = discord.http.HTTPClient(asyncio.get_running_loop(), http_trace=_trace())
        try:
            data = await _guard("GET /users/@me", http.static_login(self._token))
        finally:
            await http.close()
        return f"bot {data['username']} ({data['id']})"

    # ------------------------------------------------------------------ health

    def _down(self, detail: str) -> None:
        self.health.down(detail)
        self._ready.set()

    def _on_session(self, client: _Gateway) -> None:
        """READY: a new gateway session (the first, or after a resume was refused)."""
        user = client.user
        self.health.up(f"as {user} ({user.id})" if user else "")
        self._ready.set()

    def _on_resumed(self) -> None:
        detail = self.health.detail if self.health.state == "connected" else ""
        if self._client is not None and self._client.user is not None:
            detail = f"as {self._client.user} ({self._client.user.id})"
        self.health.up(detail)

    def _on_disconnect(self) -> None:
        # discord.py also dispatches "disconnect" on our own close and just before a
        # fatal close code is raised; neither is a reconnect.
        if self._stopping or self.health.state == "down":
            return
        self.health.lost("gateway connection lost; resuming")

    # ------------------------------------------------------------------ inbound

    def _deliver(self, event: Inbound) -> None:
        dispatch = self._dispatch
        if dispatch is None or self._stopping:
            return
        self._inflight.spawn(dispatch, event)

    def _on_message(self, client: _Gateway, message: discord.Message) -> None:
        self.health.heard()
        event = parse_message(message, client.user, self.name)
        if event is None:
            return
        self._delivered.put(message.id, (event.user, event.space))
        self._deliver(event)

    def _on_edit(self, client: _Gateway, payload: discord.RawMessageUpdateEvent) -> None:
        """A person's edit of a message Steward took as input → `Retracted` ("edited")."""
        self.health.heard()
        event = parse_edit(payload, client.user, self._delivered, self.name)
        if event is not None:
            self._deliver(event)

    def _on_delete(self, client: _Gateway, payload: discord.RawMessageDeleteEvent) -> None:
        """A deletion of a message Steward took as input → `Retracted` ("deleted"); the
        author comes from discord.py's cache when it has the message, else from ours."""
        self.health.heard()
        known = self._delivered.pop(payload.message_id, None)
        event = parse_delete(payload, client.user, known, self.name)
        if event is not None:
            self._deliver(event)

    async def _on_press(self, interaction: discord.Interaction) -> None:
        """Acknowledge at once (deferred update, type 6), then dispatch in the background:
        Discord shows "interaction failed" if the answer takes more than 3 seconds."""
        self.health.heard()
        press = parse_press(interaction, self.name)
        if press is None:
            return
        try:
            await interaction.response.defer()
        except Exception as exc:
            # The press still happened; an approver's decision must not be lost because
            # the acknowledgement was late or refused.
            if delivery_error("interaction ack", exc) is None:
                raise
            log.warning("adapter.ack_failed", channel=self.name, error=str(exc))
        self._hold(self._presses, (press.conversation, press.user), interaction, press.message_id)
        self._deliver(press)

    def _hold(
        self,
        store: dict[Any, _Held],
        key: Any,
        interaction: discord.Interaction,
        message_id: str = "",
    ) -> None:
        now = time.monotonic()
        for old in [k for k, held in store.items() if held.expires <= now]:
            del store[old]
        store[key] = _Held(interaction, message_id, now + INTERACTION_TTL)

    @staticmethod
    def _fresh(held: _Held | None) -> _Held | None:
        return held if held is not None and held.expires > time.monotonic() else None

    # ------------------------------------------------------------------ slash commands

    def _register_commands(self, tree: app_commands.CommandTree[Any]) -> None:
        """`/rules`, `/approve`, `/deny`, `/pause`: each becomes the text command the
        dispatcher already understands, so they behave as in every other chat."""
        adapter = self

        @tree.command(name="rules", description="The rules Steward has learned")
        @app_commands.describe(what="list (default), or a status: candidate, active, retired")
        async def rules(interaction: discord.Interaction, what: str = "list") -> None:
            await adapter._on_command(interaction, f"/rules {what.strip() or 'list'}")

        @tree.command(name="approve", description="Approve a pending request by its id")
        @app_commands.rename(request="id")
        @app_commands.describe(request="the id shown in the approval request", scope="how far")
        async def approve(
            interaction: discord.Interaction,
            request: str,
            scope: Literal["once", "session", "always"] = "once",
        ) -> None:
            suffix = "" if scope == "once" else f" {scope}"
            await adapter._on_command(interaction, f"/approve {request.strip()}{suffix}")

        @tree.command(name="deny", description="Deny a pending request by its id")
        @app_commands.rename(request="id")
        @app_commands.describe(request="the id shown in the approval request")
        async def deny(interaction: discord.Interaction, request: str) -> None:
            await adapter._on_command(interaction, f"/deny {request.strip()}")

        @tree.command(name="pause", description="Pause Steward's own task queue")
        async def pause(interaction: discord.Interaction) -> None:
            await adapter._on_command(interaction, "/pause")

        @tree.error
        async def on_tree_error(
            interaction: discord.Interaction, error: app_commands.AppCommandError
        ) -> None:
            log.error("adapter.command_failed", channel=self.name, error=repr(error))

        del rules, approve, deny, pause, on_tree_error

    async def _sync_commands(self, client: _Gateway) -> None:
        """One bulk PUT of the global commands. A failure (e.g. the bot was invited
        without the applications.commands scope) costs the slash commands, not the bot."""
        try:
            synced = await client.tree.sync()
        except Exception as exc:
            err = delivery_error("PUT /applications/{id}/commands", exc)
            if err is None and not isinstance(exc, discord.DiscordException):
                raise
            log.warning("adapter.commands_sync_failed", channel=self.name, error=str(err or exc))
            return
        log.info("adapter.commands_synced", channel=self.name, commands=[c.name for c in synced])

    async def _on_command(self, interaction: discord.Interaction, text: str) -> None:
        self.health.heard()
        conversation = str(interaction.channel_id)
        try:
            await interaction.response.defer(thinking=True)
        except Exception as exc:
            if delivery_error("interaction ack", exc) is None:
                raise
            log.warning("adapter.ack_failed", channel=self.name, error=str(exc))
        else:
            self._hold(self._commands, conversation, interaction)
        self._deliver(parse_command(interaction, text, self.name))

    # ------------------------------------------------------------------ outbound

    @property
    def _http(self) -> discord.http.HTTPClient:
        client = self._client
        if client is None or client.is_closed():
            raise DeliveryError("the Discord channel is not running", transient=False)
        return client.http

    async def _post(
        self,
        conversation: str,
        thread: str | None,
        payload: dict[str, Any],
        files: Sequence[Attachment] = (),
    ) -> MessageRef:
        target = thread or conversation
        cid = _snowflake(target, "channel")
        with _params(payload, discord_files(files)) as params:  # closes the files after
            data = await _guard(
                f"POST /channels/{target}/messages", self._http.send_message(cid, params=params)
            )
        return MessageRef(
            channel=self.name, conversation=conversation, id=str(data["id"]), thread=thread
        )

    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        """Post a message (text is already Discord Markdown and ≤2000 chars: the channel
        layer converts and splits), with one button per choice (custom_id = the opaque
        value) and the attachments as its files (up to 10, 10 MB together; any other
        gets a line saying it was not sent). The first send without buttons after a
        slash command answers it."""
        files, left = fit_files(attachments)
        text = text_with_files(text, files, left)
        if buttons:
            return await self._post(conversation, thread, message_payload(text, buttons), files)
        held = self._fresh(self._commands.get(conversation))
        if held is not None:
            try:
                # `files` only when there are some: [] would add `attachments: []`.
                extra: dict[str, Any] = {"files": discord_files(files)} if files else {}
                sent = await held.interaction.followup.send(
                    text, wait=True, allowed_mentions=discord.AllowedMentions.none(), **extra
                )
            except (discord.NotFound, discord.Forbidden):
                self._commands.pop(conversation, None)  # token gone: post normally
            except Exception as exc:
                err = delivery_error("interaction followup", exc)
                if err is None:
                    raise
                raise err from exc
            else:
                self._commands.pop(conversation, None)
                return MessageRef(self.name, conversation, str(sent.id), thread)
        return await self._post(conversation, thread, message_payload(text), files)

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """Replace text and buttons; no buttons (None or []) sends ``components: []``,
        which is how a decided approval loses its buttons."""
        target = ref.thread or ref.conversation
        cid = _snowflake(target, "channel")
        mid = _snowflake(ref.id, "message")
        await _guard(
            f"PATCH /channels/{target}/messages/{ref.id}",
            self._http.edit_message(cid, mid, params=_params(message_payload(text, buttons or []))),
        )

    async def typing(self, conversation: str) -> None:
        """Show "Steward is typing…" (Discord keeps it about 10 seconds)."""
        cid = _snowflake(conversation, "channel")
        await _guard(f"POST /channels/{conversation}/typing", self._http.send_typing(cid))

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """An ephemeral followup to the user's last button press here (only they see it);
        without one (or once its token expired), a DM to the user — a normal message,
        but never in a shared channel where everybody would read it."""
        held = self._fresh(self._presses.get((conversation, user)))
        if held is not None:
            try:
                await held.interaction.followup.send(
                    text, ephemeral=True, allowed_mentions=discord.AllowedMentions.none()
                )
                return
            except (discord.NotFound, discord.Forbidden):
                self._presses.pop((conversation, user), None)
            except Exception as exc:
                err = delivery_error("ephemeral followup", exc)
                if err is None:
                    raise
                raise err from exc
        uid = _snowflake(user, "user")
        dm = await _guard("POST /users/@me/channels", self._http.start_private_message(uid))
        await self._post(str(dm["id"]), None, message_payload(text))


def _rest_base(url: str) -> str:
    url = url.rstrip("/")
    return url if re.search(r"/api/v\d+$", url) else f"{url}/api/v10"
