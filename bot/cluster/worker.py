"""`steward run --role worker`: today's App (agent, tools, memory, approvals), fed from
JetStream instead of its own adapters.

Each configured platform (and the web chat) is a `RemoteChannel` wrapped in the usual
Outbox; the worker pulls events from the shared durable consumer and hands each to
the dispatcher exactly as an adapter would. What the cluster adds around that:

- **Exactly once.** A message is claimed in the store's journal (`claim_event`) before
  it runs: "new" runs; "done" (a redelivery of a finished task) is dropped; "started"
  (a worker began it and is gone: killed -9, its lease released by PostgreSQL) is not
  run again silently: its person is asked "Run it again?", as after a crash in one
  process (core/interrupted.py).
- **Acks held until the task ends.** The event is acked only when its task is over
  (answer sent, failed or cancelled); meanwhile `in_progress` every HEARTBEAT_EVERY
  seconds keeps JetStream from giving it to another worker. A worker that dies stops
  saying so, and after ack_wait the event goes to another.
- **One task per conversation across the cluster**: the store's conversation lease. A
  worker that cannot take it hands a copy to the worker holding it (`<cluster>.conv`),
  which queues it behind the running task ("Queued: …", in order, as in one process),
  and keeps the event itself (heartbeating) until the lease is free; then the journal
  says whether the copy ran ("done"), its worker died ("started") or nobody took it.
- **Presses and cancels reach the worker that waits.** An approval waits in the
  memory of the worker running its task; a worker receiving a press it has no waiter
  for asks the others (`<cluster>.press`), and handles it itself when no one answers
  "mine" within PRESS_ASK seconds: a question whose worker is gone is first taken over
  from the shared store (bot/cluster/handover.py). `/suggestion VALUE`, the press
  typed where a platform has no buttons, goes the same way. Cancel likewise
  (`<cluster>.cancel`). What a dead worker left open that nobody presses is closed by
  every worker's sweep, once (bot/cluster/sweep.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import signal
from collections.abc import Callable
from typing import Any

import structlog

from bot.cluster import codec
from bot.cluster.activity import feed_dashboards
from bot.cluster.gateway import process_id
from bot.cluster.handover import Handover, Taken, typed_value
from bot.cluster.nats import (
    ACK_WAIT,
    HEARTBEAT_EVERY,
    Names,
    check_role_settings,
    connect,
    ensure_streams,
    names_for,
)
from bot.cluster.remote import CURRENT, OutboundKeys, RemoteChannel
from bot.cluster.spend import share_usage
from bot.cluster.sweep import QuestionSweep
from bot.cluster.timers import TimersLeader
from config.settings import ConfigError, Settings
from core.approvals import ACTIONS
from core.clock import Clock
from core.events import ButtonPress, Cancel, Channel, Inbound, Message
from core.interrupted import DROP, RERUN, question
from core.suggestions import answer_button

log = structlog.get_logger("steward.cluster")

#: How long a worker waits for another to say "mine" about a press or a cancel.
PRESS_ASK = 0.5
#: A conversation busy on another worker: the event comes back after this long.
LEASE_RETRY = 1.0
#: PostgreSQL unreachable: the event comes back after this long.
STORE_RETRY = 2.0
#: What a person hears when their message waits for PostgreSQL.
STORE_NOTE = (
    "Steward's shared store can't be reached right now, so your message waits. It will be "
    "answered once the store is back; no need to send it again."
)
#: Events one worker handles at once when the caller does not say (`worker_tasks`
#: decides for `steward run --role worker`).
MAX_IN_FLIGHT = 64
#: What a "Run it again?" question says about tool calls: the worker that ran the task
#: kept its own record of them, and it is gone.
UNKNOWN_TOOLS = [
    {
        "name": "unknown",
        "summary": "(the worker running it stopped; which calls ran is not known here)",
    }
]


def build_remotes(settings: Settings, nc: Any, names: Names) -> list[RemoteChannel]:
    """The web chat and every configured platform, with the real adapter's capabilities
    and Markdown dialect (the adapter is built, never started: some platforms' limits
    depend on their settings)."""
    from adapters.web import WebChannel
    from bot.channels import adapter_class, build_adapter, configured_platforms

    remotes = [RemoteChannel("web", WebChannel.capabilities, nc=nc, names=names)]
    for spec in configured_platforms(settings):
        problems = spec.problems(spec.config(settings))
        if problems:
            raise ConfigError(" ".join(problems))
        try:
            template: Any = build_adapter(spec, settings)
        except ValueError as exc:
            raise ConfigError(f"{spec.name}: {exc}") from exc
        except Exception:  # an SDK wanting more at construction: the class's own values
            template = adapter_class(spec)
        remotes.append(
            RemoteChannel(
                spec.name,
                template.capabilities,
                nc=nc,
                names=names,
                to_dialect=getattr(template, "to_dialect", None),
            )
        )
    return remotes


class Worker:
    """The consume loop and the cluster's rules around the App's dispatcher."""

    def __init__(
        self,
        app: Any,
        store: Any,
        nc: Any,
        js: Any,
        names: Names,
        worker_id: str,
        channels: dict[str, Channel],
        remotes: dict[str, RemoteChannel],
        *,
        heartbeat: float = HEARTBEAT_EVERY,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.app = app
        self.store = store
        self.nc = nc
        self.js = js
        self.names = names
        self.id = worker_id
        self.channels = channels
        self.remotes = remotes
        self.heartbeat = heartbeat
        self._slots = asyncio.Semaphore(max_in_flight)
        #: Events whose task runs here, by key, with every delivery of each (acked together).
        self._running: dict[str, list[Any]] = {}
        #: Conversation leases held here, with how many of this worker's events use each.
        self._leases: dict[str, int] = {}
        self._lease_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._subs: list[Any] = []
        self._loop: asyncio.Task[None] | None = None
        self.stopping = False
        self.handled = 0
        #: Who runs the schedules and goals (bot/cluster/timers.py), set by serve_worker.
        self.timers: Any = None
        #: Takes over the questions of dead workers (bot/cluster/handover.py).
        self.handover: Handover | None = None
        #: Closes the questions dead workers left that nobody presses (bot/cluster/sweep.py).
        self.sweep: QuestionSweep | None = None

    @property
    def dispatcher(self) -> Any:
        return self.app.dispatcher

    async def start(self) -> None:
        self._subs.append(await self.nc.subscribe(self.names.press, cb=self._on_press_ask))
        self._subs.append(await self.nc.subscribe(self.names.cancel, cb=self._on_cancel_ask))
        self._subs.append(await self.nc.subscribe(self.names.conv, cb=self._on_conv_ask))
        sub = await self.js.pull_subscribe_bind(
            durable=self.names.consumer, stream=self.names.stream
        )
        self._subs.append(sub)
        self._loop = asyncio.create_task(self._consume(sub), name="cluster:consume")

    async def stop(self) -> None:
        """Stop taking events. Tasks still running are cut off by the App's stop; their
        events stay unacked (the journal says "started"), so another worker asks their
        person "Run it again?" once ack_wait has passed."""
        self.stopping = True
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def drain(self) -> None:
        """After the App stopped: the handlers still waiting end (nothing acked)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ── the consume loop ────────────────────────────────────────────────────
    async def _consume(self, sub: Any) -> None:
        from nats.errors import Error as NatsError
        from nats.errors import TimeoutError as NatsTimeout

        while not self.stopping:
            await self._slots.acquire()
            try:
                msgs = await sub.fetch(1, timeout=1.0)
            except (NatsTimeout, TimeoutError):
                self._slots.release()
                continue
            except NatsError as exc:  # disconnected: the client reconnects by itself
                self._slots.release()
                log.warning("cluster.fetch_failed", error=str(exc)[:200])
                await asyncio.sleep(1.0)
                continue
            except BaseException:
                self._slots.release()
                raise
            if not msgs:
                self._slots.release()
                continue
            for n, msg in enumerate(msgs):
                if n:  # fetch(1) gives one; a larger batch would need a slot each
                    await self._slots.acquire()
                task = asyncio.create_task(self._handle(msg), name="cluster:event")
                self._tasks.add(task)
                task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _handle(self, msg: Any) -> None:
        try:
            event, key, origin = codec.decode_event(msg.data)
        except codec.CodecError as exc:
            log.error("cluster.bad_event", error=str(exc)[:200])
            await _quietly(msg.term())
            return
        channel = self.channels.get(event.channel)
        if channel is None:
            # This worker was not configured for the platform; another may be.
            log.warning("cluster.unknown_channel", channel=event.channel, key=key)
            await _quietly(msg.nak(delay=5))
            return
        remote = self.remotes.get(event.channel)
        if remote is not None:
            remote.learn_origin(event.conversation, origin)
        beat = asyncio.create_task(self._beat(msg), name="cluster:heartbeat")
        try:
            if isinstance(event, Message):
                if await self._typed_cancel(event, key, origin, channel) or (
                    await self._typed_press(event, key, origin, channel)
                ):
                    await _quietly(msg.ack())
                else:
                    await self._message(event, key, channel, msg, origin)
            elif isinstance(event, ButtonPress):
                await self._press(event, key, origin, channel)
                await _quietly(msg.ack())
            elif isinstance(event, Cancel):
                await self._cancel(event, key, origin, channel)
                await _quietly(msg.ack())
            else:
                await self.dispatcher.handle(event, channel)
                await _quietly(msg.ack())
            self.handled += 1
        except asyncio.CancelledError:
            raise  # stopping: left unacked, redelivered after ack_wait
        except Exception:
            log.exception("cluster.event_failed", key=key)
            await _quietly(msg.ack())  # a bug must not loop the event through every worker
        finally:
            beat.cancel()

    async def _beat(self, msg: Any) -> None:
        """Tell JetStream the event is still being worked on (see the module docstring)."""
        while True:
            await asyncio.sleep(self.heartbeat)
            await _quietly(msg.in_progress())

    # ── messages ────────────────────────────────────────────────────────────
    async def _message(
        self, event: Message, key: str, channel: Channel, msg: Any, origin: str = ""
    ) -> None:
        """Run a message exactly once (see the module docstring). `msg` is None for a
        copy forwarded by another worker (`_forward`): that worker keeps the JetStream
        message, and acks it once it finds the task done."""
        if key in self._running:  # JetStream gave it again while it runs here: acked with it
            if msg is not None:
                self._running[key].append(msg)
            return
        text = event.text.strip()
        task = bool(text) and not text.startswith("/")
        conversation = f"{channel.name}:{event.conversation}"
        try:
            leased = not task or await self._lease(conversation)
        except Exception as exc:  # PostgreSQL unreachable: the event comes back later
            await self._store_down(event, key, channel, msg, exc)
            return
        if not leased:
            if msg is None:
                return  # the lease moved on meanwhile: the worker holding the event runs it
            leased = await self._wait_for_lease(event, key, origin, conversation)
            if not leased:
                log.info("cluster.lease_busy", key=key, conversation=conversation)
                await _nak(msg, LEASE_RETRY)
                return
        held = [] if msg is None else [msg]
        try:
            record = {
                "channel": event.channel,
                "conversation": event.conversation,
                "user": event.user,
                "request": text[:4000],
                "thread": event.thread,
                "direct": event.direct,
                "worker": self.id,
            }
            try:
                state, stored = await self.store.claim_event(key, record)
            except Exception as exc:
                await self._store_down(event, key, channel, msg, exc)
                return
            if state == "done":
                log.info("cluster.duplicate", key=key, state=state)
                await _ack(msg)
                return
            if state == "started":
                if task:
                    await self._ask_again(key, stored or record, channel)
                else:
                    log.info("cluster.command_not_repeated", key=key)
                await self.store.finish_event(key, "asked" if task else "dropped")
                await _ack(msg)
                return
            self._running[key] = held
            log.info("cluster.task_claimed", key=key, worker=self.id, forwarded=msg is None)
            token = CURRENT.set(OutboundKeys(key))
            busy = self.app.conversations.is_busy(conversation)
            try:
                await self.dispatcher.handle(event, channel)
                if task or (not busy and self.app.conversations.is_busy(conversation)):
                    # Its task (or one a command started) ends before the event is acked.
                    await self.app.conversations.wait_idle(conversation)
            except Exception:
                await self.store.finish_event(key, "failed")  # never run it again
                raise
            finally:
                CURRENT.reset(token)
            if self._cut_off():
                return  # unacked and "started": asked about on another worker
            await self.store.finish_event(key, "done")
            for delivery in held:
                await _ack(delivery)
            log.info("cluster.task_finished", key=key)
        finally:
            self._running.pop(key, None)
            if task:
                await self._release(conversation)

    async def _wait_for_lease(
        self, event: Message, key: str, origin: str, conversation: str
    ) -> bool:
        """The conversation's task runs on another worker. Hand that worker a copy (it
        queues it behind its task, says "Queued" and keeps the order, as one process
        does), and keep this event, heartbeating, until the lease is free: then the
        journal says whether the copy ran ("done": ack), or its worker died ("started":
        ask), or nobody took it ("new": run it here)."""
        if await self._ask(self.names.conv, event, key, origin):
            log.info("cluster.forwarded", key=key, conversation=conversation)
        while not self.stopping:
            await asyncio.sleep(LEASE_RETRY)
            try:
                if await self._lease(conversation):
                    return True
            except Exception as exc:
                log.warning("cluster.store_unavailable", key=key, error=str(exc)[:200])
        return False

    def _cut_off(self) -> bool:
        return self.stopping or bool(getattr(self.app.journal, "stopping", False))

    async def _store_down(
        self, event: Message, key: str, channel: Channel, msg: Any, exc: BaseException
    ) -> None:
        """PostgreSQL unreachable: the event goes back to JetStream and comes again, and
        its person hears once that it waits. The note's outbound key is the event's, so
        whichever workers get the event meanwhile, the gateways post it once."""
        log.warning("cluster.store_unavailable", key=key, error=str(exc)[:200])
        await _nak(msg, STORE_RETRY)
        if msg is None or not event.text.strip() or event.text.strip().startswith("/"):
            return
        token = CURRENT.set(OutboundKeys(key + ":waits"))
        try:
            await channel.send(event.conversation, STORE_NOTE, thread=event.thread)
        except Exception as note_exc:  # kept by the Outbox, or the platform is away too
            log.warning("cluster.store_note_failed", key=key, error=str(note_exc)[:200])
        finally:
            CURRENT.reset(token)

    async def _lease(self, conversation: str) -> bool:
        async with self._lease_lock:
            if conversation in self._leases:  # queued here behind its running task
                self._leases[conversation] += 1
                return True
            if not await self.store.try_lease(conversation):
                return False
            self._leases[conversation] = 1
            return True

    async def _release(self, conversation: str) -> None:
        async with self._lease_lock:
            count = self._leases.get(conversation, 0) - 1
            if count > 0:
                self._leases[conversation] = count
                return
            self._leases.pop(conversation, None)
            try:
                await self.store.release_lease(conversation)
            except Exception:  # the session's end releases it anyway
                log.warning("cluster.lease_release_failed", exc_info=True)

    async def _ask_again(self, key: str, stored: dict[str, Any], channel: Channel) -> None:
        """A task a worker began and that worker is gone: ask its person, as one process
        does after a restart (core/interrupted.py), with the same buttons. The question
        stays open in this worker's memory; a press anywhere is routed here."""
        interrupted = self.dispatcher.interrupted
        tid = "c" + hashlib.sha256(key.encode()).hexdigest()[:15]
        conversation = str(stored.get("conversation", ""))
        thread = stored.get("thread")
        record: dict[str, Any] = {
            "id": tid,
            "channel": channel.name,
            "conversation": conversation,
            "user": str(stored.get("user", "")),
            "request": str(stored.get("request", "")),
            "thread": thread,
            "direct": bool(stored.get("direct", True)),
            "tools": UNKNOWN_TOOLS,
        }
        buttons = [
            answer_button("Run it again", f"{RERUN}:{tid}", "primary"),
            answer_button("Drop it", f"{DROP}:{tid}"),
        ]
        token = CURRENT.set(OutboundKeys(key + ":asked"))
        try:
            ref = await channel.send(conversation, question(record), thread=thread, buttons=buttons)
        finally:
            CURRENT.reset(token)
        if interrupted is not None:
            # The same open question Interrupted.recover keeps, so its `answer` decides it;
            # also in the shared store, so it outlives this worker (bot/cluster/handover.py).
            await interrupted.hold(tid, record, channel, ref)
        log.info(
            "cluster.task_interrupted",
            key=key,
            conversation=record["conversation"],
            channel=channel.name,
            by=stored.get("worker"),
        )

    # ── presses and cancels ─────────────────────────────────────────────────
    def holds(self, value: str) -> bool:
        """Whether a press of `value` is awaited in this worker's memory."""
        action, _, ident = value.partition(":")
        if action in ACTIONS:
            return bool(self.app.approvals.is_pending(ident))
        # "Run it again?" questions and offers of help: open in the memory of the worker
        # that asked (core/interrupted.py, core/suggestions.py keep them by id).
        for keeper in (self.dispatcher.interrupted, self.app.suggestions):
            if keeper is not None and keeper.is_open(ident):
                return True
        return False

    async def _press(self, event: ButtonPress, key: str, origin: str, channel: Channel) -> None:
        if not self.holds(event.value):
            if await self._ask(self.names.press, event, key, origin):
                log.info("cluster.press_routed", key=key)
                return
            # No live worker waits for it: its worker may be gone (bot/cluster/handover.py).
            taken = await self._take_question(event, channel)
            if taken is Taken.ANSWERED:
                return
            if taken is Taken.LIVE and await self._ask(self.names.press, event, key, origin):
                log.info("cluster.press_routed", key=key)
                return
        conversation = f"{channel.name}:{event.conversation}"
        busy = self.app.conversations.is_busy(conversation)
        await self.dispatcher.handle(event, channel)
        if not busy and self.app.conversations.is_busy(conversation):
            # The press started a task here ("Run it again", an accepted offer): its
            # event stays unacked until that task ends, like a message's.
            await self.app.conversations.wait_idle(conversation)

    async def _take_question(self, event: ButtonPress, channel: Channel) -> Taken:
        if self.handover is None:
            return Taken.NONE
        try:
            return await self.handover.take(event, channel)
        except Exception as exc:  # the store away: answered here as before ("no longer open")
            log.warning("cluster.question_takeover_failed", error=str(exc)[:200])
            return Taken.NONE

    async def _typed_press(self, event: Message, key: str, origin: str, channel: Channel) -> bool:
        """`/suggestion VALUE` (a press typed where a platform has no buttons) for a
        question this worker does not hold: routed as the press is (`_press`), the
        message itself going to the worker that holds it. True when it was answered
        there, or here by taking over a dead worker's question; False: run it here."""
        value = typed_value(event.text)
        if value is None or self.holds(value):
            return False
        if not await self._ask(self.names.press, event, key, origin):
            press = ButtonPress(event.channel, event.conversation, event.user, value)
            taken = await self._take_question(press, channel)
            if taken is not Taken.ANSWERED and (
                taken is not Taken.LIVE or not await self._ask(self.names.press, event, key, origin)
            ):
                return False  # held here now, or open nowhere: answered as usual
        log.info("cluster.typed_press_handled", key=key)
        with contextlib.suppress(Exception):  # the journal's row is only for the record
            await self.store.finish_event(key, "done")
        return True

    async def _typed_cancel(self, event: Message, key: str, origin: str, channel: Channel) -> bool:
        """`/cancel` typed while the conversation's task runs on another worker: that
        worker cancels it (as for a Cancel event). True when it did."""
        words = event.text.strip().lower().split()
        if words[:1] != ["/cancel"]:
            return False
        if self.app.conversations.is_busy(f"{channel.name}:{event.conversation}"):
            return False
        cancel = Cancel(event.channel, event.conversation, event.user, event.space)
        if not await self._ask(self.names.cancel, cancel, key, origin):
            return False
        log.info("cluster.cancel_routed", key=key)
        await self.store.finish_event(key, "done")
        return True

    async def _cancel(self, event: Cancel, key: str, origin: str, channel: Channel) -> None:
        busy = self.app.conversations.is_busy(f"{channel.name}:{event.conversation}")
        if not busy and await self._ask(self.names.cancel, event, key, origin):
            log.info("cluster.cancel_routed", key=key)
            return
        await self.dispatcher.handle(event, channel)

    async def _ask(self, subject: str, event: Inbound, key: str, origin: str) -> bool:
        """Whether another worker answered "mine" (and so handles the event)."""
        from nats.errors import Error as NatsError

        try:
            reply = await self.nc.request(
                subject, codec.encode_event(event, key=key, origin=origin), timeout=PRESS_ASK
            )
        except (NatsError, TimeoutError):
            return False
        return reply.data == b"mine"

    async def _on_press_ask(self, msg: Any) -> None:
        event, key, origin = _decoded(msg)
        if isinstance(event, ButtonPress):
            value: str | None = event.value
        else:  # `/suggestion VALUE` typed (`_typed_press`)
            value = typed_value(event.text) if isinstance(event, Message) else None
        if value is None or not self.holds(value):
            return
        await self._take_over(msg, event, key, origin)

    async def _on_cancel_ask(self, msg: Any) -> None:
        event, key, origin = _decoded(msg)
        if not isinstance(event, Cancel):
            return
        channel = self.channels.get(event.channel)
        if channel is None or not self.app.conversations.is_busy(
            f"{channel.name}:{event.conversation}"
        ):
            return
        await self._take_over(msg, event, key, origin)

    async def _on_conv_ask(self, msg: Any) -> None:
        """Another worker got a message of a conversation whose task runs here: take a
        copy into this conversation's queue (see `_wait_for_lease`)."""
        event, key, origin = _decoded(msg)
        if not isinstance(event, Message):
            return
        channel = self.channels.get(event.channel)
        if channel is None:
            return
        if f"{channel.name}:{event.conversation}" not in self._leases or key in self._running:
            return
        remote = self.remotes.get(event.channel)
        if remote is not None:
            remote.learn_origin(event.conversation, origin)
        await _quietly(msg.respond(b"mine"))
        log.info("cluster.took_over", key=key, kind="message")
        task = asyncio.create_task(
            self._forwarded(event, key, channel, origin), name="cluster:forwarded"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forwarded(self, event: Message, key: str, channel: Channel, origin: str) -> None:
        try:
            await self._message(event, key, channel, None, origin)
        except Exception:
            log.exception("cluster.forwarded_failed", key=key)

    async def _take_over(self, msg: Any, event: Inbound, key: str, origin: str) -> None:
        channel = self.channels.get(event.channel)
        if channel is None:
            return
        remote = self.remotes.get(event.channel)
        if remote is not None:
            remote.learn_origin(event.conversation, origin)
        await _quietly(msg.respond(b"mine"))
        log.info("cluster.took_over", key=key, kind=codec.event_kind(event))
        task = asyncio.create_task(self._handle_here(event, channel), name="cluster:routed")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle_here(self, event: Inbound, channel: Channel) -> None:
        try:
            await self.dispatcher.handle(event, channel)
        except Exception:
            log.exception("cluster.routed_failed")


def _decoded(msg: Any) -> tuple[Any, str, str]:
    """A routed event (press, cancel, message copy); a payload this build cannot read is
    logged and treated as no event (the sender handles it itself after PRESS_ASK)."""
    try:
        return codec.decode_event(msg.data)
    except codec.CodecError as exc:
        log.warning("cluster.bad_routed_event", error=str(exc)[:200])
        return None, "", ""


async def _ack(msg: Any) -> None:
    if msg is not None:
        await _quietly(msg.ack())


async def _nak(msg: Any, delay: float) -> None:
    if msg is not None:
        await _quietly(msg.nak(delay=delay))


async def _quietly(work: Any) -> None:
    """An ack, nak or reply whose failure (NATS reconnecting) changes nothing we can fix:
    JetStream redelivers what was not acked."""
    try:
        await work
    except Exception as exc:
        log.debug("cluster.reply_failed", error=str(exc)[:200])


async def open_store(settings: Settings, worker_id: str) -> Any:
    """The cluster store (memory/cluster), its errors as ConfigErrors naming the setting."""
    from memory.cluster.store import ClusterStore, ClusterStoreError

    try:
        return await ClusterStore.open(settings.database_url, worker_id=worker_id)
    except ClusterStoreError as exc:
        raise ConfigError(f"Cluster store: {exc}") from exc


async def open_vectors(settings: Settings, store: Any, worker_id: str) -> Any:
    """The episodes' vectors shared through PostgreSQL (memory/cluster/vectors*.py):
    embedded once in the cluster, searched there with pgvector where the server has it
    and `cluster_vectors` allows."""
    from bot.model_check import configured_embedder
    from memory.cluster.vectors import PgVectorUnavailable
    from memory.cluster.vectors_shared import SharedVectors

    embedder = await configured_embedder(settings)
    try:
        return await SharedVectors.open(
            store,
            embedder,
            settings.data_dir,
            mode=settings.cluster_vectors,
            worker_id=worker_id,
        )
    except PgVectorUnavailable as exc:
        raise ConfigError(
            f"cluster_vectors is 'pgvector' but the database cannot use it ({exc}): install "
            "the server's pgvector package (postgresql-15-pgvector) and let the role CREATE "
            "EXTENSION vector, or set STEWARD_CLUSTER_VECTORS=auto"
        ) from exc


async def open_questions(settings: Settings, worker_id: str) -> Any:
    """This worker's handle on the shared open questions (memory/cluster/questions.py)."""
    from memory.cluster.questions import QuestionStore

    try:
        return await QuestionStore.open(settings.database_url, worker_id=worker_id)
    except Exception as exc:
        raise ConfigError(f"Cluster store: cannot open the questions' session ({exc})") from exc


def share_questions(app: Any, store: Any, questions: Any) -> None:
    """What a cluster shares beyond one process: every open question is recorded in the
    store (answered once, by any worker once its own is gone), and new schedules' and
    goals' ids are numbered across the cluster."""
    for keeper in (app.dispatcher.interrupted, app.suggestions, app.approvals):
        if keeper is not None:
            keeper.shared = questions
    for engine in (getattr(app, "schedules", None), getattr(app, "goals", None)):
        if engine is not None:
            engine.ids = store.allocate_id


async def start_mirror(store: Any, settings: Settings, app: Callable[[], Any]) -> Any:
    """Keep this worker's data dir and the cluster's shared documents in step
    (memory/cluster/mirror.py), started before the App so it reads the shared memory
    (rules, schedules, access …) at start. Episodes other workers wrote are indexed
    here as they arrive, once the App's index is open."""
    from bot.app import ensure_dir
    from memory.cluster.mirror import DataDirMirror

    ensure_dir(settings.data_dir, "data_dir")

    async def index(paths: list[Any]) -> None:
        running = app()
        if running is None:
            return  # the initial pull: the index is opened (and brought up to date) later
        for path in paths:
            await running._index_episode(path)

    mirror = DataDirMirror(store, settings.data_dir, on_episodes=index)
    await mirror.start()
    return mirror


async def serve_worker(
    settings: Settings,
    *,
    stop_event: asyncio.Event | None = None,
    clock: Clock | None = None,
    ack_wait: float | None = None,
    heartbeat: float | None = None,
    max_in_flight: int | None = None,
    on_ready: Callable[[Worker], None] | None = None,
) -> int:
    """Run a worker until SIGINT/SIGTERM (or `stop_event`). `on_ready`: called with the
    Worker once it takes events (tests running it in-process)."""
    from bot.app import App

    check_role_settings(settings, "worker")
    names = names_for(settings)
    worker_id = settings.worker_id.strip() or process_id()
    store = await open_store(settings, worker_id)
    nc: Any = None
    app: Any = None
    worker: Worker | None = None
    timers: TimersLeader | None = None
    sweep: QuestionSweep | None = None
    mirror: Any = None
    vectors: Any = None
    publisher: Any = None
    questions: Any = None
    try:
        nc = await connect(settings.cluster_url, name=f"steward-worker-{worker_id}")
        # `cluster_ack_wait`: how long a silent worker keeps its events; it says it is
        # alive every third of that (HEARTBEAT_EVERY of ACK_WAIT by default).
        wait = settings.cluster_ack_wait if ack_wait is None else ack_wait
        beat = wait * HEARTBEAT_EVERY / ACK_WAIT if heartbeat is None else heartbeat
        js = await ensure_streams(nc, names, ack_wait=wait, update=True)
        vectors = await open_vectors(settings, store, worker_id)
        mirror = await start_mirror(vectors.documents(store), settings, lambda: app)
        # The local index rebuilt or caught up from the table's vectors, before the App
        # opens it: a new worker embeds only what no worker embedded before.
        await vectors.prepare()
        app = App(settings, clock=clock, subcommand="worker")
        # The journal's "run it again?" is the cluster's (claim_event), asked by the
        # worker that gets the event again: not also by this one from its own folder.
        # Likewise the approvals and offers left open in the shared folders: every
        # worker's, taken over one by one when pressed (bot/cluster/handover.py).
        app.recover_left_open = False
        # With pgvector the memory index keeps no vectors: searched in PostgreSQL.
        app.vector_backend = vectors.backend
        # Schedules and goals run on one worker at a time: the one holding the timers
        # lease (bot/cluster/timers.py), not every worker as its channels come up.
        app.fire_schedules = False
        # Spend is one ledger for the cluster: the day caps and /usage see every worker's.
        await share_usage(app, store)
        questions = await open_questions(settings, worker_id)
        share_questions(app, store, questions)
        remotes = build_remotes(settings, nc, names)
        stop = stop_event or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
        failures: dict[str, BaseException] = {}
        outboxes = await app.start(remotes, failures=failures)
        if app.index is not None:
            vectors.attach(app.index)
        for name, failure in failures.items():
            log.error("channel.start_failed", channel=name, error=str(failure)[:300])
        app.warm_up()
        worker = Worker(
            app,
            store,
            nc,
            js,
            names,
            worker_id,
            {o.name: o for o in outboxes},
            {r.name: r for r in remotes},
            heartbeat=beat,
            max_in_flight=settings.worker_tasks if max_in_flight is None else max_in_flight,
        )
        worker.handover = Handover(questions, app)
        await worker.start()
        # Its tasks, live, and the controls, for the gateways' dashboards.
        publisher = await feed_dashboards(nc, names, worker_id, app, worker.handover)
        timers = TimersLeader(app, store, worker_id)
        timers.start()
        worker.timers = timers
        sweep = QuestionSweep(worker.handover)
        sweep.start()
        worker.sweep = sweep
        if on_ready is not None:
            on_ready(worker)
        log.info(
            "cluster.worker_ready",
            id=worker_id,
            channels=sorted(o.name for o in outboxes),
            cluster=names.cluster,
            consumer=names.consumer,
        )
        await stop.wait()
    finally:
        log.info("cluster.worker_stopping", id=worker_id)
        if timers is not None:
            await timers.stop()
        if sweep is not None:
            await sweep.stop()
        if worker is not None:
            await worker.stop()
        if app is not None:
            await app.stop()
        if publisher is not None:  # after the App: its last tasks' ends are published
            await publisher.stop()
        if worker is not None:
            await worker.drain()
        if mirror is not None:  # what the last tasks wrote is pushed before the end
            with contextlib.suppress(Exception):
                await asyncio.wait_for(mirror.stop(), 10)
        if nc is not None:
            with contextlib.suppress(Exception):  # its subscriptions are gone: nothing to drain
                await asyncio.wait_for(nc.close(), 5)
        if questions is not None:  # after the App: its last answers claimed their rows
            await questions.close()
        if vectors is not None:
            vectors.close()
        await store.close()
    return 0
