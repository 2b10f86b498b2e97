"""Settings: layering, and errors that name the key, the value and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.settings import ConfigError, load_settings


def test_defaults_without_file_or_env(tmp_path: Path) -> None:
    s = load_settings(env={}, cwd=tmp_path)
    assert s.model == "" and not s.model_configured
    assert s.port == 8765 and s.host == "127.0.0.1"
    assert s.data_dir == tmp_path / ".steward"
    assert s.workspace == tmp_path / "workspace"
    assert s.sources["model"] == "default"


def test_file_then_env_wins(tmp_path: Path) -> None:
    (tmp_path / "steward.toml").write_text('model = "openai/from-file"\nport = 9000\n')
    s = load_settings(env={"STEWARD_PORT": "9100"}, cwd=tmp_path)
    assert s.model == "openai/from-file"
    assert s.port == 9100
    assert s.sources["port"] == "env STEWARD_PORT"
    assert s.sources["model"].endswith("steward.toml")


def test_explicit_config_path_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", env={}, cwd=tmp_path)


def test_wrong_type_names_key_value_and_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(env={"STEWARD_PORT": "eighty"}, cwd=tmp_path)
    msg = str(err.value)
    assert "`port`" in msg and "'eighty'" in msg and "STEWARD_PORT" in msg
    assert "whole number" in msg


def test_out_of_range(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_steps"):
        load_settings(env={"STEWARD_MAX_STEPS": "0"}, cwd=tmp_path)


def test_unknown_key_in_file_suggests(tmp_path: Path) -> None:
    (tmp_path / "steward.toml").write_text('modle = "x"\n')
    with pytest.raises(ConfigError) as err:
        load_settings(env={}, cwd=tmp_path)
    assert "`modle`" in str(err.value) and "Did you mean `model`" in str(err.value)


def test_unknown_env_var_suggests(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(env={"STEWARD_MODLE": "x"}, cwd=tmp_path)
    assert "STEWARD_MODLE" in str(err.value) and "STEWARD_MODEL" in str(err.value)


def test_bad_toml_is_reported(tmp_path: Path) -> None:
    (tmp_path / "steward.toml").write_text("model = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(env={}, cwd=tmp_path)


def test_literal_choices_listed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="log_level"):
        load_settings(env={"STEWARD_LOG_LEVEL": "loud"}, cwd=tmp_path)


def test_empty_data_dir_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data_dir"):
        load_settings(env={"STEWARD_DATA_DIR": " "}, cwd=tmp_path)


def test_bool_from_env(tmp_path: Path) -> None:
    assert load_settings(env={"STEWARD_STREAM": "false"}, cwd=tmp_path).stream is False


def test_default_toml_covers_every_field() -> None:
    """default.toml is the one place defaults live: it must name every setting."""
    from config.settings import Settings, _defaults

    fields = set(Settings.model_fields) - {"sources"}
    assert set(_defaults()) == fields


def test_platform_settings_come_from_the_registry(tmp_path: Path) -> None:
    """Each registry key is a setting with its env name; the platform's view has the
    short names; secrets never show in a repr."""
    from config.platforms import PLATFORMS

    env = {}
    for spec in PLATFORMS:
        for key in spec.all_keys():
            env[spec.env(key.name)] = f"{spec.name}-{key.name}-value"
    settings = load_settings(env=env, cwd=tmp_path)
    text = repr(settings)
    for spec in PLATFORMS:
        cfg = settings.platform(spec.name)
        for key in spec.all_keys():
            value = f"{spec.name}-{key.name}-value"
            assert cfg[key.name] == getattr(settings, spec.setting(key.name)) == value
            assert settings.sources[spec.setting(key.name)] == f"env {spec.env(key.name)}"
            assert (value in text) is not key.secret, key
        assert spec.configured(settings)
        assert "-value" not in repr(cfg)  # a platform view never shows values


def test_every_platform_key_is_documented_in_default_toml() -> None:
    """default.toml documents every key: each platform's lines sit under a comment naming
    the platform's page, docs/platforms/<name>.md."""
    from importlib import resources

    from config.platforms import PLATFORMS

    text = resources.files("config").joinpath("default.toml").read_text(encoding="utf-8")
    for spec in PLATFORMS:
        assert f"(docs/platforms/{spec.name}.md)" in text, spec.name
        for key in spec.keys:
            assert f"\n{spec.setting(key.name)} = " in text, spec.setting(key.name)


def test_a_half_configured_platform_names_the_missing_key(tmp_path: Path) -> None:
    from config.platforms import spec

    slack = spec("slack")
    assert slack is not None
    settings = load_settings(env={"STEWARD_SLACK_APP_TOKEN": "xapp-1"}, cwd=tmp_path)
    [problem] = slack.problems(settings.platform("slack"))
    assert "STEWARD_SLACK_BOT_TOKEN" in problem


def test_a_missing_key_names_the_platforms_page(tmp_path: Path) -> None:
    from config.platforms import spec

    line = spec("line")
    assert line is not None
    settings = load_settings(env={"STEWARD_LINE_CHANNEL_SECRET": "s"}, cwd=tmp_path)
    [problem] = line.problems(settings.platform("line"))
    assert "STEWARD_LINE_CHANNEL_TOKEN" in problem and "(see docs/platforms/line.md)" in problem
