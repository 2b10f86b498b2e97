"""Settings: config/default.toml, then steward.toml, then STEWARD_* environment variables.

Why three layers in this order: the defaults file documents every key in one
place, a deployment's steward.toml is versionable, and environment variables win
because that is how a Procfile/PaaS world configures a process (12-factor).

Every mistake becomes a `ConfigError` that names the key, where it came from, the
value and the fix; a person should never have to read a pydantic traceback.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
)

from config import mcp as mcp_tables
from config import platforms
from config.model_chain import (
    ChainError,
    FallbackModel,
    ModelPrice,
    parse_fallback_models,
    parse_model_prices,
)
from config.platforms import PlatformConfig
from config.providers import DEFAULT_CONFIG_NAME

ENV_PREFIX = "STEWARD_"


class ConfigError(Exception):
    """A configuration mistake, worded for the person who has to fix it. `exit_code`:
    what `steward` exits with (2, a setting to fix; 1 when the machine itself is the
    problem, such as a full disk under a folder it names)."""

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _CoreSettings(BaseModel):
    """The validated settings. Field docs live in config/default.toml beside the values;
    each platform's fields (`<platform>_<key>`) come from config/platforms.py."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    api_base: str
    api_key: str = Field(repr=False)
    data_dir: Path
    workspace: Path
    host: str
    port: int = Field(ge=0, le=65535)
    public_url: str
    max_steps: int = Field(ge=1, le=200)
    task_timeout: float = Field(gt=0)
    answer_gates: bool
    resume_queued: bool
    llm_timeout: float = Field(gt=0)
    llm_retries: int = Field(ge=0, le=20)
    llm_backoff: float = Field(ge=0)
    llm_backoff_max: float = Field(ge=0)
    llm_first_notice: float = Field(ge=0)
    llm_workers: int = Field(ge=0, le=16)
    llm_worker_threshold: int = Field(ge=1)
    #: Models to try, in order, when the main one does not answer (config/model_chain.py).
    fallback_models: list[FallbackModel]
    fallback_cooldown: float = Field(ge=0)
    #: An operator's prices per model (USD per million tokens); they win over litellm's.
    model_prices: dict[str, ModelPrice]
    max_tokens: int = Field(ge=0)
    temperature: float = Field(ge=-1, le=2)
    stream: bool
    history_turns: int = Field(ge=0)
    context_budget: int = Field(ge=200)
    summary_budget: int = Field(ge=50)
    shell_timeout: float = Field(gt=0)
    sandbox: Literal["auto", "off", "required"]
    sandbox_user: str
    sandbox_env: list[str]
    sandbox_max_processes: int = Field(ge=0)
    sandbox_max_memory: int = Field(ge=0)
    sandbox_max_file_size: int = Field(ge=0)
    sandbox_max_cpu: int = Field(ge=0)
    output_cap: int = Field(ge=200)
    fetch_timeout: float = Field(gt=0)
    fetch_max_bytes: int = Field(ge=1024)
    egress_allow: list[str]
    mcp_config: str
    search_backend: Literal["duckduckgo", "searxng", "brave", "tavily"]
    search_fallback: Literal["", "duckduckgo", "searxng", "brave", "tavily"]
    search_url: str
    search_timeout: float = Field(gt=0)
    search_cache_ttl: float = Field(ge=0)
    brave_api_key: str = Field(repr=False)
    brave_api_url: str
    tavily_api_key: str = Field(repr=False)
    tavily_api_url: str
    browser_enabled: bool
    browser_chromium: str
    browser_timeout: float = Field(gt=0)
    approval_timeout: float = Field(gt=0)
    log_format: Literal["auto", "json", "console"]
    log_level: Literal["debug", "info", "warning", "error"]
    pairing: bool
    pairing_code_ttl: float = Field(gt=0)
    approvers: dict[str, list[str]]
    web_password: str = Field(repr=False)
    #: The cluster (docs/cluster.md): NATS JetStream and PostgreSQL; both empty: one process.
    cluster_url: str = Field(repr=False)
    database_url: str = Field(repr=False)
    worker_id: str
    cluster_name: str
    worker_tasks: int = Field(ge=1, le=1000)
    cluster_ack_wait: float = Field(ge=3, le=3600)
    #: Where a cluster's workers search memory's vectors (docs/cluster.md#vectors).
    cluster_vectors: Literal["auto", "pgvector", "faiss"]
    embedding_model: str
    recall_limit: int = Field(ge=0, le=50)
    recall_budget: int = Field(ge=0)
    learning_enabled: bool
    learning_recurrence: int = Field(ge=1)
    learning_window_days: float = Field(gt=0)
    learning_initial_confidence: float = Field(gt=0, le=1)
    learning_promote_confidence: float = Field(gt=0, le=1)
    learning_promote_trials: int = Field(ge=1)
    learning_demote_confidence: float = Field(ge=0, le=1)
    learning_up: float = Field(gt=0, le=1)
    learning_down: float = Field(gt=0, le=1)
    learning_alternatives: int = Field(ge=1, le=5)
    learning_match: float = Field(ge=0, le=1)
    learning_merge_similarity: float = Field(gt=0, le=1)
    rules_max_per_task: int = Field(ge=0)
    rules_budget: int = Field(ge=0)
    rules_admins_only: bool
    skills_propose: bool
    skills_propose_steps: int = Field(ge=1)
    max_children: int = Field(ge=1, le=16)
    delegate_depth: int = Field(ge=0, le=4)
    delegate_max_steps: int = Field(ge=1, le=200)
    delegate_max_tokens: int = Field(ge=1000)
    workflows_enabled: bool
    workflows_propose: bool
    workflows_min_runs: int = Field(ge=2, le=20)
    workflows_direct: bool
    workflows_retire_losses: int = Field(ge=1)
    workflows_judge_threshold: float = Field(ge=0, le=1)
    workflows_step_deadline: float = Field(gt=0)
    delivery_retries: int = Field(ge=0, le=20)
    delivery_backoff: float = Field(ge=0)
    delivery_backoff_max: float = Field(ge=0)
    delivery_late_notice: float = Field(ge=0)
    proactive_enabled: bool
    proactive_threshold: float = Field(gt=0)
    proactive_cooldown: float = Field(ge=0)
    proactive_half_life: float = Field(gt=0)
    proactive_refusals: float = Field(gt=0)
    proactive_refusal_window: float = Field(gt=0)
    proactive_ignore_after: float = Field(ge=0)
    proactive_ignored_weight: float = Field(ge=0)
    proactive_threshold_step: float = Field(ge=1)
    proactive_cooldown_step: float = Field(ge=1)
    proactive_threshold_max: float = Field(gt=0)
    proactive_cooldown_max: float = Field(ge=0)
    proactive_restore: float = Field(ge=0, le=1)
    proactive_refusal_nudge: float = Field(ge=0, le=1)
    proactive_welcome: float = Field(ge=0)
    proactive_welcome_memory: float = Field(ge=0)
    proactive_quick_cancel: float = Field(ge=0)
    proactive_silence: float = Field(ge=0)
    proactive_repeat_similarity: float = Field(gt=0, le=1)
    proactive_reask: float = Field(ge=0)
    proactive_corrections: str
    proactive_help_words: str
    proactive_timezone: str
    proactive_recurring: int = Field(ge=1)
    proactive_recurring_window: float = Field(gt=0)
    proactive_weight_failure: float = Field(ge=0)
    proactive_weight_error: float = Field(ge=0)
    proactive_weight_quick_cancel: float = Field(ge=0)
    proactive_weight_repeat: float = Field(ge=0)
    proactive_weight_correction: float = Field(ge=0)
    proactive_weight_silence: float = Field(ge=0)

    schedule_timezone: str
    schedule_max_tokens_run: int = Field(ge=0)
    schedule_max_tokens_day: int = Field(ge=0)
    schedule_repeat_window: float = Field(ge=0)
    schedule_failure_backoff: float = Field(ge=0)
    schedule_failure_backoff_max: float = Field(ge=0)
    schedule_misfire_grace: float = Field(ge=0)
    schedule_min_interval: float = Field(gt=0)
    schedule_outside_hours: Literal["defer", "skip"]

    goal_max_tokens: int = Field(ge=0)
    goal_max_usd: float = Field(ge=0)
    goal_day_max_tokens: int = Field(ge=0)
    goal_day_max_usd: float = Field(ge=0)
    goal_usd_per_mtok: float = Field(ge=0)
    goal_max_tasks: int = Field(ge=1)
    goal_task_retries: int = Field(ge=0)
    goal_task_cost: int = Field(ge=1)
    goal_max_proposals: int = Field(ge=0)
    goal_min_why_words: int = Field(ge=0)
    goal_duplicate_similarity: float = Field(gt=0, le=1)
    goal_review_every: int = Field(ge=0)
    goal_breaker_no_progress: int = Field(ge=0)
    goal_breaker_failures: int = Field(ge=0)
    goal_breaker_velocity_tokens: int = Field(ge=0)
    goal_breaker_velocity_window: float = Field(gt=0)
    goal_progress_every: float = Field(ge=0)

    budget_day_usd: float = Field(ge=0)
    budget_day_tokens: int = Field(ge=0)
    budget_person_day_usd: float = Field(ge=0)
    budget_person_day_tokens: int = Field(ge=0)
    budget_conversation_day_usd: float = Field(ge=0)
    budget_conversation_day_tokens: int = Field(ge=0)
    budget_timezone: str
    budget_warn_at: float = Field(ge=0, lt=1)
    snapshots: bool
    snapshot_keep_days: float = Field(gt=0)
    snapshot_keep_count: int = Field(ge=1)
    snapshot_skip: str
    snapshot_max_file_bytes: int = Field(ge=0)
    #: Where the snapshot store lives; empty: the data dir, or beside the workspace in a
    #: cluster (core/snapshots.store_root).
    snapshot_dir: str
    undoable_deletes: Literal["auto", "on", "off"]
    code_skip: str
    code_max_files: int = Field(ge=1)
    code_max_file_bytes: int = Field(ge=1024)

    local_model: Literal["auto", "off"]
    local_model_path: str
    local_model_host: str
    local_model_port: int = Field(ge=0, le=65535)
    local_model_threads: int = Field(ge=0, le=256)
    local_model_ctx: int = Field(ge=512)
    local_model_max_steps: int = Field(ge=1, le=200)
    local_model_max_tokens: int = Field(ge=16)
    local_model_start_timeout: float = Field(gt=0)
    local_model_mode: Literal["constrained", "native"]

    @field_validator("proactive_timezone", "schedule_timezone", "budget_timezone")
    @classmethod
    def _check_timezone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value.strip() or "UTC")
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"{value!r} is not a known IANA time zone (e.g. UTC, Europe/Berlin)"
            ) from None
        return value.strip() or "UTC"

    @field_validator("egress_allow", "sandbox_env", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        """Accept the env form "wiki.internal, 10.0.0.0/8" (commas or semicolons) as well
        as a TOML list; egress entries are checked when the policy is built (core/egress)."""
        if isinstance(value, str):
            return [part.strip() for part in value.replace(";", ",").split(",") if part.strip()]
        return value

    @field_validator("sandbox_user")
    @classmethod
    def _check_sandbox_user(cls, value: str) -> str:
        """ "auto", or the user as "uid:gid" (a name is looked up here, once)."""
        text = value.strip()
        if text in ("", "auto"):
            return "auto"
        name, _, group = text.partition(":")
        try:
            if name.isdigit():
                uid = int(name)
                gid = int(group) if group else uid
            else:
                import pwd

                entry = pwd.getpwnam(name)
                uid, gid = entry.pw_uid, int(group) if group else entry.pw_gid
        except (KeyError, ValueError):
            raise ValueError('not a user: give a uid, uid:gid, a user name, or "auto"') from None
        if uid == 0:
            raise ValueError('may not be root (uid 0); use "auto" or an unprivileged user')
        return f"{uid}:{gid}"

    @field_validator("approvers", mode="before")
    @classmethod
    def _parse_approvers(cls, value: Any) -> Any:
        """Accept the env form "slack=U1,U2; discord:123=42" as well as a TOML table."""
        if not isinstance(value, str):
            return value
        table: dict[str, list[str]] = {}
        for part in value.split(";"):
            if not part.strip():
                continue
            scope, sep, ids = part.partition("=")
            if not sep or not scope.strip():
                raise ValueError(f"{part.strip()!r} is not `channel[:conversation]=id1,id2`")
            table[scope.strip()] = [i.strip() for i in ids.split(",") if i.strip()]
        return table

    def ids(self, key: str) -> frozenset[str]:
        """A comma-separated id list setting as a set."""
        raw = getattr(self, key)
        return frozenset(i.strip() for i in str(raw).split(",") if i.strip())

    #: Where each value came from ("default", "steward.toml", "env STEWARD_MODEL"), for doctor.
    sources: dict[str, str] = Field(default_factory=dict, exclude=True)
    #: The MCP servers of steward.toml's and `mcp_config`'s [mcp.servers.*] tables
    #: (config/mcp.py); set by load_settings.
    _mcp: mcp_tables.McpConfig = PrivateAttr(default=mcp_tables.EMPTY)

    @property
    def mcp(self) -> mcp_tables.McpConfig:
        """The declared MCP servers (docs/mcp.md)."""
        return self._mcp

    @property
    def model_configured(self) -> bool:
        return bool(self.model.strip())

    def platform(self, name: str) -> PlatformConfig:
        """One platform's settings by their short names (`settings.platform("slack").bot_token`)."""
        found = platforms.spec(name)
        if found is None:
            raise KeyError(f"no platform {name!r} (config/platforms.py)")
        return found.config(self)


def _platform_fields() -> dict[str, Any]:
    """Each registry key as a string field; secrets kept out of reprs."""
    return {
        name: (str, Field(default="", repr=not key.secret))
        for name, key in platforms.setting_keys().items()
    }


if TYPE_CHECKING:

    class Settings(_CoreSettings):
        """What the type checker sees: the core fields, and a string per platform key."""

        def __getattr__(self, name: str) -> str: ...

else:
    #: The settings model: the core fields above plus every platform's, from the registry.
    Settings = create_model("Settings", __base__=_CoreSettings, **_platform_fields())


_EXPECTED = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "Path": "a folder path",
}


def _defaults() -> dict[str, Any]:
    text = resources.files("config").joinpath("default.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def _unknown_key(key: str, origin: str, known: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" Did you mean `{close[0]}`?" if close else ""
    return ConfigError(
        f"Unknown setting `{key}` in {origin}.{hint} "
        f"Known settings are listed in config/default.toml (docs/configuration.md)."
    )


def _env_name(key: str) -> str:
    return ENV_PREFIX + key.upper()


def load_settings(
    config_path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Build the settings, or raise ConfigError saying exactly what to fix.

    `config_path` given explicitly must exist; otherwise ./steward.toml is used when present.
    """
    env = os.environ if env is None else env
    cwd = cwd or Path.cwd()
    values = {**dict.fromkeys(platforms.setting_keys(), ""), **_defaults()}
    known = sorted(values)
    sources = dict.fromkeys(values, "default")

    path: Path | None
    if config_path is not None:
        path = Path(config_path)
        if not path.is_file():
            raise ConfigError(
                f"Config file {path} does not exist. Fix the --config path, or drop --config "
                f"to use ./{DEFAULT_CONFIG_NAME} (optional) and STEWARD_* variables."
            )
    else:
        candidate = cwd / DEFAULT_CONFIG_NAME
        path = candidate if candidate.is_file() else None

    mcp_table: Any = None  # [mcp.servers.*]: not settings, read by config/mcp.py
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}. Fix the line it names.") from exc
        except OSError as exc:
            raise ConfigError(f"Cannot read {path}: {exc}.") from exc
        mcp_table = data.pop("mcp", None)
        for key, value in data.items():
            if key not in values:
                raise _unknown_key(key, str(path), known)
            values[key] = value
            sources[key] = str(path)

    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if key not in values:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean {_env_name(close[0])}?" if close else ""
            raise ConfigError(
                f"Unknown environment variable {name}.{hint} "
                f"Known settings are listed in config/default.toml (docs/configuration.md); "
                f"unset {name} if it is not meant for Steward."
            )
        values[key] = raw
        sources[key] = f"env {name}"

    _platform_defaults(values, sources, env)
    _search_keys(values, sources, env)
    try:
        values["fallback_models"] = parse_fallback_models(
            values["fallback_models"], sources["fallback_models"], env
        )
        values["model_prices"] = parse_model_prices(values["model_prices"], sources["model_prices"])
    except ChainError as exc:
        raise ConfigError(str(exc)) from None

    for key in ("data_dir", "workspace"):
        if isinstance(values.get(key), str) and values[key].strip() == "":
            raise ConfigError(
                f"`{key}` ({sources[key]}) is empty. Set it to a folder path, "
                f"e.g. {_env_name(key)}=./{'.steward' if key == 'data_dir' else 'workspace'}."
            )

    try:
        settings = Settings(**values)
    except ValidationError as exc:
        raise _explain(exc, values, sources) from None

    def absolute(p: Path) -> Path:
        p = p.expanduser()
        return p if p.is_absolute() else (cwd / p)

    settings = settings.model_copy(
        update={
            "data_dir": absolute(settings.data_dir),
            "workspace": absolute(settings.workspace),
            "sources": sources,
        }
    )
    main = (str(path), mcp_table) if path is not None and mcp_table is not None else None
    settings._mcp = _mcp_servers(main, settings.mcp_config, env, cwd)
    return settings


def _mcp_servers(
    main: tuple[str, Any] | None, extra: str, env: Mapping[str, str], cwd: Path
) -> mcp_tables.McpConfig:
    """The MCP servers of steward.toml's [mcp.servers.*] tables (`main`) and of the file
    the `mcp_config` setting names (STEWARD_MCP_CONFIG), config/mcp.py."""
    other: tuple[str, dict[str, Any]] | None = None
    if extra.strip():
        file = Path(extra.strip()).expanduser()
        file = file if file.is_absolute() else cwd / file
        try:
            other = (str(file), tomllib.loads(file.read_text(encoding="utf-8")))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file} is not valid TOML: {exc}. Fix the line it names.") from exc
        except OSError as exc:
            raise ConfigError(
                f"`mcp_config` names {file}, which cannot be read ({exc.strerror or exc}). "
                "Fix STEWARD_MCP_CONFIG (or mcp_config in steward.toml), or unset it."
            ) from exc
    try:
        return mcp_tables.combine(main, other, env)
    except mcp_tables.McpConfigError as exc:
        raise ConfigError(str(exc)) from None


def platform_public_url(env: Mapping[str, str]) -> str:
    """The public base URL a hosting platform announces in its environment, or "".

    Render gives the whole URL; Railway the domain; Fly and Heroku the app's name, whose
    default domain is fixed (a custom domain: set STEWARD_PUBLIC_URL)."""
    if env.get("RENDER_EXTERNAL_URL", "").strip():
        return env["RENDER_EXTERNAL_URL"].strip().rstrip("/")
    if env.get("RAILWAY_PUBLIC_DOMAIN", "").strip():
        return f"https://{env['RAILWAY_PUBLIC_DOMAIN'].strip()}"
    if env.get("FLY_APP_NAME", "").strip():
        return f"https://{env['FLY_APP_NAME'].strip()}.fly.dev"
    if env.get("HEROKU_APP_NAME", "").strip():
        return f"https://{env['HEROKU_APP_NAME'].strip()}.herokuapp.com"
    return ""


def _platform_defaults(
    values: dict[str, Any], sources: dict[str, str], env: Mapping[str, str]
) -> None:
    """What a hosting platform says, where the person did not say otherwise.

    A PaaS (the Procfile's `web: steward run`) gives the port to listen on in PORT and
    routes to the container's interface, not its loopback: bound to 127.0.0.1:8765 the
    deploy never becomes healthy. Settings the person made always win."""
    port = env.get("PORT", "").strip()
    if port and sources.get("port") == "default":
        values["port"] = port
        sources["port"] = "env PORT (set by the hosting platform)"
        if sources.get("host") == "default":
            values["host"] = "0.0.0.0"
            sources["host"] = "env PORT (a hosting platform routes to every interface)"
    if sources.get("public_url") == "default":
        derived = platform_public_url(env)
        if derived:
            values["public_url"] = derived
            sources["public_url"] = "the hosting platform's environment"


def _search_keys(values: dict[str, Any], sources: dict[str, str], env: Mapping[str, str]) -> None:
    """The search APIs' keys from their usual variables (BRAVE_API_KEY, TAVILY_API_KEY),
    like a model provider's key, unless steward.toml or STEWARD_* set them."""
    for key in ("brave_api_key", "tavily_api_key"):
        name = key.upper()
        if sources.get(key) == "default" and env.get(name, "").strip():
            values[key] = env[name].strip()
            sources[key] = f"env {name}"


def _explain(exc: ValidationError, values: dict[str, Any], sources: dict[str, str]) -> ConfigError:
    lines = []
    for err in exc.errors():
        key = str(err["loc"][0]) if err["loc"] else "?"
        origin = sources.get(key, "?")
        value = values.get(key, "<missing>")
        field = Settings.model_fields.get(key)
        kind = getattr(field.annotation, "__name__", str(field.annotation)) if field else "?"
        expected = _EXPECTED.get(kind, kind)
        if key == "approvers":
            expected = 'a table, or "channel[:conversation]=id1,id2; ..." in the env'
        if err["type"] == "literal_error":
            expected = "one of " + str(err.get("ctx", {}).get("expected", ""))
        where = f"{origin}" if origin.startswith("env") else f"`{key}` in {origin}"
        lines.append(
            f"Setting `{key}` has the value {value!r} ({where}): {err['msg']}. "
            f"Fix: set it to {expected} (e.g. {_env_name(key)}=... ; see config/default.toml)."
        )
    return ConfigError("\n".join(lines))
