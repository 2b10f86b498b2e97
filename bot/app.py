"""Wiring: settings in, a running Steward out. The only place that knows every part.

Why one builder: `run`, `chat`, `replay` and the tests must assemble exactly the
same agent, guardian and dispatcher, differing only in clock and channels.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from bot.channels import Outbox, wrap
from bot.commands.goals import GoalCommands
from bot.commands.goals import register as register_goal_commands
from bot.commands.mcp import register as register_mcp_commands
from bot.commands.rules import RulesCommands
from bot.commands.schedules import ScheduleCommands
from bot.commands.schedules import register as register_schedule_commands
from bot.commands.skills import SkillsCommands
from bot.commands.skills import register as register_skill_commands
from bot.commands.undo import register as register_undo_commands
from bot.commands.workflows import register as register_workflow_commands
from bot.dispatcher import Dispatcher
from bot.model_check import NO_MODEL_MESSAGE, configured_embedder, no_model_message
from config.settings import ConfigError, Settings
from core.access import Access
from core.activity import Activity
from core.agent import Agent
from core.approvals import Approvals
from core.browser import BrowserConfig, Browsers
from core.browser import unavailable as browser_unavailable
from core.browser.tools import NAMES as BROWSER_TOOL_NAMES
from core.clock import Clock
from core.code.service import CodeIntel
from core.conversations import Conversations
from core.delegate import TOOL as DELEGATE_TOOL
from core.egress.policy import from_settings as egress_from_settings
from core.egress.policy import server_endpoints
from core.events import Channel
from core.goals.engine import Deps as GoalDeps
from core.goals.engine import GoalEngine
from core.goals.queue import GoalQueue
from core.goals.terms import GoalConfig
from core.guardian import Guardian
from core.history import History, model_summarizer
from core.interrupted import Interrupted
from core.learning import Learner, LearningConfig
from core.mcp import McpHub, McpJudge
from core.mcp import plan as mcp_plan
from core.model.client import LLMClient, Target
from core.model.idle_cores import IdleCores
from core.model.local.client import LOCAL_TOOLS, LocalLLM
from core.model.local.runtime import (
    ModelServer,
    availability,
    embedded_wanted,
    server_for,
)
from core.model.workers import WorkerPool
from core.persist import EpisodeWriter
from core.proactive import Config as ProactiveConfig
from core.proactive import Proactive
from core.sandbox import Limits, SandboxRequired, own_paths, parse_user
from core.sandbox import Setup as SandboxSetup
from core.sandbox import setup as sandbox_setup
from core.schedules import Deps, ScheduleConfig, Scheduler
from core.search import from_settings as search_from_settings
from core.skills import Proposals, SkillJudge, SkillSource, skills_for
from core.snapshots import from_settings as undo_from_settings
from core.snapshots import store_root, undoable_deletes
from core.suggestions import Suggestions
from core.tools import ALL_TOOLS
from core.tools.base import ToolContext
from core.tools.toolbox import Toolbox
from core.workflows import WorkflowStore
from core.workflows.learn import WorkflowLearner
from core.workflows.tools import Workflows
from memory.admin_rooms import AdminRooms
from memory.approvals import ApprovalStore
from memory.episodes import EpisodeStore
from memory.health import DISK_ERRNOS, health_for, reason
from memory.history import COMMIT_EVERY, MemoryHistory
from memory.journal import TaskJournal
from memory.lock import DataDirLocked, acquire
from memory.records import Written
from memory.rules import RuleStore
from memory.schedules import ScheduleStore
from memory.seen import SeenEvents
from memory.store import DataStore
from memory.transcripts import TranscriptStore

LOCAL_MODEL_NOTICE = (
    "Running a tiny local model (SmolLM2-135M) on this machine: no key, no network, and "
    "only simple jobs (list, read, write and search files, run a command). To use a real "
    "model, set STEWARD_MODEL and its key, e.g. `export STEWARD_MODEL=openai/gpt-4.1-mini "
    "OPENAI_API_KEY=sk-...`, and restart (see docs/local-model.md)."
)


def in_use_message(exc: DataDirLocked, command: str, settings: Settings) -> str:
    """What a refused `steward chat` says when another Steward holds the data dir.

    The Quick start offers `steward chat` next to `steward run`, so running both is
    the likely mistake: the message names the ways out (stop the other one, use
    `steward run`'s web chat, or another data dir). Other commands keep the lock's
    own message.
    """
    if command != "chat" or exc.pid == os.getpid():
        return str(exc)
    pid = f"pid {exc.pid}" if exc.pid is not None else "pid unknown"
    other_dir = (
        "or run `steward chat` with STEWARD_DATA_DIR set to another folder "
        "(a separate memory: no shared history or rules)."
    )
    where = f"`steward chat` can't use the data dir {exc.data_dir}"
    if exc.command == "run":
        url = exc.url or f"http://{settings.host}:{settings.port}"
        return (
            f"{where}: `steward run` ({pid}) is using it, and only one Steward may. "
            "Either stop `steward run` first (Ctrl-C where it runs), "
            f"or chat in its web chat at {url} instead (log in with the link it printed, "
            "or `steward login`), "
            f"{other_dir}"
        )
    if exc.command:
        return (
            f"{where}: `steward {exc.command}` ({pid}) is using it, and only one Steward "
            f"may. Stop it or let it finish first, {other_dir}"
        )
    return (
        f"{where}: another Steward ({pid}) is using it, and only one may. Stop it first "
        "(if it is `steward run`, you can chat in its web chat instead, by default at "
        f"http://{settings.host}:{settings.port}), {other_dir}"
    )


def ensure_dir(path: Path, key: str) -> Path:
    """Create a configured folder, or explain why it can't be used."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"`{key}` is {path}, which cannot be created ({exc.strerror}). "
            f"Set STEWARD_{key.upper()} to a folder you can write."
        ) from exc
    if not path.is_dir():
        raise ConfigError(f"`{key}` is {path}, which is not a folder. Set STEWARD_{key.upper()}.")
    probe = path / ".steward-write-test"
    try:
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:  # a full disk is not a permissions problem
            raise ConfigError(
                f"`{key}` is {path}, which cannot be written: {reason(exc)} ({exc.strerror}). "
                f"Free some space there, or set STEWARD_{key.upper()} to another folder.",
                exit_code=1,  # the machine's state, as a full disk met later (bot/cli)
            ) from exc
        raise ConfigError(
            f"`{key}` is {path}, which is not writable ({exc.strerror}). "
            f"Fix its permissions or set STEWARD_{key.upper()}."
        ) from exc
    return path


#: What the default workspace says about itself, written when Steward creates it.
WORKSPACE_README = """# Steward's workspace

This folder is Steward's default workspace (`./workspace` in the folder Steward was
started in): the only folder its tools may change. Inside a Steward checkout it is
git-ignored.

Commands Steward runs here cannot reach a git repository around this folder (such as
Steward's own checkout): git stops looking here (GIT_CEILING_DIRECTORIES), so
`git status` says "not a git repository" until you run `git init` here or clone a
project into it.

To work in another folder, set STEWARD_WORKSPACE (or `workspace` in steward.toml);
see docs/configuration.md in Steward's checkout. You may edit or delete this file.
"""


def ensure_workspace(settings: Settings) -> Path:
    """The workspace folder, created if missing; the default one (`./workspace`) is
    created with a README.md saying what it is, so a person (or `list_files`) finding it
    inside the checkout knows, and `git status` there is not mistaken for Steward's own.
    A workspace the person configured is theirs: nothing is put in it."""
    path = settings.workspace
    created = not path.exists()
    ensure_dir(path, "workspace")
    if created and settings.sources.get("workspace") == "default":
        try:
            (path / "README.md").write_text(WORKSPACE_README, encoding="utf-8")
        except OSError as exc:  # the folder works without it
            structlog.get_logger("steward.app").warning(
                "workspace.readme_failed", path=str(path), error=str(exc)
            )
    return path


def config_files(settings: Settings) -> list[Path]:
    """The config files these settings were read from (kept out of the sandbox even if
    someone put them inside the workspace)."""
    files = {
        Path(origin)
        for origin in settings.sources.values()
        if origin != "default" and not origin.startswith("env ")
    }
    files.update(Path(f) for f in settings.mcp.files)  # they may hold an MCP server's env
    return sorted(files)


_heap_frozen = False


def _freeze_startup_heap() -> None:
    """Move what start-up allocated (imported modules, pydantic and litellm schemas, the
    memory index: ~400k objects) out of the garbage collector's sight, once a process.

    Why: those objects live as long as the process, yet every full collection walked
    them all: under load (100 conversations at once) the collector took 1.3-1.6 ms of
    the one event loop's CPU per message, mostly in gen-2 passes of 200-400 ms each;
    frozen, 0.5-0.7 ms. Once
    a process only: a second App (tests start many) would otherwise make the garbage
    left by the first immortal."""
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.freeze()


class App:
    """A Steward instance: one dispatcher, one agent, any number of channels."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        env: Mapping[str, str] | None = None,
        local_command: Callable[[int], list[str]] | None = None,
        subcommand: str = "",
    ) -> None:
        """`env`: where provider keys are looked for (default os.environ).
        `local_command`: the model server command for the embedded model (tests pass a
        fake server; default llama.cpp's through core/model/local/server.py, when installed).
        `subcommand`: the `steward` subcommand running it (`run`, `chat`, `replay`): written
        in the data-dir lock, and it shapes the message when the data dir is in use.

        Built in this order, each step from what the ones before it made: the folders
        and the sandbox, the stores, the safety parts, the model, the agent and the
        learner, then (with the data dir locked) the conversation history, proactive
        help, the dispatcher, schedules and goals."""
        self.settings = settings
        self.clock = clock or Clock()
        self.data_dir = ensure_dir(settings.data_dir, "data_dir")
        self.workspace = ensure_workspace(settings).resolve()
        self.sandbox = self._build_sandbox()
        self.channels: list[Outbox] = []
        self._recovering = asyncio.Lock()
        self._initialized = False
        self._build_memory()
        self._build_safety()
        self._build_model(os.environ if env is None else env, local_command)
        self.index: Any = None
        self._pending: asyncio.Task[None] | None = None
        self._build_code()
        self._build_browser()
        self.agent = self._build_agent()
        if self.agent is not None and self.browsers is not None:  # each task's, at its end
            self.agent.on_task_end.append(self.browsers.end)
        self._build_learning()
        # Last, so nothing above can fail while the lock is held: one Steward per data dir.
        try:
            self.lock = acquire(self.data_dir, subcommand)
        except DataDirLocked as exc:
            raise ConfigError(in_use_message(exc, subcommand, settings)) from None
        self._build_usage()
        self._build_history()
        self._build_proactive()
        self._build_dispatcher(subcommand)
        self._build_budgets()
        self._build_schedules()
        self._build_goals()
        self._build_mcp()
        self._build_skills()
        self._build_workflows()
        #: Whether `start` arms the schedules' timers. Off for `steward chat -m` and piped
        #: chat: a one-shot exchange must not run (or print) a schedule's work.
        self.fire_schedules = True
        #: Whether a channel's start takes up what a previous run of this data dir left
        #: open: its pending approvals (expired visibly), its open offers of help (still
        #: answerable) and its unfinished tasks ("run it again?", core/interrupted.py).
        #: Off for a cluster worker: those folders are every worker's, and one still open
        #: may be waiting on a live worker; a dead one's is taken over when pressed
        #: (bot/cluster/handover.py) and its task asked about by the worker that gets
        #: the event again (bot/cluster/worker.py).
        self.recover_left_open = True
        #: Where the memory index searches its vectors instead of keeping them, when set
        #: before the index opens: a cluster worker's PostgreSQL with pgvector
        #: (memory/cluster/vectors_search.py). None: its own FAISS index, as by default.
        self.vector_backend: Any = None

    def _own_files(self) -> list[Path]:
        """What no command may see and no approval may open: the data dir, the config
        files and the snapshot store (beside the workspace in a cluster, outside the data
        dir: a command that could write it could rewrite what /undo restores)."""
        own = [self.data_dir, *config_files(self.settings)]
        store = store_root(self.settings, self.workspace, self.data_dir)
        if not store.resolve().is_relative_to(self.data_dir.resolve()):
            own.append(store)
        return own

    def _build_sandbox(self) -> SandboxSetup:
        """Decided once, before anything runs: sandboxed, opted out, or fail-closed."""
        settings = self.settings
        try:
            sandbox = sandbox_setup(
                settings.sandbox,
                self.workspace,
                self._own_files(),
                user=parse_user(settings.sandbox_user),
                limits=Limits(
                    processes=settings.sandbox_max_processes,
                    memory_mb=settings.sandbox_max_memory,
                    file_size_mb=settings.sandbox_max_file_size,
                    cpu_seconds=settings.sandbox_max_cpu,
                ),
                state_dir=self.data_dir / "sandbox",
            )
        except SandboxRequired as exc:
            raise ConfigError(str(exc)) from None
        applog = structlog.get_logger("steward.app")
        if sandbox.fallback:
            applog.warning("sandbox.unavailable", reason=sandbox.fallback)
        else:
            applog.info("sandbox.ready", mode=settings.sandbox, sandbox=sandbox.describe())
        return sandbox

    def _build_memory(self) -> None:
        """The stores of the data dir: conversations, episodes, the task journal, rules."""
        self.conversations = Conversations(self.clock)
        self.episodes = EpisodeStore(self.data_dir)
        self.health = health_for(self.data_dir)  # failed memory writes, said out loud
        self.journal = TaskJournal(self.data_dir)
        self.datastore = DataStore(self.data_dir)
        self.rules = RuleStore(self.data_dir, self.datastore)
        self.learning = LearningConfig.from_settings(self.settings)

    def _build_safety(self) -> None:
        """Snapshots for /undo, where connections may go, the guardian, who may talk to
        Steward, and approvals."""
        settings = self.settings
        # Snapshots before a task's changes (core/snapshots): /undo, and deletions inside
        # the workspace that a snapshot covers need no approval (`undoable_deletes`).
        self.undo = undo_from_settings(settings, self.workspace, self.data_dir)
        # Where the tools' connections may go (core/egress): the internet and the owner's
        # `egress_allow`, never Steward's own servers (the embedded model's, once it runs).
        self.egress = egress_from_settings(
            settings, more_protected=lambda: server_endpoints(getattr(self, "local", None))
        )
        self.guardian = Guardian(
            self.workspace,
            overlay_path=self.data_dir / "policy.toml",
            undoable=(
                self.undo.store.covers
                if self.undo is not None and undoable_deletes(settings, self.undo)
                else None
            ),
            egress=self.egress,
            own_paths=[*self._own_files()[1:], *own_paths()],
        )
        self.access = Access.from_settings(settings, data_dir=self.data_dir, clock=self.clock)
        self.suggestions = Suggestions(self.clock, self.data_dir)
        self.approvals = Approvals(
            self.clock,
            ApprovalStore(self.data_dir),
            timeout=settings.approval_timeout,
            approvers=settings.approvers,
            always_allow=lambda tool, args, user: self.guardian.always_allow(
                tool, args, added_by=user
            ),
            pin=self.guardian.pin,
        )

    def _build_model(
        self, env: Mapping[str, str], local_command: Callable[[int], list[str]] | None
    ) -> None:
        """The configured model (with its worker processes under load), else the embedded
        local model when it is wanted and installed, else none (`_no_model` says why)."""
        settings = self.settings
        self.llm: LLMClient | LocalLLM | None = None
        #: Worker processes for model calls under load (core/model/workers.py).
        self.llm_workers: WorkerPool | None = (
            WorkerPool(
                settings.llm_workers,
                settings.llm_worker_threshold,
                others=lambda: self.conversations.running - 1,
                idle_cores=IdleCores(),  # a worker starts only while a core is idle
            )
            if settings.llm_workers > 0 and settings.model_configured
            else None
        )
        self.local: ModelServer | None = None
        self._no_model = NO_MODEL_MESSAGE
        if settings.model_configured:
            self.llm = LLMClient(
                model=settings.model.strip(),
                clock=self.clock,
                api_base=settings.api_base.strip(),
                api_key=settings.api_key,
                timeout=settings.llm_timeout,
                retries=settings.llm_retries,
                backoff=settings.llm_backoff,
                backoff_max=settings.llm_backoff_max,
                first_notice=settings.llm_first_notice,
                max_tokens=settings.max_tokens,
                temperature=settings.temperature,
                stream=settings.stream,
                workers=self.llm_workers,
                fallbacks=[
                    Target(f.model, f.api_base, f.key(env)) for f in settings.fallback_models
                ],
                cooldown=settings.fallback_cooldown,
                prices=settings.model_prices,
            )
        elif embedded_wanted(settings, env):
            self.local = self._local_server(local_command)
            if self.local is None:
                self._no_model = no_model_message(settings, env)
            else:
                self.llm = LocalLLM(
                    server=self.local,
                    clock=self.clock,
                    timeout=settings.llm_timeout,
                    max_tokens=settings.local_model_max_tokens,
                    stream=settings.stream,
                    mode=settings.local_model_mode,
                )

    def _build_code(self) -> None:
        """The code indexes the code_* tools answer from (core/code; docs/code.md): one
        per workspace under the data dir, opened on the first question about code."""
        self.code = CodeIntel.from_settings(self.settings, self.data_dir)

    def _build_browser(self) -> None:
        """The browser tools' Chromium, one per task (core/browser; docs/browser.md), when
        it is installed and the OS sandbox works; else the tools are not offered."""
        settings = self.settings
        sandbox = self.sandbox.sandbox
        why = browser_unavailable(settings.browser_enabled, settings.browser_chromium, sandbox)
        self.browsers: Browsers | None = None
        if why is not None or sandbox is None:
            if settings.browser_enabled:
                structlog.get_logger("steward.app").info("browser.unavailable", reason=why)
            return
        self.browsers = Browsers(
            BrowserConfig(settings.browser_chromium, settings.browser_timeout),
            workspace=self.workspace,
            sandbox=sandbox,
            egress=self.egress,
        )

    def _build_agent(self) -> Agent | None:
        """The agent, when there is a model; with the embedded model, its reduced tool set
        (constrained mode) and step cap."""
        settings = self.settings
        if self.llm is None:
            return None
        builtin = dict(ALL_TOOLS)
        if settings.delegate_depth > 0:  # children of a task (core/delegate.py)
            builtin[DELEGATE_TOOL.name] = DELEGATE_TOOL
        max_steps = settings.max_steps
        if isinstance(self.llm, LocalLLM):
            if settings.local_model_mode == "constrained":
                builtin = {name: ALL_TOOLS[name] for name in LOCAL_TOOLS}
            max_steps = settings.local_model_max_steps
        if self.browsers is None:  # no Chromium or no OS sandbox here: not offered
            builtin = {n: t for n, t in builtin.items() if n not in BROWSER_TOOL_NAMES}
        #: The built-in tools plus those that come and go (MCP servers, skills): sources
        #: are added by the steps that build them.
        tools = self.toolbox = Toolbox(builtin)
        if self.browsers is not None:  # the page tools once a task has opened a page
            tools.offer_when(self.browsers.offered)
        return Agent(
            llm=self.llm,  # type: ignore[arg-type]  # LocalLLM has the same complete()
            tools=tools,
            tool_context=ToolContext(
                workspace=self.workspace,
                shell_timeout=settings.shell_timeout,
                output_cap=settings.output_cap,
                fetch_timeout=settings.fetch_timeout,
                fetch_max_bytes=settings.fetch_max_bytes,
                sandbox=self.sandbox.sandbox,
                sandbox_env=tuple(settings.sandbox_env),
                egress=self.egress,
                search=search_from_settings(settings, self.egress, self.clock),
                code=self.code,
                browser=self.browsers,
            ),
            ask_every_shell=self.sandbox.fallback,
            guardian=self.guardian,
            approvals=self.approvals,
            episodes=self.episodes,
            clock=self.clock,
            max_steps=max_steps,
            task_timeout=settings.task_timeout,
            recall_limit=settings.recall_limit,
            recall_budget=settings.recall_budget,
            context_budget=settings.context_budget,
            journal=self.journal,
            undo=self.undo,
            max_children=settings.max_children,
            delegate_depth=settings.delegate_depth,
            delegate_max_steps=settings.delegate_max_steps,
            delegate_max_tokens=settings.delegate_max_tokens,
            answer_gates=settings.answer_gates,
        )

    def _build_learning(self) -> None:
        """The model that writes (summaries, rule drafts, offers of help), the learner and
        the episode writer, handed to the agent."""
        agent = self.agent
        # Summaries, rule drafts and offers of help need a model that can follow such an
        # instruction; the tiny local model cannot, so with it summaries are extractive,
        # drafts wait in learning/pending/ for a real model, and offers use a template.
        self.writer: LLMClient | None = self.llm if isinstance(self.llm, LLMClient) else None
        self.learner = Learner(self.rules, self.clock, self.learning, drafter=self.writer)
        if agent is not None:
            agent.learner = self.learner
        # Episodes are journaled before the reply and written after it (core/persist.py).
        self.persist = EpisodeWriter(
            self.episodes, self.journal, index=self._index_episodes, activity=self.clock.activity
        )
        if agent is not None:
            agent.persist = self.persist

    def _build_usage(self) -> None:
        """The usage ledger (memory/usage.py) and the meter that records every model call
        in it, for its payer (core/spend). Set before anything copies the client (the
        proactive service does); with the embedded model, on its inner client only, so
        each call is recorded once. With the data dir locked: one writer of its files."""
        from core.spend.meter import SpendMeter
        from memory.usage import UsageLedger

        tz = getattr(self.settings, "budget_timezone", "UTC")
        #: Every model call of this Steward: /usage, `steward usage`, the dashboard's Spend.
        self.usage = UsageLedger(self.data_dir / "usage", self.clock.now, tz)
        #: What the model client asks before each call (caps) and tells after it.
        self.meter = SpendMeter(self.usage, self.clock.now)
        if isinstance(self.llm, LLMClient):
            self.llm.meter = self.meter
        elif isinstance(self.llm, LocalLLM):  # its calls all go through this client
            self.llm._inner.meter = self.meter

    def _build_history(self) -> None:
        """The data dir as a git repository, its batched commits, and each conversation's
        transcript and summary (with the data dir locked)."""
        settings = self.settings
        self.datastore.ensure_repo()  # the data dir is a git repository
        # Episodes, conversations and proactive state reach its history in batches.
        self.memory_history = MemoryHistory(self.datastore, self.health)
        self._last_commit = self.clock.now()
        self._committing: asyncio.Task[str | None] | None = None
        # Verbatim turns get what recall and the summary leave of the context budget.
        turns_share = max(
            200, settings.context_budget - settings.recall_budget - settings.summary_budget
        )
        self.history = History(
            TranscriptStore(self.data_dir),
            self.clock,
            summarizer=model_summarizer(self.writer) if self.writer is not None else None,
            max_turns=settings.history_turns,
            budget_tokens=turns_share,
            summary_tokens=settings.summary_budget,
        )

    def _build_proactive(self) -> None:
        self.proactive = Proactive(
            ProactiveConfig.from_settings(self.settings),
            clock=self.clock,
            data_dir=self.data_dir,
            suggestions=self.suggestions,
            conversations=self.conversations,
            llm=self.writer,
            sink=self.learner,  # recurring failures it sees are evidence for the learner
        )

    def _build_dispatcher(self, subcommand: str) -> None:
        """The dispatcher every channel hands its events to, and the activity it reports."""
        settings = self.settings
        self.dispatcher = Dispatcher(
            conversations=self.conversations,
            history=self.history,
            approvals=self.approvals,
            agent=self.agent,
            access=self.access,
            suggestions=self.suggestions,
            policy=self.guardian,
            no_model_message=self._no_model,
            learner=self.learner,
            rules_commands=RulesCommands(self.rules, self.clock, self.learning),
            rules_admins_only=settings.rules_admins_only,
            proactive=self.proactive,
            interrupted=Interrupted(
                self.journal,
                self.episodes,
                self.clock,
                after_episode=self._index_episode,
                resume_queued=settings.resume_queued,
            ),
            write_health=self.health,
            # Redeliveries are dropped across restarts; not in replay, whose message ids
            # are a scenario's line numbers, the same in every run on a data dir.
            seen=SeenEvents(self.data_dir) if subcommand != "replay" else None,
            admin_rooms=AdminRooms(self.data_dir),
        )
        #: Running and recent tasks of every channel, from the same progress events the
        #: chat gets (the dashboard's Now page).
        self.activity = Activity()
        self.dispatcher.monitor = self.activity.observe
        from bot.commands.usage import register as register_usage_commands

        register_usage_commands(self.dispatcher.router, self.usage, self.meter)

    def _build_budgets(self) -> None:
        """The day caps (core/spend/budget.py), asked by the meter before every model
        call, and /budget. Notices go to a person's conversation through the channels."""
        from bot.commands.budget import register as register_budget_commands
        from core.spend.budget import Budgets, Limits
        from core.spend.notices import ChatNotices
        from memory.budgets import BudgetOverrides

        #: The caps; `/usage` lists what is left (`left(payer)`), /healthz what was reached.
        self.budgets = Budgets(
            Limits.from_settings(self.settings),
            BudgetOverrides(self.data_dir),
            self.usage,
            self.clock,
            ChatNotices(self._channel, self.dispatcher.admin_rooms),
        )
        self.meter.caps = self.budgets
        register_budget_commands(self.dispatcher.router, self.budgets)

    def _channel(self, name: str) -> Outbox | None:
        """A started channel (its Outbox) by name; None while it is not running here."""
        return next((c for c in self.channels if c.name == name), None)

    def _build_schedules(self) -> None:
        """Schedules run through the same agent and conversation queues as messages and
        post through the channels' Outboxes; armed once the channels have started."""
        agent = self.agent
        self.schedules = Scheduler(
            ScheduleStore(self.data_dir, self.datastore),
            self.clock,
            ScheduleConfig.from_settings(self.settings),
            Deps(
                agent=agent,
                conversations=self.conversations,
                channel_for=self._channel,
                guardian=self.guardian,
                tool_context=agent.tool_context if agent is not None else None,
                ask_every_shell=self.sandbox.fallback,
                access=self.access,
                history=self.history,
                learner=self.learner,
                monitor=self.activity.observe,
            ),
        )
        self.schedules.load()
        register_schedule_commands(self.dispatcher.router, ScheduleCommands(self.schedules))

    def _build_goals(self) -> None:
        """Goals (their steps are jobs of the same conversation queues, as the goal's
        owner), and /undo's commands."""
        #: The goal engine (core/goals/engine.py); the dashboard shows its goals.
        self.goals: Any = GoalEngine(
            GoalQueue(self.data_dir, self.datastore),
            self.clock,
            GoalConfig.from_settings(self.settings),
            GoalDeps(
                agent=self.agent,
                llm=self.llm,
                conversations=self.conversations,
                channel_for=self._channel,
                approvals=self.approvals,
                access=self.access,
                learner=self.learner,
                monitor=self.activity.observe,
            ),
        )
        self.goals.load()
        register_goal_commands(self.dispatcher.router, GoalCommands(self.goals))
        if self.undo is not None:
            register_undo_commands(self.dispatcher.router, self.undo)

    def _build_skills(self) -> None:
        """Skills (core/skills): `use_skill` offered while one is enabled (not to the tiny
        local model, which cannot follow them), its judge, /skills, and offers to save a
        task that worked as a skill."""
        settings = self.settings
        #: The skills of the data dir and the workspace (docs/skills.md).
        self.skills = skills_for(self.data_dir, self.workspace, self.datastore, self.clock)
        self.guardian.add_judge(SkillJudge())
        if self.agent is not None and not (
            isinstance(self.llm, LocalLLM) and settings.local_model_mode == "constrained"
        ):
            self.toolbox.add_source("skills", SkillSource(self.skills))
        self.skill_offers = Proposals(
            self.skills,
            self.clock,
            self.data_dir,
            enabled=settings.skills_propose and self.agent is not None,
            min_steps=settings.skills_propose_steps,
            may_save=self.access.is_admin,
        )
        self.dispatcher.after_task.append(self.skill_offers.after_task)
        register_skill_commands(
            self.dispatcher.router, SkillsCommands(self.skills), self.skill_offers
        )

    def _build_workflows(self) -> None:
        """Learned workflows (core/workflows; docs/workflows.md): saved ones as tools
        `wf__<name>` and direct runs of a request that fully matches one (not with the
        tiny local model, which cannot fill their inputs), the learner that offers to save
        a request done the same way `workflows_min_runs` times, and /workflows."""
        settings = self.settings
        #: The data dir's workflows/ (the dashboard and /workflows read it too).
        self.workflow_store = WorkflowStore(self.data_dir, self.datastore, self.clock)
        self.workflows = Workflows(
            self.workflow_store,
            enabled=settings.workflows_enabled,
            direct=settings.workflows_direct,
            step_deadline=settings.workflows_step_deadline,
            judge_threshold=settings.workflows_judge_threshold,
            retire_after=settings.workflows_retire_losses,
        )
        agent = self.agent
        constrained = isinstance(self.llm, LocalLLM) and settings.local_model_mode == "constrained"
        usable = agent is not None and not constrained and settings.workflows_enabled
        if usable:
            assert agent is not None
            agent.workflows = self.workflows
            self.toolbox.add_source("workflows", self.workflows.tools)

        def allowed(platform: str, user: str, tool: str) -> bool:
            """A workflow may only call tools this Steward offers the person's tasks
            (never another workflow or a child: those are not steps)."""
            if tool == DELEGATE_TOOL.name or tool.startswith("wf__") or agent is None:
                return False
            return tool in agent.tools

        self.workflow_offers = WorkflowLearner(
            self.workflow_store,
            self.clock,
            self.data_dir,
            drafter=self.writer,
            allowed=allowed,
            workspace=self.workspace,
            enabled=usable and settings.workflows_propose,
            min_runs=settings.workflows_min_runs,
        )
        self.dispatcher.after_task.append(self.workflow_offers.after_task)
        register_workflow_commands(
            self.dispatcher.router,
            self.workflow_store,
            self.workflow_offers if usable and settings.workflows_propose else None,
        )

    def _build_mcp(self) -> None:
        """MCP servers (core/mcp; docs/mcp.md): their tools join the toolbox (not the tiny
        local model's), every call of one passes their judge, /mcp lists them. They are
        started with the channels (`start`), when there is an agent to use them."""
        settings = self.settings
        #: Every declared server's connection and tools (the dashboard shows them).
        self.mcp = McpHub(
            settings.mcp,
            plan=functools.partial(
                mcp_plan,
                setup=self.sandbox,
                data_dir=self.data_dir,
                hidden=self._own_files(),
            ),
            egress=self.egress,
        )
        self.guardian.add_judge(McpJudge(self.mcp.find))
        self._mcp_wanted = self.agent is not None and not (
            isinstance(self.llm, LocalLLM) and settings.local_model_mode == "constrained"
        )
        if self._mcp_wanted:
            self.toolbox.add_source("mcp", self.mcp.tools)
        register_mcp_commands(self.dispatcher.router, self.mcp, self.guardian)

    def _local_server(self, command: Callable[[int], list[str]] | None) -> ModelServer | None:
        log_path = self.data_dir / "local-model.log"
        if command is not None:
            return server_for(self.settings, command, log_path=log_path)
        found = availability(self.settings.local_model_path.strip())
        if not found.ok or found.gguf is None:
            return None
        return server_for(self.settings, found.gguf, log_path=log_path)

    def warm_up(self) -> None:
        """Import litellm in a thread now, so the first message doesn't wait seconds for it.

        A daemon thread, not the loop's executor: asyncio joins its executor's threads
        when the loop closes, so a SIGTERM in the first seconds after start waited for
        the whole import (seconds, tens of them on a busy machine) before the process
        could exit. An import cut off by the exit leaves nothing behind."""
        if self.llm is None:
            return
        from core.model.client import load_litellm

        threading.Thread(target=load_litellm, name="steward-warm-up", daemon=True).start()

    @property
    def notice(self) -> str | None:
        """The banner for the terminal and the web chat: the tiny local model, or no
        model; and no OS sandbox, when commands cannot have one here."""
        model: str | None
        if self.local is not None:
            model = LOCAL_MODEL_NOTICE
        else:
            model = None if self.agent is not None else self._no_model
        parts = [p for p in (model, self.sandbox.notice) if p]
        return "\n\n".join(parts) if parts else None

    async def start(
        self, channels: Sequence[Channel], *, failures: dict[str, BaseException] | None = None
    ) -> list[Outbox]:
        """Start each adapter behind its Outbox (the shared delivery layer); the dispatcher
        and approvals only ever see the Outbox.

        The channels start concurrently (a slow platform must not hold up the others).
        Recovery is per channel: as a channel comes up, the approvals and suggestions a
        previous run left on it are recovered and their messages edited, while those of
        channels not started yet wait for them (the stored records are read once). The
        Outbox is what is started, so its "alive but deaf" watchdog runs.

        `failures`: given, a channel that fails to start is recorded there by name and the
        others go on (`steward run`: one platform down must not keep the rest down);
        otherwise the first failure is raised after all have been tried."""
        await self.initialize()
        if self._mcp_wanted:  # before the channels, so the first message sees their tools
            await self.mcp.start()  # (a server slow to start holds them START_WAIT at most)
        results = await asyncio.gather(
            *(self._start_one(adapter) for adapter in channels), return_exceptions=True
        )
        started: list[Outbox] = []
        errors: list[BaseException] = []
        for adapter, result in zip(channels, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                errors.append(result)
                if failures is not None:
                    failures[adapter.name] = result
            else:
                started.append(result)
        if errors and failures is None:
            raise errors[0]
        if self.fire_schedules:  # after the channels: a due run needs its channel
            await self.schedules.start()
            await self.goals.start()
        _freeze_startup_heap()
        return started

    async def _start_one(self, adapter: Channel) -> Outbox:
        outbox = wrap(adapter, self.settings, self.clock, self.data_dir)
        await outbox.start(self.dispatcher.bind(outbox))
        self.channels.append(outbox)
        mine: dict[str, Channel] = {outbox.name: outbox}
        if self.recover_left_open:
            async with self._recovering:  # one channel's recovery at a time: shared records
                await self.approvals.recover(mine)
                await self.proactive.recover(await self.suggestions.recover(mine))
                if self.dispatcher.interrupted is not None:
                    await self.dispatcher.interrupted.recover(mine)
        try:  # what a previous run could not deliver on this channel goes out now
            await outbox.redeliver()
        except Exception:  # never worth failing a start for: kept, tried again later
            structlog.get_logger("steward.app").warning(
                "delivery.redeliver_at_start_failed", channel=outbox.name, exc_info=True
            )
        return outbox

    async def initialize(self) -> None:
        """Before any channel starts (python-telegram-bot's Application has the same step):
        open the memory index and read what a previous run left pending, once and off the
        event loop, so a request of a channel that never starts still answers "expired"
        to a late press. Safe to call again."""
        await self.open_memory()
        if not self._initialized:
            self._initialized = True
            if self.dispatcher.seen is not None:  # read off the loop, before any message
                await asyncio.to_thread(self.dispatcher.seen.load)
            if self.undo is not None:  # an undo a crash cut short is finished first
                await self.undo.recover()
                self.undo.warm()
            # Files that cannot be read are set aside and shown (memory/quarantine.py): the
            # rules (and again before each task), the episodes the index could not read;
            # approvals as the next line reads them (their messages are expired).
            from memory.quarantine import quarantine_for

            self.rules.quarantine = quarantine_for(self.data_dir)
            await asyncio.to_thread(self.rules.quarantine.sweep)
            await self.approvals.recover({})  # loads the records; recovers no channel yet

    async def open_memory(self) -> None:
        """Open (and if needed rebuild) the memory index; wire recall and indexing."""
        if self.index is not None:
            return
        from core.recall import IndexRecall
        from memory.index import MemoryIndex

        embedder = await configured_embedder(self.settings)
        self.index = await MemoryIndex.open(
            self.data_dir, embedder, progress=False, vector_backend=self.vector_backend
        )
        if self.agent is not None:
            if self.settings.recall_limit:
                self.agent.recall = IndexRecall(self.index)
            self.agent.after_episode = self._index_episode
        from memory.embedder import LiteLLMEmbedder

        if isinstance(embedder, LiteLLMEmbedder):  # an embedding model's calls are usage too
            embedder.on_usage = self.meter.record_embedding
        self.learner.embedder = embedder
        self.learner.counter = self.index
        self.learner.index = self.index
        # Drafts that waited for the model are retried in the background: a model call
        # must not hold up start-up (and the model may still be down).
        self._pending = asyncio.create_task(self._retry_drafts(), name="learning:pending")

    async def _index_episode(self, path: Path) -> None:
        """Index an episode (after a task, or an interrupted one), when the index is open;
        a failed index write counts as a failed memory write (/healthz, doctor, the
        person), although a rebuild can restore it: until then recall misses it."""
        self._commit_soon()
        if self.index is not None:
            index = self.index
            await self.health.guard(
                "index", index.sqlite_path, lambda: index.add_episode_file(path)
            )

    async def _index_episodes(self, files: list[Written]) -> None:
        """A batch of episodes written by core/persist.py: one index call for all."""
        self._commit_soon()
        if self.index is not None:
            index = self.index
            await self.health.guard(
                "index", index.sqlite_path, lambda: index.add_episode_files(files)
            )

    def _commit_soon(self) -> None:
        """After a task: commit the memory written since the last batch, in the background,
        when the last batch is COMMIT_EVERY seconds old (docs/memory.md)."""
        if self.clock.now() - self._last_commit < COMMIT_EVERY:
            return
        if self._committing is not None and not self._committing.done():
            return
        self._last_commit = self.clock.now()
        self._committing = asyncio.create_task(self.memory_history.flush(), name="memory:commit")

    async def _retry_drafts(self) -> None:
        try:
            await self.learner.retry_pending()
        except Exception:
            structlog.get_logger("steward.app").warning("learning.retry_failed", exc_info=True)

    async def stop(self) -> None:
        """Stop everything, each step bounded in time and run whatever the one before
        raised: with a full disk, closing the index failed, the steps after it never
        ran, and the process never exited."""
        try:
            await self._stop_channels()
            await _bounded("mcp servers", self.mcp.stop(), STOP_STEP_TIMEOUT)
            if self.browsers is not None:  # tasks close their own; a stop cut some off
                await _bounded("browsers", self.browsers.stop(), STOP_STEP_TIMEOUT)
            await _bounded("episodes", self.persist.stop(), STOP_STEP_TIMEOUT)
            await _bounded("transcripts", self.history.drain(), STOP_STEP_TIMEOUT)
            await _bounded("drafts", self._stop_pending(), STOP_STEP_TIMEOUT)
            if self.local is not None:
                await _bounded("local model", self.local.stop(), STOP_STEP_TIMEOUT)
            if self.llm_workers is not None:
                await _bounded("model workers", self.llm_workers.stop(), STOP_STEP_TIMEOUT)
            if self.index is not None:
                index, self.index = self.index, None
                await _bounded("memory index", index.close(), STOP_STEP_TIMEOUT)
            await _bounded("memory history", self._last_batch(), STOP_STEP_TIMEOUT)
            await _bounded("code index", asyncio.to_thread(self.code.close), STOP_STEP_TIMEOUT)
            await _bounded("usage ledger", self.usage.close(), STOP_STEP_TIMEOUT)
        finally:
            try:
                self.datastore.close()
            finally:
                self.lock.release()

    async def _last_batch(self) -> None:
        """What was written since the last batch is committed before the store closes."""
        if self._committing is not None:
            await asyncio.gather(self._committing, return_exceptions=True)
        await self.memory_history.flush()

    async def _stop_pending(self) -> None:
        if self._pending is not None:
            # A short grace for a draft in flight; an unfinished one stays pending on disk.
            await asyncio.wait({self._pending}, timeout=2.0)
            self._pending.cancel()
            await asyncio.gather(self._pending, return_exceptions=True)

    async def _stop_channels(self) -> None:
        # No new scheduled run starts; one in flight is run again at the next start.
        await _bounded("schedules", self.schedules.stop(), STOP_STEP_TIMEOUT)
        await _bounded("goals", self.goals.shutdown(), STOP_STEP_TIMEOUT)
        await _bounded("proactive", self.proactive.stop(), STOP_STEP_TIMEOUT)
        self.journal.stopping = True  # tasks cut off now stay in the journal
        await _bounded("tasks", self.conversations.stop(), STOP_STEP_TIMEOUT)
        for channel in reversed(self.channels):  # one failing must not keep the others up
            await _bounded(f"channel {channel.name}", channel.stop(), STOP_STEP_TIMEOUT)
        self.channels.clear()


#: How long one step of `App.stop` may take before the next runs anyway (seconds).
STOP_STEP_TIMEOUT = 3.0


async def _bounded(step: str, work: Awaitable[Any], limit: float) -> None:
    """Await one shutdown step; a failure or a step that hangs is logged, never raised,
    so the steps after it (closing SQLite, releasing the lock) still run."""
    try:
        async with asyncio.timeout(limit):
            await work
    except TimeoutError:
        structlog.get_logger("steward.app").warning("app.stop_timeout", step=step, after=limit)
    except Exception:
        structlog.get_logger("steward.app").warning("app.stop_failed", step=step, exc_info=True)
