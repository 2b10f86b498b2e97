"""Steward learns a workflow from tasks that worked the same way: after the third run of
one request shape with one tool sequence it drafts a workflow (one model call), checks
it without any model (dry run on the recorded runs, grade), and offers it with buttons
to the person whose task completed the shape. Nothing is saved without their press."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from core.clock import SimClock
from core.events import Attachment, Button, Capabilities, Message, MessageRef
from core.model.errors import LLMError
from core.model.result import LLMResult
from core.workflows import learn
from core.workflows.draft import first_object, messages_for
from core.workflows.learn import WorkflowLearner
from core.workflows.store import WorkflowStore
from memory.episodes import Episode, ToolRecord
from memory.store import DataStore
from tests.fakes.workflows import restart_worker

START = 1_800_000_000.0
USER = "42"
PLATFORM = "telegram"
CONVERSATION = "c1"
SERVICES = ["api", "billing", "search", "mailer", "queue"]

GOOD = restart_worker()


class Chan:
    """A channel that records what was sent and edited."""

    def __init__(self, interactive: bool = True, name: str = PLATFORM) -> None:
        self.name = name
        self.capabilities = Capabilities(buttons=True, edit=True, interactive=interactive)
        self.sent: list[dict[str, Any]] = []
        self.edits: list[dict[str, Any]] = []

    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        ref = MessageRef(self.name, conversation, f"m{len(self.sent) + 1}", thread)
        self.sent.append({"ref": ref, "text": text, "buttons": list(buttons)})
        return ref

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        self.edits.append({"ref": ref, "text": text, "buttons": buttons})


def fenced(doc: dict[str, Any] | str) -> str:
    return doc if isinstance(doc, str) else "```json\n" + json.dumps(doc) + "\n```"


class Drafter:
    """The model: answers each drafting call with the next of `answers` (the last one
    again once they run out), or raises `error`; counts its calls."""

    def __init__(self, *answers: dict[str, Any] | str) -> None:
        self.answers = [fenced(a) for a in answers or (GOOD,)]
        self.error: Exception | None = None
        self.calls: list[list[dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]], tools: Any = None) -> LLMResult:
        self.calls.append(messages)
        if self.error is not None:
            raise self.error
        text = self.answers[min(len(self.calls), len(self.answers)) - 1]
        return LLMResult(text=text, tokens_in=900, tokens_out=300)


class World:
    """A learner on a data dir, and how tasks reach it."""

    def __init__(self, tmp_path: Path, drafter: Drafter | None, **kw: Any) -> None:
        self.data = tmp_path / "data"
        self.workspace = tmp_path / "ws"
        self.workspace.mkdir(exist_ok=True)
        self.clock = SimClock(START)
        self.datastore = DataStore(self.data)
        self.store = WorkflowStore(self.data, self.datastore, self.clock)
        self.drafter = drafter
        self.denied: set[str] = set()
        self.learner = self.new_learner(**kw)
        self.n = 0

    def new_learner(self, **kw: Any) -> WorkflowLearner:
        return WorkflowLearner(
            self.store,
            self.clock,
            self.data,
            drafter=self.drafter,
            allowed=lambda platform, user, tool: tool not in self.denied,
            workspace=self.workspace,
            **kw,
        )

    async def task(
        self,
        request: str,
        calls: list[tuple[str, dict[str, Any], str]],
        *,
        chan: Chan,
        user: str = USER,
        conversation: str = CONVERSATION,
        **fields: Any,
    ) -> Episode:
        self.n += 1
        episode = Episode(
            id=f"20270115-0000{self.n:02d}-abc{self.n:03d}",
            started=datetime.fromtimestamp(self.clock.now(), UTC),
            channel=chan.name,
            conversation=conversation,
            user=user,
            request=request,
            outcome=fields.pop("outcome", "success"),
            scope=f"person:{chan.name}:{user}",
            reply=fields.pop("reply", "Done."),
            tools=[
                ToolRecord(name, ok=True, args=args, result=result) for name, args, result in calls
            ],
            **fields,
        )
        msg = Message(chan.name, conversation, user, request)
        await self.learner.after_task(chan, msg, SimpleNamespace(episode=episode))
        return episode

    async def restart(self, service: str, chan: Chan, **kw: Any) -> Episode:
        return await self.task(
            f"restart the {service} worker and check its health",
            [
                ("shell", {"command": f"./svc restart {service}"}, f"restarted {service}"),
                ("shell", {"command": f"./svc health {service}"}, f"{service}: healthy"),
            ],
            chan=chan,
            **kw,
        )

    def close(self) -> None:
        self.datastore.close()


@pytest.fixture
def world(tmp_path: Path) -> Any:
    w = World(tmp_path, Drafter())
    yield w
    w.close()


def offer_id(sent: dict[str, Any]) -> str:
    return str(sent["buttons"][0].value.partition(":")[2])


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


async def test_two_runs_draft_nothing_the_third_offers_once_with_three_buttons(
    world: World,
) -> None:
    chan = Chan()
    await world.restart("api", chan)
    await world.restart("billing", chan)
    assert world.drafter is not None and world.drafter.calls == [] and chan.sent == []
    with capture_logs() as logs:
        await world.restart("search", chan)
    assert len(world.drafter.calls) == 1
    [sent] = chan.sent
    assert sent["text"] == (
        "That's the 3rd time this worked the same way. Save as workflow 'restart-worker'? "
        "It would run 2 step(s) (shell) without asking the model again for a request like: "
        "restart the search worker and check its health"
    )
    assert [(b.label, b.value.partition(":")[0]) for b in sent["buttons"]] == [
        ("Save", "wf-save"),
        ("Show", "wf-show"),
        ("No", "wf-skip"),
    ]
    pid = offer_id(sent)
    assert [b.typed for b in sent["buttons"]] == [
        f"/workflows save {pid}",
        f"/workflows show-draft {pid}",
        f"/workflows skip {pid}",
    ]
    [drafted] = events(logs, "workflows.drafted")
    assert (drafted["tokens_in"], drafted["tokens_out"]) == (900, 300)
    # The prompt showed every run: requests, each call's tool, arguments and result.
    prompt = world.drafter.calls[0][-1]["content"]
    for service in ("api", "billing", "search"):
        assert f"restart the {service} worker" in prompt
        assert f'"command": "./svc health {service}"' in prompt and f"{service}: healthy" in prompt
    # Nothing saved before the press; the offer is a record on disk.
    assert not (world.data / "workflows").exists()
    assert (world.data / "workflow-proposals" / f"{pid}.md").is_file()
    # A fourth run of the same shape is not offered again.
    await world.restart("mailer", chan)
    assert len(world.drafter.calls) == 1 and len(chan.sent) == 1


async def test_a_look_alike_request_with_other_tools_does_not_join_the_shape(
    world: World,
) -> None:
    chan = Chan()
    await world.restart("api", chan)
    await world.task(
        "restart the billing worker and check its health",
        [("shell", {"command": "./svc restart billing && ./svc health billing"}, "ok")],
        chan=chan,
    )
    await world.restart("search", chan)
    assert world.drafter is not None and world.drafter.calls == [] and chan.sent == []
    await world.restart("mailer", chan)
    assert len(world.drafter.calls) == 1 and len(chan.sent) == 1
    # The one-call run was not among the runs shown to the model.
    assert "&&" not in world.drafter.calls[0][-1]["content"]


async def test_other_people_and_other_requests_are_other_shapes(world: World) -> None:
    chan = Chan()
    await world.restart("api", chan)
    await world.restart("billing", chan, user="7")  # another person's scope
    await world.task(
        "please archive the old logs of the search box tonight",
        [
            ("shell", {"command": "./svc restart search"}, "restarted"),
            ("shell", {"command": "./svc health search"}, "healthy"),
        ],
        chan=chan,
    )
    assert world.drafter is not None and world.drafter.calls == [] and chan.sent == []


async def test_tasks_a_workflow_cannot_replay_are_not_observed(world: World) -> None:
    chan = Chan()
    calls = [("shell", {"command": "./svc restart api"}, "ok")]
    request = "restart the api worker and check its health"
    await world.task(request, calls, chan=chan, outcome="failure")
    await world.task(request, calls, chan=chan, workflow="restart-worker")
    await world.task(request, [*calls, ("delegate", {"task": "check"}, "ok")], chan=chan)
    await world.task(request, [*calls, ("wf__restart-worker", {}, "ok")], chan=chan)
    await world.task(request, [], chan=chan)
    episode = Episode(
        id="20270115-000099-fff000",
        started=datetime.fromtimestamp(START, UTC),
        channel=PLATFORM,
        conversation=CONVERSATION,
        user=USER,
        request=request,
        outcome="success",
        tools=[ToolRecord("shell", ok=False, args={"command": "x"})],
    )
    await world.learner.after_task(
        chan, Message(PLATFORM, CONVERSATION, USER, request), SimpleNamespace(episode=episode)
    )
    assert not (world.data / "workflow-learning" / "observed.jsonl").exists()


async def test_a_draft_that_does_not_reproduce_the_calls_is_not_offered(tmp_path: Path) -> None:
    wrong = json.loads(json.dumps(GOOD))
    wrong["steps"][1]["args"]["command"] = "./svc status {{inputs.service}}"
    w = World(tmp_path, Drafter(wrong))
    try:
        chan = Chan()
        with capture_logs() as logs:
            for service in SERVICES[:3]:
                await w.restart(service, chan)
        assert chan.sent == []
        [refused] = events(logs, "workflows.draft_not_offered")
        assert refused["problems"] and any("health" in p for p in refused["problems"])
        # Drafted once: a fourth run of the shape does not ask the model again.
        await w.restart("mailer", chan)
        assert w.drafter is not None and len(w.drafter.calls) == 1
        assert not (w.data / "workflow-proposals").exists()
    finally:
        w.close()


async def test_a_draft_with_a_secret_is_not_offered(tmp_path: Path) -> None:
    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    leaky = dict(GOOD, output="Restarted {{inputs.service}} with " + token)
    w = World(tmp_path, Drafter(leaky))
    try:
        chan = Chan()
        with capture_logs() as logs:
            for service in SERVICES[:3]:
                await w.restart(service, chan)
        assert chan.sent == []
        [refused] = events(logs, "workflows.draft_not_offered")
        assert any("secret" in p for p in refused["problems"])
        assert token not in json.dumps(logs)
    finally:
        w.close()


async def test_an_answer_that_is_not_a_workflow_is_logged_and_not_retried(tmp_path: Path) -> None:
    w = World(tmp_path, Drafter("I would rather not."))
    try:
        chan = Chan()
        with capture_logs() as logs:
            for service in SERVICES[:4]:
                await w.restart(service, chan)
        assert chan.sent == []
        assert len(events(logs, "workflows.draft_invalid")) == 1
        assert w.drafter is not None and len(w.drafter.calls) == 1
    finally:
        w.close()


async def test_an_invalid_document_is_logged_with_its_problems(tmp_path: Path) -> None:
    broken = dict(GOOD, steps=[{"id": "x", "kind": "teleport"}])
    w = World(tmp_path, Drafter(broken))
    try:
        chan = Chan()
        with capture_logs() as logs:
            for service in SERVICES[:3]:
                await w.restart(service, chan)
        assert chan.sent == []
        [invalid] = events(logs, "workflows.draft_invalid")
        assert any("teleport" in p for p in invalid["problems"])
    finally:
        w.close()


async def test_a_tool_the_person_may_not_use_is_not_offered(tmp_path: Path) -> None:
    w = World(tmp_path, Drafter())
    w.denied.add("shell")
    try:
        chan = Chan()
        with capture_logs() as logs:
            for service in SERVICES[:3]:
                await w.restart(service, chan)
        assert chan.sent == []
        [refused] = events(logs, "workflows.draft_not_offered")
        assert any("shell" in p for p in refused["problems"])
    finally:
        w.close()


async def test_no_model_or_a_model_error_offers_nothing_and_the_next_success_retries(
    tmp_path: Path,
) -> None:
    w = World(tmp_path, None)
    try:
        chan = Chan()
        for service in SERVICES[:3]:
            await w.restart(service, chan)
        assert chan.sent == []
        drafter = Drafter()
        drafter.error = LLMError("the model is down", kind="unavailable", retryable=True)
        w.learner.drafter = drafter
        with capture_logs() as logs:
            await w.restart("mailer", chan)
        assert len(drafter.calls) == 1 and chan.sent == []
        assert events(logs, "workflows.draft_failed")
        drafter.error = None
        await w.restart("queue", chan)
        assert len(drafter.calls) == 2
        [sent] = chan.sent
        assert sent["text"].startswith("That's the 5th time this worked the same way.")
    finally:
        w.close()


async def test_no_offer_where_nobody_can_press_nor_beside_an_open_one(world: World) -> None:
    piped = Chan(interactive=False)
    for service in SERVICES[:3]:
        await world.restart(service, piped)
    assert world.drafter is not None and world.drafter.calls == [] and piped.sent == []
    chan = Chan()
    await world.restart("mailer", chan)  # the shape's next run, where a person can press
    assert len(world.drafter.calls) == 1 and len(chan.sent) == 1
    # Another shape completed in the same conversation: the open offer comes first.
    for n in range(3):
        await world.task(
            f"count the lines of report{n}.csv",
            [("read_file", {"path": f"report{n}.csv"}, "a\nb\n")],
            chan=chan,
        )
    assert len(world.drafter.calls) == 1 and len(chan.sent) == 1


async def test_save_writes_the_workflow_and_commits_it(world: World) -> None:
    chan = Chan()
    episodes = [await world.restart(s, chan) for s in SERVICES[:3]]
    pid = offer_id(chan.sent[0])
    told = await world.learner.answer(PLATFORM, f"wf-save:{pid}", USER)
    assert told == (
        "Saved as workflow 'restart-worker' and enabled. `/workflows show restart-worker` "
        "shows it; `/workflows disable restart-worker` stops it."
    )
    saved = json.loads((world.data / "workflows" / "restart-worker.json").read_text())
    assert saved["steps"] == GOOD["steps"] and saved["match"] == GOOD["match"]
    assert saved["status"] == "enabled" and saved["taught_by"] == f"{PLATFORM}:{USER}"
    assert sorted(saved["source_episodes"]) == sorted(e.id for e in episodes)
    assert (saved["runs"], saved["wins"], saved["losses"]) == (0, 0, 0)
    history = world.datastore.history("workflows/restart-worker.json")
    assert history and "learned from tasks" in history[0].message
    [edit] = chan.edits
    assert edit["buttons"] == [] and "/workflows disable restart-worker" in edit["text"]
    assert await world.learner.answer(PLATFORM, f"wf-save:{pid}", USER) == (
        "That offer was answered already (saved)."
    )
    # A request of the shape is now the workflow's: no new draft for it.
    await world.restart("mailer", chan)
    await world.restart("queue", chan)
    assert world.drafter is not None and len(world.drafter.calls) == 1


async def test_a_second_draft_of_a_taken_name_gets_a_suffix(tmp_path: Path) -> None:
    tail = {
        "workflow": 1,
        "name": "restart-worker",  # the model reuses a name that is taken now
        "description": "Show a worker's log",
        "match": r"^show me the tail of (?P<worker>[a-z0-9]+) log$",
        "inputs": {
            "type": "object",
            "properties": {"worker": {"type": "string", "pattern": "^[a-z0-9]+$"}},
            "required": ["worker"],
        },
        "steps": [
            {
                "id": "tail",
                "kind": "call",
                "tool": "read_file",
                "args": {"path": "logs/{{inputs.worker}}.log"},
            }
        ],
        "output": "{{steps.tail}}",
    }
    w = World(tmp_path, Drafter(GOOD, tail))
    try:
        chan = Chan()
        for s in SERVICES[:3]:
            await w.restart(s, chan)
        await w.learner.answer(PLATFORM, f"wf-save:{offer_id(chan.sent[0])}", USER)
        for n in range(3):
            await w.task(
                f"show me the tail of worker{n} log",
                [("read_file", {"path": f"logs/worker{n}.log"}, "line\n")],
                chan=chan,
            )
        assert w.drafter is not None and len(w.drafter.calls) == 2
        second = chan.sent[1]
        assert (
            "Save as workflow 'restart-worker-2'? It would run 1 step(s) (read_file)"
            in (second["text"])
        )
        told = await w.learner.answer(PLATFORM, f"wf-save:{offer_id(second)}", USER)
        assert told.startswith("Saved as workflow 'restart-worker-2'")
        assert (
            json.loads((w.data / "workflows" / "restart-worker-2.json").read_text())["name"]
            == "restart-worker-2"
        )
    finally:
        w.close()


async def test_only_the_person_it_was_offered_to_may_answer(world: World) -> None:
    chan = Chan()
    for s in SERVICES[:3]:
        await world.restart(s, chan)
    pid = offer_id(chan.sent[0])
    assert await world.learner.answer(PLATFORM, f"wf-save:{pid}", "99") == (
        "This offer was for someone else."
    )
    assert await world.learner.answer("slack", f"wf-save:{pid}", USER) == (
        "This offer was for someone else."
    )
    assert not (world.data / "workflows").exists() and chan.edits == []
    assert await world.learner.answer(PLATFORM, "wf-save:00000000", USER) == (
        "That offer is no longer open."
    )


async def test_show_returns_the_document_and_no_closes_the_offer(world: World) -> None:
    chan = Chan()
    for s in SERVICES[:3]:
        await world.restart(s, chan)
    pid = offer_id(chan.sent[0])
    shown = await world.learner.answer(PLATFORM, f"wf-show:{pid}", USER)
    assert shown.startswith("Workflow 'restart-worker' as it would be saved:\n```json\n")
    assert json.loads(shown.split("```json\n", 1)[1].rsplit("```", 1)[0]) == GOOD
    assert chan.edits == []  # still open
    assert await world.learner.answer(PLATFORM, f"wf-skip:{pid}", USER) == "Not saved."
    [edit] = chan.edits
    assert edit["buttons"] == [] and edit["text"].endswith("Not saved.")
    assert "status: skipped" in (world.data / "workflow-proposals" / f"{pid}.md").read_text()
    assert not (world.data / "workflows").exists()
    # Skipped is remembered: the shape's next runs are not offered again.
    await world.restart("mailer", chan)
    assert world.drafter is not None and len(world.drafter.calls) == 1


async def test_an_offer_survives_a_restart(world: World) -> None:
    chan = Chan()
    for s in SERVICES[:3]:
        await world.restart(s, chan)
    pid = offer_id(chan.sent[0])
    again = world.new_learner()  # a new process on the same data dir
    told = await again.answer(PLATFORM, f"wf-save:{pid}", USER)
    assert told.startswith("Saved as workflow 'restart-worker'")
    assert (world.data / "workflows" / "restart-worker.json").is_file()
    # It also remembers what it observed and drafted: no second offer for the shape.
    await again.after_task(
        chan,
        Message(PLATFORM, CONVERSATION, USER, "x"),
        SimpleNamespace(episode=await _episode_only(world, "mailer")),
    )
    assert world.drafter is not None and len(world.drafter.calls) == 1


async def _episode_only(world: World, service: str) -> Episode:
    world.n += 1
    return Episode(
        id=f"20270115-0001{world.n:02d}-def{world.n:03d}",
        started=datetime.fromtimestamp(world.clock.now(), UTC),
        channel=PLATFORM,
        conversation=CONVERSATION,
        user=USER,
        request=f"restart the {service} worker and check its health",
        outcome="success",
        scope=f"person:{PLATFORM}:{USER}",
        tools=[
            ToolRecord("shell", ok=True, args={"command": f"./svc restart {service}"}, result="ok"),
            ToolRecord("shell", ok=True, args={"command": f"./svc health {service}"}, result="ok"),
        ],
    )


async def test_observations_are_bounded_by_age_and_count(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(learn, "MAX_OBSERVED", 10)
    chan = Chan(interactive=False)
    path = world.data / "workflow-learning" / "observed.jsonl"
    for n in range(4):
        await world.task(
            f"look at file number{n}", [("read_file", {"path": f"f{n}"}, "x")], chan=chan
        )
    assert len(path.read_text().splitlines()) == 4
    await world.clock.advance_to(START + 31 * 86400)
    await world.task("look at the other file", [("read_file", {"path": "g"}, "x")], chan=chan)
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert [o["request"] for o in kept] == ["look at the other file"]
    for n in range(15):
        await world.task(f"list folder dir{n}", [("list_files", {"path": f"d{n}"}, "x")], chan=chan)
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(kept) == 10 and kept[-1]["request"] == "list folder dir14"
    assert {"id", "started", "user", "channel", "conversation", "scope", "request", "calls"} <= set(
        kept[-1]
    )
    assert kept[-1]["calls"] == [
        {"tool": "list_files", "args": {"path": "d14"}, "ok": True, "result": "x"}
    ]
    # A new learner reads the same bounded file back.
    assert len((await world.new_learner()._load()).observed) == 10


async def test_observations_are_redacted_on_disk(world: World) -> None:
    token = "xoxb-" + "1234567890-abcdefghijklmnop"
    await world.task(
        "post the note", [("shell", {"command": f"notify --token {token}"}, "sent")], chan=Chan()
    )
    text = (world.data / "workflow-learning" / "observed.jsonl").read_text()
    assert token not in text and "REDACTED" in text


def test_the_document_is_read_out_of_the_answer_with_or_without_a_fence() -> None:
    assert first_object('Here it is:\n```json\n{"name": "a-b", "x": {"y": 1}}\n```\nBye') == {
        "name": "a-b",
        "x": {"y": 1},
    }
    assert first_object('Sure. {"name": "c"} and {"name": "d"}') == {"name": "c"}
    assert first_object('{not json} then {"ok": true}') == {"ok": True}
    assert first_object("no json here") is None


def test_the_prompt_cuts_results_and_replies_but_not_arguments() -> None:
    long = "y" * 5000
    runs = [
        {
            "request": "do it",
            "calls": [{"tool": "shell", "args": {"command": "echo " + "z" * 1000}, "result": long}],
            "reply": long,
        }
    ]
    [system, user] = messages_for(runs)
    assert "Answer with ONLY the JSON document" in system["content"]
    assert "z" * 1000 in user["content"]
    assert "y" * 601 not in user["content"] and "[cut, 5000 characters]" in user["content"]


async def test_a_press_before_the_send_returns_is_shown_on_the_message(world: World) -> None:
    class Quick(Chan):
        """A person who presses No before the platform has confirmed the send."""

        async def send(self, conversation: str, text: str, **kw: Any) -> MessageRef:
            ref = await super().send(conversation, text, **kw)
            pid = offer_id(self.sent[-1])
            self.told = await world.learner.answer(PLATFORM, f"wf-skip:{pid}", USER)
            return ref

    chan = Quick()
    for s in SERVICES[:3]:
        await world.restart(s, chan)
    assert chan.told == "Not saved."
    [edit] = chan.edits
    assert edit["buttons"] == [] and edit["text"].endswith("Not saved.")
    pid = offer_id(chan.sent[0])
    assert "status: skipped" in (world.data / "workflow-proposals" / f"{pid}.md").read_text()
