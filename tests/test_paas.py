"""The Procfile on a PaaS (docs/deploy.md): `web: steward run` honours the PORT the platform
gives, binds every interface then (which needs the web password), and takes the public
URL from the platform's environment. The settings a person made always win."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

from config.settings import load_settings, platform_public_url
from tests.conftest import make_env
from tests.test_cli import run, steward_run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_port_from_the_platform_unless_set(tmp_path: Path) -> None:
    s = load_settings(env={"PORT": "5000"}, cwd=tmp_path)
    assert (s.host, s.port) == ("0.0.0.0", 5000)
    assert s.sources["port"].startswith("env PORT")
    s = load_settings(env={"PORT": "5000", "STEWARD_PORT": "9000"}, cwd=tmp_path)
    assert (s.host, s.port) == ("127.0.0.1", 9000)
    s = load_settings(env={"PORT": "5000", "STEWARD_HOST": "127.0.0.1"}, cwd=tmp_path)
    assert (s.host, s.port) == ("127.0.0.1", 5000)
    (tmp_path / "steward.toml").write_text("port = 7000\n")
    assert load_settings(env={"PORT": "5000"}, cwd=tmp_path).port == 7000
    assert load_settings(env={}, cwd=tmp_path / "x").port == 8765  # no platform


def test_public_url_from_the_platform() -> None:
    assert platform_public_url({"RENDER_EXTERNAL_URL": "https://a.onrender.com/"}) == (
        "https://a.onrender.com"
    )
    assert platform_public_url({"RAILWAY_PUBLIC_DOMAIN": "b.up.railway.app"}) == (
        "https://b.up.railway.app"
    )
    assert platform_public_url({"FLY_APP_NAME": "c"}) == "https://c.fly.dev"
    assert platform_public_url({"HEROKU_APP_NAME": "d"}) == "https://d.herokuapp.com"
    assert platform_public_url({}) == ""


def test_steward_run_serves_healthz_on_the_platform_port(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **make_env(tmp_path, None),
        "PORT": str(port),
        "RENDER_EXTERNAL_URL": "https://steward-test.onrender.com",
    }
    del env["STEWARD_PORT"]  # the platform's PORT decides
    # Every interface without a password: refused, saying why and what to set.
    res = run(["run"], env, tmp_path)
    assert res.returncode == 2
    assert f"PORT={port}" in res.stderr and "STEWARD_WEB_PASSWORD" in res.stderr
    env["STEWARD_WEB_PASSWORD"] = "correct horse battery staple"
    with steward_run(env, tmp_path) as (_server, ready):
        # The link a person can open is the public one, not 0.0.0.0.
        assert "open https://steward-test.onrender.com/?token=" in ready, ready
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
            assert resp.status == 200
