"""The cluster as it is deployed: two gateways and three workers (`steward run --role
gateway|worker`), each a real process with its own data dir, against the real NATS
(JetStream) and PostgreSQL, the scripted model, and the wire fakes of Slack in HTTP mode
(a webhook platform: both gateways receive) and Telegram with long polling (a socket
platform: one gateway at a time polls).

One cluster is shared by these five checks, in order, because starting five processes is
most of the cost; each check uses conversations of its own, and every failure is
collected and reported with each process's last log lines:

(a) 200 conversations (100 on Slack, spread over both gateways, 100 on Telegram) are
    each answered exactly once, and the model is asked once for each;
(b) a worker killed with SIGKILL while it runs tasks: every conversation of the load gets
    exactly one answer, or, for a task the dead worker had started, exactly one "run it
    again?" question (asked by another worker once JetStream redelivers the event);
(c) the gateway holding Telegram killed with SIGKILL under load: Slack's deliveries that
    failed are retried on the other gateway (as Slack retries), the restarted gateway (or
    the other one) polls Telegram again, and every conversation is answered once;
(d) an approval pressed through the gateway that did not post it resolves the task;
(e) PostgreSQL out of reach of every process for a while (a TCP proxy in front of it is
    cut, the server itself stays up for the other tests): what arrives meanwhile is
    answered, once, when it is back.

Apart, on a cluster of its own (NATS cut for its gateway alone): a webhook event the
gateway cannot store is refused, not answered 200, so the platform's retry carries it
even across the gateway's SIGKILL. And the compose file of docs/cluster.md: it parses,
and every STEWARD_* variable it sets is a setting Steward accepts.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import yaml

from config.settings import load_settings
from core.snapshots import store_root
from tests.cluster_harness import (
    NEEDS_APPROVAL,
    Chats,
    Cluster,
    EchoModel,
    Node,
    SlackTap,
    TcpProxy,
    threaded,
    wait_until,
)
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM, _content_text
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docs" / "cluster-compose.yml"
#: What the question about a task cut off by a dead worker says (core/interrupted.py).
ASKED = "restarted while working on"


@dataclass
class Run:
    """What every check needs: the cluster, the platforms, the model."""

    cluster: Cluster
    chats: Chats
    model: EchoModel
    llm: ScriptedLLM
    taps: list[SlackTap]
    postgres: TcpProxy


@dataclass(frozen=True)
class Conv:
    """One conversation of a load: its platform, number and the one message sent."""

    platform: str
    n: int
    text: str


def _said(run: Run) -> tuple[dict[str, list[str]], dict[int, list[str]]]:
    return run.chats.slack_posts(), run.chats.telegram_posts()


def _posts(
    run: Run, conv: Conv, said: tuple[dict[str, list[str]], dict[int, list[str]]]
) -> list[str]:
    if conv.platform == "slack":
        return said[0].get(Chats.slack_channel(conv.n), [])
    return said[1].get(Chats.telegram_chat(conv.n), [])


def _answers(posts: list[str], conv: Conv) -> int:
    return sum(1 for p in posts if f"re: {conv.text}" in p)


def _asked(posts: list[str]) -> int:
    return sum(1 for p in posts if ASKED in p)


def _model_asked(llm: ScriptedLLM, text: str) -> int:
    """Model requests for the task whose request is `text` (its last user message)."""
    count = 0
    for request in list(llm.requests):
        users = [m for m in request.get("messages", []) if m.get("role") == "user"]
        if users and _content_text(users[-1].get("content")) == text:
            count += 1
    return count


def _send(run: Run, convs: list[Conv], gateways: list[Node]) -> list[Conv]:
    """Send each conversation's message: Slack alternately through `gateways` (a load
    balancer's round robin), Telegram into the fake's update queue. Returns the Slack
    ones a gateway did not take (not reachable, or not a 200): Slack would retry them."""
    failed = []
    slack = [c for c in convs if c.platform == "slack"]
    for i, conv in enumerate(slack):
        status, _body = run.chats.send_slack(gateways[i % len(gateways)].url, conv.n, conv.text)
        if status != 200:
            failed.append(conv)
    for conv in convs:
        if conv.platform == "telegram":
            run.chats.send_telegram(conv.n, conv.text)
    return failed


def _load(start: int, count: int, tag: str) -> list[Conv]:
    """`count` conversations on each platform, numbered from `start`."""
    return [
        Conv(platform, n, f"{tag} {platform} {n}")
        for n in range(start, start + count)
        for platform in ("slack", "telegram")
    ]


def _settled(run: Run, convs: list[Conv], *, questions: bool = False) -> bool:
    """Every conversation has its answer (or, when allowed, the question instead)."""
    said = _said(run)
    for conv in convs:
        posts = _posts(run, conv, said)
        if not _answers(posts, conv) and not (questions and _asked(posts)):
            return False
    return True


def _wait_settled(run: Run, convs: list[Conv], what: str, limit: float, **kw: Any) -> None:
    try:
        wait_until(lambda: _settled(run, convs, **kw), what, limit, every=0.25)
    except AssertionError as exc:
        said = _said(run)
        missing = [c for c in convs if not _posts(run, c, said)]
        raise AssertionError(
            f"{exc}: {len(missing)} of {len(convs)} conversations got nothing, e.g. "
            f"{[c.text for c in missing[:5]]}"
        ) from None


def _holder(run: Run, platform: str) -> Node:
    """The gateway that last gained the socket platform's lease (and still runs)."""
    gained = [
        (node, record)
        for node, record in run.cluster.events("cluster.owner_gained")
        if record.get("platform") == platform and node.alive()
    ]
    assert gained, f"no running gateway holds {platform}"
    return max(gained, key=lambda nr: str(nr[1].get("timestamp", "")))[0]


# ── the checks ──────────────────────────────────────────────────────────────────────────
def check_200_conversations_answered_once(run: Run) -> None:
    run.model.latency = 0.05
    convs = _load(0, 100, "a")
    assert len(convs) == 200
    refused = _send(run, convs, run.cluster.gateways)
    assert not refused, f"the gateways refused {len(refused)} Slack deliveries"
    _wait_settled(run, convs, "200 conversations answered", 180)
    wait_until(lambda: run.llm.pending == 0, "nothing left queued at the model", 5)
    said = _said(run)
    wrong = [
        (c.text, _posts(run, c, said))
        for c in convs
        if len(_posts(run, c, said)) != 1 or _answers(_posts(run, c, said), c) != 1
    ]
    assert not wrong, f"{len(wrong)} conversations not answered exactly once: {wrong[:5]}"
    twice = [c.text for c in convs if _model_asked(run.llm, c.text) != 1]
    assert not twice, f"{len(twice)} requests were not run exactly once: {twice[:5]}"


def _begun_by(run: Run, worker: Node, texts: set[str]) -> int:
    """Journal rows still "started" by `worker` for these requests (the table the
    "run it again?" questions are asked from)."""
    import psycopg

    [wid] = {r["worker"] for r in worker.events("cluster.task_claimed")}
    with psycopg.connect(run.cluster.database_url, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT record->>'request' FROM events WHERE worker_id = %s AND state = 'started'",
            (wid,),
        ).fetchall()
    return sum(1 for (request,) in rows if request in texts)


def check_worker_killed_mid_load(run: Run) -> None:
    run.model.latency = 4.0  # every task is in flight when the worker dies
    workers = run.cluster.workers
    before = {w.name: len(w.events("cluster.task_claimed")) for w in workers}
    convs = _load(100, 20, "b")
    assert not _send(run, convs, run.cluster.gateways)
    wait_until(
        lambda: sum(_model_asked(run.llm, c.text) for c in convs) >= len(convs),
        "every task of the load to reach the model",
        60,
    )
    claimed = {w.name: len(w.events("cluster.task_claimed")) - before[w.name] for w in workers}
    victim = max(workers, key=lambda w: claimed[w.name])
    victim.kill9()
    # What the dead worker left begun is the journal's word, read before any redelivery
    # (ack_wait, 6 s) turns a row into a question: its log, read by a thread, can lack a
    # line of the last instant, and a task it logged as ended may not be so in the table.
    started = _begun_by(run, victim, {c.text for c in convs})
    assert started > 0, f"no worker had a task of the load in flight: {claimed}"
    run.model.latency = 0.05
    # JetStream redelivers the dead worker's events after ack_wait (cluster_ack_wait).
    _wait_settled(run, convs, "every conversation answered or asked again", 120, questions=True)
    said = _said(run)
    bad = []
    for conv in convs:
        posts = _posts(run, conv, said)
        if _answers(posts, conv) > 1 or _asked(posts) > 1:
            bad.append((conv.text, posts))
    assert not bad, f"answered or asked more than once: {bad[:5]}"

    def asked_logged() -> list[dict[str, Any]]:
        return [r for _n, r in run.cluster.events("cluster.task_interrupted") if r.get("by")]

    # A question's log line trails its post (each process's stderr is read by a thread).
    wait_until(asked_logged, "the dead worker's tasks asked about again (log)", 15)
    asked = asked_logged()
    assert {r["by"] for r in asked} == {victim.name}, asked
    n_asked = sum(1 for c in convs if _asked(_posts(run, c, said)))
    assert n_asked <= started, f"{n_asked} questions for {started} tasks the dead worker had"
    assert n_asked >= 1
    victim.restart()


def check_gateway_killed_mid_load(run: Run) -> None:
    run.model.latency = 0.5
    victim = _holder(run, "telegram")
    other = next(g for g in run.cluster.gateways if g is not victim)
    convs = _load(200, 30, "c")
    first, second = convs[:30], convs[30:]
    assert not _send(run, first, run.cluster.gateways)
    victim.kill9()
    # Slack's retry of what the dead gateway did not take goes to the other one.
    retry = _send(run, second, run.cluster.gateways)
    assert retry, "no delivery went to the dead gateway"
    assert not _send(run, retry, [other]), "the other gateway refused Slack's retries"
    victim.restart()
    _wait_settled(run, convs, "every conversation answered after the gateway died", 150)
    said = _said(run)
    twice = [
        (c.text, _posts(run, c, said)) for c in convs if _answers(_posts(run, c, said), c) != 1
    ]
    assert not twice, f"answered more than once: {twice[:5]}"
    assert _holder(run, "telegram").alive()


def check_approval_through_the_other_gateway(run: Run) -> None:
    run.model.latency = 0.05
    n, name = 900, "approved"
    channel = Chats.slack_channel(n)
    status, _ = run.chats.send_slack(run.cluster.gateways[0].url, n, f"{NEEDS_APPROVAL} {name}")
    assert status == 200

    def approval() -> tuple[str, str] | None:
        def find(fake: FakeSlack) -> tuple[str, str] | None:
            for ts in fake.posted:
                message = fake.messages[ts]
                if message.get("channel") != channel:
                    continue
                for block in message.get("blocks", []):
                    for element in (
                        block.get("elements", []) if block.get("type") == "actions" else []
                    ):
                        if element.get("text", {}).get("text") == "Approve once":
                            return ts, str(element["value"])
            return None

        return run.chats.slack.read(find)

    ts, value = wait_until(approval, "the approval's buttons", 60)
    sender = [g for g, tap in zip(run.cluster.gateways, run.taps, strict=True) if ts in tap.posted]
    assert len(sender) == 1, "not one gateway posted the approval"
    through = next(g for g in run.cluster.gateways if g is not sender[0])
    press = run.chats.slack.call(run.chats.slack.fake.block_actions, ts, value, f"U{n:06d}")
    status, body = run.chats.post_slack(through.url, press)
    assert status == 200, body
    wait_until(
        lambda: any(f"ran {name}" in p for p in run.chats.slack_posts().get(channel, [])),
        "the approved task's answer",
        60,
    )
    assert (run.cluster.root / f"{name}.txt").read_text().strip() == name


def check_postgres_away_for_a_while(run: Run) -> None:
    run.model.latency = 0.05
    convs = _load(400, 10, "e")
    run.chats.slack.run(run.postgres.cut())
    try:
        assert not _send(run, convs, run.cluster.gateways)
        wait_until(
            lambda: run.cluster.events("cluster.store_unavailable"),
            "a worker finding PostgreSQL gone",
            30,
        )
        time.sleep(3)
    finally:
        run.chats.slack.run(run.postgres.restore())
    _wait_settled(run, convs, "every conversation answered once PostgreSQL was back", 90)
    said = _said(run)
    posts = {c.text: _posts(run, c, said) for c in convs}
    wrong = [(c.text, posts[c.text]) for c in convs if _answers(posts[c.text], c) != 1]
    assert not wrong, f"not answered exactly once: {wrong[:5]}"
    # While it waited, its person heard so: once, whichever workers got the event meanwhile.
    notes = [sum("store can't be reached" in p for p in posts[c.text]) for c in convs]
    assert max(notes) == 1 and sum(notes) >= 1, notes
    extra = [p for c, n in zip(convs, notes, strict=True) if len(p := posts[c.text]) != 1 + n]
    assert not extra, f"posted more than the answer and the note: {extra[:5]}"


CHECKS: list[Callable[[Run], None]] = [
    check_200_conversations_answered_once,
    check_worker_killed_mid_load,
    check_gateway_killed_mid_load,
    check_approval_through_the_other_gateway,
    check_postgres_away_for_a_while,
]


@pytest.fixture
def run(
    tmp_path: Path, llm_thread: ScriptedLLM, nats_url: str, postgres_url: str, cluster_prefix: str
) -> Iterator[Run]:
    model = EchoModel()
    llm_thread.responder = model
    with threaded(FakeSlack()) as slack, threaded(FakeTelegram()) as telegram:
        taps = [slack.run(SlackTap(slack.fake.base_url).start()) for _ in range(2)]
        db = urlsplit(postgres_url)
        postgres = slack.run(TcpProxy(db.hostname or "127.0.0.1", db.port or 5432).start())
        userinfo = db.netloc.rpartition("@")[0]
        host = f"127.0.0.1:{postgres.listen_port}"
        netloc = f"{userinfo}@{host}" if userinfo else host
        via_proxy = urlunsplit((db.scheme, netloc, db.path, db.query, ""))
        chats = Chats(slack, telegram)
        base = {
            **make_env(
                tmp_path,
                llm_thread,
                llm_workers=0,
                delivery_retries=8,
                delivery_backoff=0.5,
                delivery_backoff_max=4,
                # A killed worker's events go to another after 6 s, not the default 30.
                cluster_ack_wait=6,
            ),
            **chats.env(),
        }
        cluster = Cluster(
            tmp_path / "cluster",
            base,
            cluster_url=nats_url,
            database_url=via_proxy,
            name=cluster_prefix,
        )
        for gateway, tap in zip(cluster.gateways, taps, strict=True):
            gateway.env["STEWARD_SLACK_API_URL"] = tap.url
        try:
            with cluster:
                yield Run(cluster, chats, model, llm_thread, taps, postgres)
        finally:
            for tap in taps:
                slack.run(tap.stop())
            slack.run(postgres.stop())


def test_two_gateways_and_three_workers_under_load_and_faults(run: Run) -> None:
    failures = []
    for check in CHECKS:
        try:
            check(run)
        except AssertionError as exc:
            failures.append(f"{check.__name__}: {exc}")
    assert not failures, "\n".join(failures) + "\n" + run.cluster.tails()


# ── the compose file ────────────────────────────────────────────────────────────────────
_SUBST = re.compile(r"\$\{([A-Z0-9_]+)(?::?[-?])?([^}]*)\}")


def _value(raw: Any) -> str:
    """A compose value with its ${VAR:-default} / ${VAR:?message} substituted as compose
    would with nothing set (a required one gets a stand-in)."""
    return _SUBST.sub(lambda m: m.group(2) if "?" not in m.group(0) else "stand-in", str(raw))


def test_the_compose_file_runs_each_role_with_real_settings(tmp_path: Path) -> None:
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    services = compose["services"]
    roles = {
        name: s.get("command", [])[-1]
        for name, s in services.items()
        if "steward" in s.get("command", [])
    }
    assert sorted(roles.values()) == ["gateway", "gateway", "worker", "worker", "worker"]
    assert {"nats", "postgres"} <= set(services)
    assert "-js" in services["nats"]["command"]
    for name, role in roles.items():
        env = {k: _value(v) for k, v in services[name]["environment"].items()}
        steward = {k: v for k, v in env.items() if k.startswith("STEWARD_")}
        # Every STEWARD_* variable is a setting, with a value Steward accepts.
        settings = load_settings(env=steward, cwd=tmp_path)
        assert settings.cluster_url.startswith("nats://nats:")
        assert (
            settings.database_url.startswith("postgresql://")
            and "@postgres:" in settings.database_url
        )
        assert settings.worker_id == name
        others = set(env) - set(steward)
        assert others <= {"ANTHROPIC_API_KEY"}, others
        volumes = services[name].get("volumes", [])
        if role == "worker":
            assert "workspace:/srv/steward" in volumes
            assert settings.workspace == Path("/srv/steward/workspace")
            # The undo store every worker must share lands on that same volume.
            store = store_root(settings, settings.workspace, settings.data_dir)
            assert store.is_relative_to("/srv/steward") and not store.is_relative_to(
                settings.workspace
            )
            assert settings.model and settings.sandbox == "required"
        else:
            assert settings.host == "0.0.0.0" and settings.web_password
    data = [v.split(":")[0] for s in roles for v in services[s]["volumes"] if v.endswith(":/data")]
    assert len(set(data)) == len(roles), "each process needs a data dir of its own"


# ── a webhook the gateway could not store ─────────────────────────────────────────────
def test_a_webhook_event_the_gateway_cannot_store_is_refused_and_its_retry_answered(
    tmp_path: Path, llm_thread: ScriptedLLM, nats_url: str, postgres_url: str, cluster_prefix: str
) -> None:
    """NATS out of the gateway's reach: a Slack event it cannot store is not answered 200
    (Slack would not send it again, and a gateway dying now would lose it) but refused,
    so Slack retries. The gateway is then killed with SIGKILL, NATS comes back, and the
    retry through the restarted gateway is answered, once."""
    llm_thread.responder = EchoModel()
    nats = urlsplit(nats_url)
    with threaded(FakeSlack()) as slack, threaded(FakeTelegram()) as telegram:
        chats = Chats(slack, telegram)
        proxy = slack.run(TcpProxy(nats.hostname or "127.0.0.1", nats.port or 4222).start())
        env = {
            **make_env(tmp_path, llm_thread, llm_workers=0),
            **{k: v for k, v in chats.env().items() if "TELEGRAM" not in k},
        }
        cluster = Cluster(
            tmp_path / "cluster",
            env,
            cluster_url=nats_url,
            database_url=postgres_url,
            name=cluster_prefix,
            gateways=1,
            workers=1,
        )
        gateway = cluster.gateways[0]
        # Only the gateway reaches NATS through the proxy: NATS goes away for it alone.
        gateway.env["STEWARD_CLUSTER_URL"] = f"nats://127.0.0.1:{proxy.listen_port}"
        try:
            with cluster:
                slack.run(proxy.cut())
                event = chats.slack_event(1, "taken while NATS was away")
                status, _ = chats.post_slack(gateway.url, event)
                assert status >= 500, f"answered {status} for an event it could not store"
                # Not silence: the person hears that the message waits (once).
                wait_until(
                    lambda: any(
                        "can't be reached" in p
                        for p in chats.slack_posts().get(Chats.slack_channel(1), [])
                    ),
                    "the note that the message waits",
                    15,
                )
                gateway.kill9()
                slack.run(proxy.restore())
                gateway.restart()
                status, _ = chats.post_slack(gateway.url, event)  # Slack's retry
                assert status == 200

                def replies() -> list[str]:
                    return [p for p in chats.answers(1, "slack") if "can't be reached" not in p]

                wait_until(replies, "the answer", 30)
                time.sleep(1)
                assert replies() == ["re: taken while NATS was away"]
                notes = [p for p in chats.answers(1, "slack") if "can't be reached" in p]
                assert len(notes) == 1, notes
        finally:
            slack.run(proxy.stop())
