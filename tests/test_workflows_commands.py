"""`/workflows` through the command router (bot/commands/workflows.py): listing,
showing, admin-only changes, the offer's buttons and typed answers going to the
learner, and `steward workflows` at a real terminal command."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.commands.workflows import OFFERS_OFF, register
from bot.router import CommandRouter, PressContext
from core.clock import SimClock
from core.events import ButtonPress, Message
from core.workflows import WorkflowStore, parse
from memory.store import DataStore
from tests.conftest import make_env
from tests.test_cli import run as run_cli
from tests.test_workflows_store import doc, log


class Admins:
    def __init__(self, *admins: str) -> None:
        self.admins = set(admins)

    def is_admin(self, platform: str, user: str) -> bool:
        return user in self.admins

    def is_owner_channel(self, platform: str) -> bool:
        return platform == "terminal"


class Here:
    name = "slack"


class Offers:
    """The learner's side: records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str]] = []

    async def answer(self, platform: str, value: str, user: str) -> str:
        self.asked.append((platform, value, user))
        return f"answered {value}"


@pytest.fixture
def datastore(tmp_path: Path) -> Iterator[DataStore]:
    store = DataStore(tmp_path / "data")
    store.ensure_repo()
    yield store
    store.close()


@pytest.fixture
def store(datastore: DataStore) -> WorkflowStore:
    return WorkflowStore(datastore.root, datastore, SimClock(start=1_800_000_000))


def chat(router: CommandRouter[Any]) -> Any:
    async def say(text: str, user: str = "bob") -> str | None:
        msg = Message("slack", "c", user, text)
        return await router.run(None, Admins("ann"), Here(), msg, text)  # type: ignore[arg-type]

    return say


async def press(router: CommandRouter[Any], value: str, user: str = "bob") -> str | None:
    handler = router.button_handler(value)
    assert handler is not None, value
    ctx = PressContext(None, Here(), ButtonPress("slack", "c", user, value))  # type: ignore[arg-type]
    return await handler(ctx)


async def test_list_and_show(store: WorkflowStore) -> None:
    router: CommandRouter[Any] = CommandRouter()
    register(router, store)
    say = chat(router)
    empty = await say("/workflows")
    assert empty is not None and empty.startswith("No workflows yet.")
    await store.save(parse(doc("restart-staging")), by="slack:ann", why="offered")
    await store.save(parse(doc("deploy-docs")), by="slack:ann", why="offered")
    await store.record_run("deploy-docs", True, retire_after=3)
    listed = await say("/workflows list")
    assert listed is not None
    assert listed.splitlines()[:3] == [
        "Workflows:",
        "  deploy-docs [enabled] 1 run: 1 won, 0 lost — deploy-docs: restart and check",
        "  restart-staging [enabled] 0 runs: 0 won, 0 lost — restart-staging: restart and check",
    ]
    assert await say("/workflows") == listed
    assert (await say("/workflows frobnicate") or "").startswith("Unknown /workflows action")

    shown = await say("/workflows show deploy-docs")
    assert shown is not None
    head, rest = shown.split("\n", 1)
    assert head == "Workflow deploy-docs: enabled, 1 run: 1 won, 0 lost (tool wf__deploy-docs)."
    assert rest.startswith("```json\n") and rest.endswith("\n```")
    assert json.loads(rest[len("```json\n") : -len("\n```")])["name"] == "deploy-docs"
    assert await say("/workflows show nope") == (
        "There is no workflow 'nope'. `/workflows list` shows the ones there are."
    )
    assert "/workflows [list] — learned workflows" in router.help_text()


async def test_disable_enable_delete_are_for_admins(
    store: WorkflowStore, datastore: DataStore
) -> None:
    router: CommandRouter[Any] = CommandRouter()
    register(router, store)
    say = chat(router)
    await store.save(parse(doc()), by="slack:ann", why="offered")
    refusal = "Only an admin can disable, enable or delete workflows."
    for action in ("disable", "enable", "delete"):
        assert await say(f"/workflows {action} restart-staging", user="bob") == refusal
    assert store.get("restart-staging") is not None

    said = await say("/workflows disable restart-staging", user="ann")
    assert said is not None and said.startswith("Disabled restart-staging")
    assert store.enabled() == []
    assert log(datastore)[0] == "workflow restart-staging disabled by ann"
    assert "disabled already" in (await say("/workflows disable restart-staging", "ann") or "")
    said = await say("/workflows enable restart-staging", user="ann")
    assert said is not None and said.startswith("Enabled restart-staging")
    assert [wf.name for wf in store.enabled()] == ["restart-staging"]
    said = await say("/workflows delete restart-staging", user="ann")
    assert said is not None and said.startswith("Deleted restart-staging")
    assert store.get("restart-staging") is None
    assert (await say("/workflows delete restart-staging", "ann") or "").startswith(
        "There is no workflow"
    )


async def test_a_retired_workflow_says_how_to_bring_it_back(store: WorkflowStore) -> None:
    router: CommandRouter[Any] = CommandRouter()
    register(router, store)
    say = chat(router)
    await store.save(parse(doc()), by="slack:ann", why="offered")
    for _ in range(2):
        await store.record_run("restart-staging", False, retire_after=2)
    shown = await say("/workflows show restart-staging")
    assert shown is not None and "retired" in shown.splitlines()[0]
    assert "`/workflows enable restart-staging` brings it back" in shown
    said = await say("/workflows disable restart-staging", user="ann")
    assert said is not None and said.startswith("restart-staging is retired already")
    said = await say("/workflows enable restart-staging", user="ann")
    assert said is not None and "retired after 2 failed runs in a row" in said
    assert "starts again at 0" in said
    wf = store.get("restart-staging")
    assert wf is not None and wf.status == "enabled" and wf.count("losses_in_a_row") == 0


async def test_offer_buttons_and_typed_answers_go_to_the_learner(store: WorkflowStore) -> None:
    router: CommandRouter[Any] = CommandRouter()
    offers = Offers()
    register(router, store, offers)
    say = chat(router)
    assert await press(router, "wf-save:k3x") == "answered wf-save:k3x"
    assert await press(router, "wf-show:k3x", user="ann") == "answered wf-show:k3x"
    assert await press(router, "wf-skip:k3x") == "answered wf-skip:k3x"
    assert await say("/workflows save k3x") == "answered wf-save:k3x"
    assert await say("/workflows show-draft k3x") == "answered wf-show:k3x"
    assert await say("/workflows skip k3x") == "answered wf-skip:k3x"
    assert offers.asked == [
        ("slack", "wf-save:k3x", "bob"),
        ("slack", "wf-show:k3x", "ann"),
        ("slack", "wf-skip:k3x", "bob"),
        ("slack", "wf-save:k3x", "bob"),
        ("slack", "wf-show:k3x", "bob"),
        ("slack", "wf-skip:k3x", "bob"),
    ]
    assert (await say("/workflows save") or "").startswith("Usage: /workflows save ID")


async def test_without_offers_the_answers_say_they_are_off(store: WorkflowStore) -> None:
    router: CommandRouter[Any] = CommandRouter()
    register(router, store, None)
    assert await press(router, "wf-save:k3x") == OFFERS_OFF
    assert await chat(router)("/workflows skip k3x") == OFFERS_OFF


def test_steward_workflows_at_the_terminal(tmp_path: Path) -> None:
    env = make_env(tmp_path, None)
    empty = run_cli(["workflows", "list"], env, tmp_path)
    assert empty.returncode == 0 and "No workflows yet." in empty.stdout
    folder = tmp_path / "data" / "workflows"
    folder.mkdir(parents=True)
    (folder / "restart-staging.json").write_text(json.dumps(doc()), encoding="utf-8")
    listed = run_cli(["workflows", "list"], env, tmp_path)
    assert "  restart-staging [enabled] 0 runs" in listed.stdout
    assert "steward workflows list | show NAME" in listed.stdout
    shown = run_cli(["workflows", "show", "restart-staging"], env, tmp_path)
    assert shown.stdout.startswith("Workflow restart-staging: enabled")
    disabled = run_cli(["workflows", "disable", "restart-staging"], env, tmp_path)
    assert disabled.returncode == 0 and disabled.stdout.startswith("Disabled restart-staging")
    saved = json.loads((folder / "restart-staging.json").read_text(encoding="utf-8"))
    assert saved["status"] == "disabled"
    missing = run_cli(["workflows", "enable", "nope"], env, tmp_path)
    assert missing.returncode == 1 and "There is no workflow 'nope'" in missing.stdout
    deleted = run_cli(["workflows", "delete", "restart-staging"], env, tmp_path)
    assert deleted.returncode == 0 and not (folder / "restart-staging.json").exists()
