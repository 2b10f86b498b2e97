"""`DiscordChannel`: the adapter itself.

Its lifecycle and restart loop, health, inbound messages, edits and deletions
attributed to their author, button presses and held interactions, slash commands,
and the REST outbound calls. The gateway client lives in adapters/discord/gateway.py,
rendering in adapters/discord/render.py, error translation in
adapters/discord/errors.py. One class over ~550 lines: its parts share the live
gateway session and the maps of delivered messages and held interactions.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import discord
import discord.gateway
import discord.http
import structlog
import yarl
from discord import app_commands

from adapters.base import ChannelDefaults, with_attachments
from adapters.discord.errors import _guard, _snowflake, _trace, delivery_error
from adapters.discord.gateway import _Gateway, _Held, _is_thread
from adapters.discord.render import MAX_BUTTONS, MAX_LABEL, _params, message_payload
from adapters.runtime import Health, Inflight, Recent
from core.events import (
    Attachment,
    Button,
    ButtonPress,
    Capabilities,
    DeliveryError,
    Dispatch,
    Inbound,
    Message,
    MessageRef,
    Retracted,
)

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
#: First delay before restarting a gateway loop that crashed; doubles up to the cap.
RESTART_DELAY = 1.0
RESTART_DELAY_MAX = 60.0


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

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def from_settings(cls, cfg: Mapping[str, str], settings: Any) -> DiscordChannel:
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
        failures = 0
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
                failures += 1
                delay = min(RESTART_DELAY * 2 ** (failures - 1), RESTART_DELAY_MAX)
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
        me = client.user
        author = message.author
        if me is None or author.bot or author.id == me.id or message.webhook_id is not None:
            return
        if message.type not in (discord.MessageType.default, discord.MessageType.reply):
            return
        text = message.content
        direct = message.guild is None
        if not direct:
            # People often pick the bot's own role from the @-autocomplete (same name as
            # the bot): a mention of that managed role counts as mentioning the bot.
            roles = [r.id for r in message.role_mentions if r.tags and r.tags.bot_id == me.id]
            ids = "|".join([f"@!?{me.id}", *(f"@&{r}" for r in roles)])
            mention = re.compile(rf"\s*<(?:{ids})>\s*")
            named = roles or any(u.id == me.id for u in message.mentions)
            if not (named or mention.search(text)):
                return
            text = mention.sub(" ", text)
        channel = message.channel
        conversation = str(channel.id)
        space = None if message.guild is None else str(message.guild.id)
        self._delivered.put(message.id, (str(author.id), space))
        self._deliver(
            Message(
                channel=self.name,
                conversation=conversation,
                user=str(author.id),
                text=text.strip(),
                id=str(message.id),
                thread=conversation if _is_thread(channel) else None,
                user_name=author.display_name,
                space=space,
                direct=direct,
            )
        )

    def _on_edit(self, client: _Gateway, payload: discord.RawMessageUpdateEvent) -> None:
        """A person's edit of a message Steward took as input → `Retracted` ("edited")."""
        self.health.heard()
        me, message = client.user, payload.message
        author = message.author
        if me is None or author.bot or author.id == me.id or message.webhook_id is not None:
            return
        if not payload.data.get("edited_timestamp"):
            return  # an embed / link preview resolving: the person changed nothing
        if message.id not in self._delivered:
            return  # not a message to Steward (or from before this session)
        self._deliver(
            Retracted(
                channel=self.name,
                conversation=str(payload.channel_id),
                user=str(author.id),
                message_id=str(message.id),
                kind="edited",
                sent_at=discord.utils.snowflake_time(message.id).timestamp(),
                space=None if payload.guild_id is None else str(payload.guild_id),
            )
        )

    def _on_delete(self, client: _Gateway, payload: discord.RawMessageDeleteEvent) -> None:
        """A deletion of a message Steward took as input → `Retracted` ("deleted"); the
        author comes from discord.py's cache when it has the message, else from ours."""
        self.health.heard()
        known = self._delivered.pop(payload.message_id, None)
        cached = payload.cached_message
        me = client.user
        if known is None and cached is not None and me is not None:
            author = cached.author
            if not author.bot and author.id != me.id and cached.webhook_id is None:
                known = (str(author.id), None if cached.guild is None else str(cached.guild.id))
        if known is None:
            return  # author unknown (or the bot, another bot): nothing to attribute
        user, space = known
        self._deliver(
            Retracted(
                channel=self.name,
                conversation=str(payload.channel_id),
                user=user,
                message_id=str(payload.message_id),
                kind="deleted",
                sent_at=discord.utils.snowflake_time(payload.message_id).timestamp(),
                space=space,
            )
        )

    async def _on_press(self, interaction: discord.Interaction) -> None:
        """Acknowledge at once (deferred update, type 6), then dispatch in the background:
        Discord shows "interaction failed" if the answer takes more than 3 seconds."""
        self.health.heard()
        data: dict[str, Any] = dict(interaction.data or {})
        custom_id = data.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id or interaction.user.bot:
            return
        try:
            await interaction.response.defer()
        except Exception as exc:
            # The press still happened; an approver's decision must not be lost because
            # the acknowledgement was late or refused.
            if delivery_error("interaction ack", exc) is None:
                raise
            log.warning("adapter.ack_failed", channel=self.name, error=str(exc))
        conversation = str(interaction.channel_id)
        user = str(interaction.user.id)
        message_id = str(interaction.message.id) if interaction.message else ""
        self._hold(self._presses, (conversation, user), interaction, message_id)
        self._deliver(
            ButtonPress(
                channel=self.name,
                conversation=conversation,
                user=user,
                value=custom_id,
                message_id=message_id,
                user_name=interaction.user.display_name,
                space=None if interaction.guild_id is None else str(interaction.guild_id),
            )
        )

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
        self._deliver(
            Message(
                channel=self.name,
                conversation=conversation,
                user=str(interaction.user.id),
                text=text,
                id=str(interaction.id),
                thread=conversation if _is_thread(interaction.channel) else None,
                user_name=interaction.user.display_name,
                space=None if interaction.guild_id is None else str(interaction.guild_id),
                direct=interaction.guild_id is None,
            )
        )

    # ------------------------------------------------------------------ outbound

    @property
    def _http(self) -> discord.http.HTTPClient:
        client = self._client
        if client is None or client.is_closed():
            raise DeliveryError("the Discord channel is not running", transient=False)
        return client.http

    async def _post(
        self, conversation: str, thread: str | None, payload: dict[str, Any]
    ) -> MessageRef:
        target = thread or conversation
        cid = _snowflake(target, "channel")
        data = await _guard(
            f"POST /channels/{target}/messages",
            self._http.send_message(cid, params=_params(payload)),
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
        value). The first send without buttons after a slash command answers it."""
        text = with_attachments(text, attachments)
        if buttons:
            return await self._post(conversation, thread, message_payload(text, buttons))
        held = self._fresh(self._commands.get(conversation))
        if held is not None:
            try:
                sent = await held.interaction.followup.send(
                    text, wait=True, allowed_mentions=discord.AllowedMentions.none()
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
        return await self._post(conversation, thread, message_payload(text))

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
