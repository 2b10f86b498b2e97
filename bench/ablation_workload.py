"""The ablation workload (bench/ablations.py): six scenarios, each a scripted model
that behaves the way a model would in its situation, the lines a person sends, and
what counts as a false success. Each runs as one `steward replay` session:

* learning — bench/learning.py's repeated mistake (reads `report-N.txt` at the root; it
  is in `reports/`) that a learned rule prevents;
* proactive — a deploy that keeps failing on a missing `deploy.env`; an accepted offer
  of help creates it (bench/proactive.py simulates 1,000 users on `core.proactive.Engine`
  directly; here one person per seed goes through replay, answering offers as one of
  that bench's personas would);
* recall — a restart that fails the obvious way (`sh svc.sh reload X`: the script has
  no such action) until the person says how (`sh svc.sh restart X`); a later restart of
  another worker does it right when the earlier one is in its prompt;
* memory — a fact found by tool calls in the first task (the staging database host, in
  `infra/hosts.txt`) asked for again later: one model call when the earlier episode is
  recalled, the lookup again (three calls) when not;
* workflows — bench/workflows.py's "restart the X worker and check health" with its
  look-alikes; the offered workflow is saved as a person would (`/workflows save`);
* gates — "write the release notes for vN" where the model sometimes says it wrote the
  file without calling a tool; the gates send it back and it then writes it.

Prompts other than the agent's (rule drafting, workflow drafting, summaries) get
plain answers unless a scenario says otherwise: its model drafts no rule and no
workflow, which keeps each part's effect to the scenario made for it. Offers of
help are answered by a simulated person (`Person`) as it comes.
"""

from __future__ import annotations

import io
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import learning as learning_bench
from bench import workflows as workflows_bench
from bench.proactive import PERSONAS
from core.proactive import SUGGEST_PROMPT
from core.proactive.engine import OFFER_PREFIX
from tests.fakes.llm import Reply

DRAFT_RULES = "You turn an AI agent"
SUMMARY = "You keep the running summary"
DRAFT_WORKFLOW = "A task succeeded several times"


@dataclass
class Person:
    """The simulated person: answers an offer of help by persona, deterministically."""

    persona: str
    rng: random.Random
    offers: int = 0
    accepted: int = 0
    interruptions: int = 0

    def answer(self) -> str:
        """The answer to one offer: "accept", "refuse" or "ignore" (it then expires)."""
        weights = PERSONAS[self.persona][5]
        choice = self.rng.choices(("accept", "refuse", "ignore"), weights)[0]
        self.offers += 1
        if choice == "accept":
            self.accepted += 1
        else:
            self.interruptions += 1
        return choice


class Outbox(io.StringIO):
    """What the replay sent, read as it comes (the scenario reacts to it)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen = 0

    def new(self) -> list[dict[str, Any]]:
        """The outbound actions since the last call."""
        lines = self.getvalue().splitlines()
        fresh = lines[self._seen :]
        self._seen = len(lines)
        return [json.loads(line) for line in fresh]


def _request(body: dict[str, Any]) -> str:
    """The latest user message: the request, or the gates' note after a refused answer."""
    return next((str(m["content"]) for m in reversed(body["messages"]) if m["role"] == "user"), "")


def _system(body: dict[str, Any]) -> str:
    """The system prompt: rules and recalled episodes are paragraphs of it."""
    return "\n".join(str(m["content"]) for m in body["messages"] if m["role"] == "system")


def _since_request(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool results after the person's request (this task's calls so far)."""
    out: list[dict[str, Any]] = []
    for m in reversed(body["messages"]):
        if m["role"] == "user":
            break
        if m["role"] == "tool":
            out.insert(0, m)
    return out


def _task_text(body: dict[str, Any]) -> str:
    """The person's request of this task (the first user message after the system)."""
    return next((str(m["content"]) for m in body["messages"] if m["role"] == "user"), "")


class Scenario:
    """A scenario: its workspace, its scripted model, its lines, what a false success is.

    Prompts other than the agent's (rule drafting, offers, summaries, workflow drafting)
    get plain answers here unless the scenario says otherwise: it drafts no rule and no
    workflow, which keeps each part's effect to the scenario made for it."""

    name = ""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def setup(self, ws: Path) -> None:
        """Files the workspace starts with."""

    def lines(self, person: Person, out: Outbox) -> Iterator[dict[str, Any]]:
        """The replay's lines; offers of help are answered by `person` as they come."""
        raise NotImplementedError

    def agent(self, body: dict[str, Any]) -> Reply:
        """The model in the agent's loop."""
        raise NotImplementedError

    def help(self, body: dict[str, Any]) -> Reply:
        """The model in a task an accepted offer started ("Help me with: …")."""
        return Reply.text("I looked at the failures above; nothing more to add here.")

    def other(self, system: str, body: dict[str, Any]) -> Reply:
        """Any other prompt (drafting rules or workflows, summaries)."""
        if system.startswith(DRAFT_RULES):
            return Reply.text(json.dumps({"rules": []}))
        if system.startswith(DRAFT_WORKFLOW):
            return Reply.text("No workflow: nothing here repeats.")
        return Reply.text("A summary.")

    def false_success(self, meta: dict[str, Any], ws: Path) -> bool:
        """A task recorded success whose claimed effect is absent on disk."""
        return False

    def respond(self, body: dict[str, Any]) -> Reply:
        """The scripted server's responder: each prompt to the part that answers it."""
        first = str(body["messages"][0]["content"])
        if first == SUGGEST_PROMPT:
            return Reply.text("The last tasks failed the same way. Want me to look into it?")
        if not first.startswith("You are Steward"):
            return self.other(first, body)
        if _task_text(body).startswith(OFFER_PREFIX):
            return self.help(body)
        return self.agent(body)

    @staticmethod
    def answer_offers(
        person: Person, items: list[dict[str, Any]], t: float
    ) -> Iterator[dict[str, Any]]:
        """Press on each new offer of help among `items` as the person would (nothing
        when ignored)."""
        for item in items:
            for button in item.get("buttons") or []:
                if str(button.get("value", "")).startswith("suggest-yes:"):
                    choice = person.answer()
                    if choice != "ignore":
                        word = "suggest-yes:" if choice == "accept" else "suggest-no:"
                        value = button["value"].replace("suggest-yes:", word, 1)
                        yield {"t": t + 5, "user": "alice", "press": value}


class Learning(Scenario):
    """bench/learning.py's mistake; its model drafts the useful rule and the decoy."""

    name = "learning"
    TASKS = 12

    def setup(self, ws: Path) -> None:
        (ws / "reports").mkdir(parents=True)
        for i in range(self.TASKS):
            (ws / "reports" / f"report-{i}.txt").write_text(f"quarter {i}: revenue up {i}%\n")

    def lines(self, person: Person, out: Outbox) -> Iterator[dict[str, Any]]:
        for i in range(self.TASKS):
            t = 600.0 * i
            yield {"t": t, "user": "alice", "text": f"Summarize report-{i}.txt for me"}
            yield from self.answer_offers(person, out.new(), t)

    def agent(self, body: dict[str, Any]) -> Reply:
        return learning_bench.respond(body)

    def help(self, body: dict[str, Any]) -> Reply:
        done = _since_request(body)
        if not done:
            return Reply.tool("list_files", {"path": "reports"})
        return Reply.text("The reports are in reports/, not at the top of the workspace.")

    def other(self, system: str, body: dict[str, Any]) -> Reply:
        if system.startswith((DRAFT_RULES, SUMMARY)):
            return learning_bench.respond(body)
        return super().other(system, body)


class Proactive(Scenario):
    """A deploy failing on a missing deploy.env until an accepted offer creates it."""

    name = "proactive"
    TASKS = 8
    ASK = "deploy the app to staging"

    def lines(self, person: Person, out: Outbox) -> Iterator[dict[str, Any]]:
        for i in range(self.TASKS):
            t = 120.0 * i
            yield {"t": t, "user": "alice", "text": self.ASK}
            yield from self.answer_offers(person, out.new(), t)

    def agent(self, body: dict[str, Any]) -> Reply:
        done = _since_request(body)
        if not done:
            return Reply.tool("read_file", {"path": "deploy.env"})
        if "no such file" in str(done[-1]["content"]).lower():
            return Reply.text("The deploy failed: deploy.env does not exist.")
        return Reply.text("The app is deployed to staging with the settings in deploy.env.")

    def help(self, body: dict[str, Any]) -> Reply:
        if not _since_request(body):
            return Reply.tool("write_file", {"path": "deploy.env", "content": "REGION=eu\n"})
        return Reply.text("I wrote deploy.env from the template; the next deploy can read it.")


class Recall(Scenario):
    """The wrong way to restart until the person says the right one; recall carries it."""

    name = "recall"
    SERVICES = ("web", "api", "db", "cache", "queue", "auth", "mail")
    TASKS = 4
    WRONG = "sh svc.sh reload {}"
    RIGHT = "sh svc.sh restart {}"
    SCRIPT = (
        'if [ "$1" = restart ]; then echo "restart $2" >> calls.log; echo "$2 restarted"\n'
        'else echo "svc.sh: unknown action $1 (use restart)" >&2; exit 2; fi\n'
    )

    def setup(self, ws: Path) -> None:
        (ws / "svc.sh").write_text(self.SCRIPT)

    def lines(self, person: Person, out: Outbox) -> Iterator[dict[str, Any]]:
        services = list(self.SERVICES)
        random.Random(self.seed).shuffle(services)
        t = 0.0
        for service in services[: self.TASKS]:
            yield {"t": t, "user": "alice", "text": f"restart the {service} worker"}
            items = out.new()
            yield from self.answer_offers(person, items, t)
            if any("could not restart" in o["text"] for o in items):
                t += 60  # the person says how, as a person would
                text = f"restart the {service} worker with {self.RIGHT.format(service)}"
                yield {"t": t, "user": "alice", "text": text}
                yield from self.answer_offers(person, out.new(), t)
            t += 3600

    def agent(self, body: dict[str, Any]) -> Reply:
        request = _task_text(body)
        service = request.split()[2]
        done = _since_request(body)
        knows = "svc.sh restart" in _system(body) or "svc.sh restart" in request
        if not done:
            command = (self.RIGHT if knows else self.WRONG).format(service)
            return Reply.tool("shell", {"command": command})
        if "unknown action" in str(done[-1]["content"]):
            return Reply.text(f"I could not restart {service}: svc.sh has no reload.")
        return Reply.text(f"Restarted {service} with {self.RIGHT.format(service)}.")


class Memory(Scenario):
    """A fact found by tool calls in the first task, asked for again later."""

    name = "memory"
    HOST = "db-7.internal"
    LATER = (
        "connect me to the staging database",
        "what is the staging database host again?",
        "give me the psql command for the staging database",
        "which host runs the staging database?",
    )

    def setup(self, ws: Path) -> None:
        (ws / "infra").mkdir()
        (ws / "infra" / "hosts.txt").write_text(
            f"production db: db-1.internal\nstaging db: {self.HOST}\nqa db: db-9.internal\n"
        )

    def lines(self, person: Person, out: Outbox) -> Iterator[dict[str, Any]]:
        yield {"t": 0, "user": "alice", "text": "find the staging database host"}
        later = 2 + self.seed % 3  # two to four later asks, by seed
        for i, text in enumerate(self.LATER[:later]):
            yield {"t": 3600.0 * (i + 1), "user": "alice", "text": text}
            yield from self.answer_offers(person, out.new(), 3600.0 * (i + 1))

    def agent(self, body: dict[str, Any]) -> Reply:
        if self.HOST in _system(body):  # the earlier episode's answer is in the prompt
            return Reply.text(f"The staging database is on {self.HOST}: psql -h {self.HOST}")
        done = _since_request(body)
        if not done:
            return Reply.tool("list_files", {"path": "infra"})
        if len(done) == 1:
            return Reply.tool("read_file", {"path": "infra/hosts.txt"})
        found = re.search(r"staging db: (\S+)", str(done[-1]["content"]))
        host = found.group(1) if found else "unknown"
        return Reply.text(f"The staging database host is {host}: psql -h {host}")


class Workflows(Scenario):
    """bench/workflows.py's workload; its model drafts the workflow when asked."""

    name = "workflows"
    TASKS = 10

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.model = workflows_bench.Model()

    def setup(self, ws: Path) -> None:
        (ws / "logs").mkdir()
        (ws / "svc.sh").write_text(workflows_bench.SCRIPT)

    def lines(self, person: Person, out: Outbox) -> Iterator[dict[str, Any]]:
        shift = self.seed % len(workflows_bench.SERVICES)
        for i, (text, _) in enumerate(workflows_bench.workload(self.TASKS + shift)[shift:]):
            t = 60.0 * i
            yield {"t": t, "user": "alice", "text": text}
            items = out.new()
            yield from self.answer_offers(person, items, t)
            for item in items:
                for button in item.get("buttons") or []:
                    value = str(button.get("value", ""))
                    if value.startswith("wf-save:"):  # saved as a person would
                        offer = value.split(":", 1)[1]
                        yield {"t": t + 30, "user": "alice", "text": f"/workflows save {offer}"}

    def agent(self, body: dict[str, Any]) -> Reply:
        return self.model(body)

    def other(self, system: str, body: dict[str, Any]) -> Reply:
        if system.startswith(DRAFT_WORKFLOW):
            return self.model(body)
        return super().other(system, body)


class Gates(Scenario):
    """Release notes the model sometimes says it wrote without writing them."""

    name = "gates"
    TASKS = 5
    ASK = re.compile(r"release notes for (v[\d.]+)")

    def lines(self, person: Person, out: Outbox) -> Iterator[dict[str, Any]]:
        for i in range(self.TASKS):
            t = 600.0 * i
            yield {"t": t, "user": "alice", "text": f"write the release notes for v1.{i}"}
            yield from self.answer_offers(person, out.new(), t)

    def lies(self, request: str) -> bool:
        """Whether the first answer to `request` claims the file unwritten (by seed)."""
        return random.Random(f"{self.seed}:{request}").random() < 0.5

    def agent(self, body: dict[str, Any]) -> Reply:
        request = _task_text(body)
        version = self.ASK.search(request)
        path = f"notes/{version.group(1) if version else 'v0'}.md"
        done = _since_request(body)
        retried = _request(body).startswith("Your answer says")
        if done:
            return Reply.text(f"I wrote {path} with the changes since the last release.")
        if self.lies(request) and not retried:
            return Reply.text(f"I wrote {path} with the changes since the last release.")
        return Reply.tool("write_file", {"path": path, "content": "- fixes\n- features\n"})

    def false_success(self, meta: dict[str, Any], ws: Path) -> bool:
        version = self.ASK.search(str(meta.get("request") or ""))
        return version is not None and not (ws / "notes" / f"{version.group(1)}.md").exists()


SCENARIOS: tuple[type[Scenario], ...] = (Learning, Proactive, Recall, Memory, Workflows, Gates)
