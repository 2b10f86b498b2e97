"""Redaction: every secret shape we know is masked, and ordinary text, paths, SHAs and code are not.

Fake secrets are assembled at run time from a seeded generator, so no string in this
file looks like a live key to a secret scanner (and none of them is real).
"""

from __future__ import annotations

import base64
import random
import string
from datetime import datetime

import pytest

from memory.redact import kinds, looks_random, redact, redact_obj

_rng = random.Random(20240501)
ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
URLSAFE = ALNUM + "-_"


def r(n: int, alphabet: str = ALNUM) -> str:
    """Random text that mixes letters and digits when the alphabet has both (as keys do)."""
    mixed = any(c.isdigit() for c in alphabet) and any(c.isalpha() for c in alphabet)
    while True:
        s = "".join(_rng.choice(alphabet) for _ in range(n))
        if not mixed or (any(c.isdigit() for c in s) and any(c.isalpha() for c in s)):
            return s


def pem(label: str, lines: int = 6) -> str:
    body = "\n".join(r(64, B64) for _ in range(lines))
    return f"-----BEGIN {label}-----\n{body}\n{r(20, B64)}==\n-----END {label}-----"


def discord_token() -> str:
    uid = base64.urlsafe_b64encode(str(_rng.randrange(10**17, 10**18)).encode()).decode()
    return f"{uid.rstrip('=')}.{r(6, URLSAFE)}.{r(38, URLSAFE)}"


def jwt() -> str:
    head = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")
    payload = base64.urlsafe_b64encode(b'{"sub":"1234567890","name":"Al"}').decode().rstrip("=")
    return f"{head}.{payload}.{r(43, URLSAFE)}"


# (name, text with a {S} placeholder for the secret, the secret, expected kind)
OPENAI = "sk-" + r(48)
_POS: list[tuple[str, str, str, str]] = [
    ("openai legacy", "key: {S}", OPENAI, "openai_key"),
    ("openai project", "use {S} for the API", "sk-proj-" + r(40, URLSAFE) + "9", "openai_key"),
    ("openai service", "{S}", "sk-svcacct-" + r(44, URLSAFE) + "1", "openai_key"),
    ("openai in env", "OPENAI_API_KEY={S}\n", "sk-proj-" + r(56, URLSAFE) + "7", "openai_key"),
    (
        "anthropic",
        "ANTHROPIC_API_KEY={S}",
        "sk-ant-api03-" + r(86, URLSAFE) + "AA",
        "anthropic_key",
    ),
    ("openrouter", "Authorization key {S} here", "sk-or-v1-" + r(64, HEX), "openrouter_key"),
    ("github classic", "git clone with {S}", "ghp_" + r(36), "github_token"),
    ("github oauth", "token {S}.", "gho_" + r(36), "github_token"),
    ("github server", "({S})", "ghs_" + r(36), "github_token"),
    ("github fine-grained", "pat={S}", "github_pat_" + r(22) + "_" + r(59), "github_token"),
    ("gitlab", "GITLAB={S}", "glpat-" + r(20, URLSAFE), "gitlab_token"),
    (
        "slack bot",
        "SLACK_BOT_TOKEN: {S}",
        f"xoxb-{r(12, string.digits)}-{r(13, string.digits)}-{r(24)}",
        "slack_token",
    ),
    (
        "slack user",
        "paste: {S}",
        f"xoxp-{r(12, string.digits)}-{r(12, string.digits)}-{r(32, HEX)}",
        "slack_token",
    ),
    (
        "slack app",
        "app token {S}",
        f"xapp-1-A{r(10, UPPER_DIGITS)}-{r(13, string.digits)}-{r(64, HEX)}",
        "slack_app_token",
    ),
    (
        "slack webhook",
        "post to {S} please",
        f"https://hooks.slack.com/services/T{r(8, UPPER_DIGITS)}/B{r(8, UPPER_DIGITS)}/{r(24)}",
        "slack_webhook",
    ),
    ("aws key id", "aws_access_key_id = {S}", "AKIA" + r(16, UPPER_DIGITS), "aws_access_key_id"),
    ("aws session id", "id {S} expired", "ASIA" + r(16, UPPER_DIGITS), "aws_access_key_id"),
    ("aws secret ini", "aws_secret_access_key = {S}\n", r(40, B64), "aws_secret_key"),
    ("aws secret env", "AWS_SECRET_ACCESS_KEY={S}", r(40, B64), "aws_secret_key"),
    ("aws secret json", '{{"SecretAccessKey": "{S}"}}', r(40, B64), "aws_secret_key"),
    ("google", "maps key={S}&q=1", "AIza" + r(35, URLSAFE), "google_api_key"),
    ("stripe live", "stripe {S}", "sk_live_" + r(24), "stripe_key"),
    ("stripe restricted", "{S}", "rk_live_" + r(24), "stripe_key"),
    ("stripe webhook", "whsec {S}", "whsec_" + r(32), "stripe_webhook_secret"),
    ("discord bot", "DISCORD token {S}", discord_token(), "discord_token"),
    ("discord header", "Authorization: Bot {S}", discord_token(), "discord_token"),
    (
        "discord webhook",
        "{S}",
        f"https://discord.com/api/webhooks/{r(18, string.digits)}/{r(68, URLSAFE)}",
        "discord_webhook",
    ),
    ("jwt", "cookie session={S}; Path=/", jwt(), "jwt"),
    ("bearer header", "Authorization: Bearer {S}", r(40, URLSAFE + "."), "bearer_token"),
    ("bearer curl", "curl -H 'Authorization: bearer {S}' https://api.x.io", r(32), "bearer_token"),
    (
        "basic auth",
        "Authorization: Basic {S}",
        base64.b64encode(b"alice:" + r(12).encode()).decode(),
        "basic_auth",
    ),
    ("huggingface", "HF {S}", "hf_" + r(34, string.ascii_letters), "huggingface_token"),
    ("npm", "//registry.npmjs.org/:_authToken=npm_{S}", r(36), "npm_token"),
    ("sendgrid", "SG {S}", f"SG.{r(22, URLSAFE)}.{r(43, URLSAFE)}", "sendgrid_key"),
    (
        "telegram",
        "bot {S} started",
        f"{r(10, string.digits)}:AA{r(33, URLSAFE)}",
        "telegram_bot_token",
    ),
    ("env password", "DB_PASSWORD={S}\n", "hunter2", "password"),
    ("env bare word", "PASSWORD={S}\n", "correcthorse", "password"),
    ("yaml passwd", "db:\n  passwd: {S}\n", "s3cr3t!", "password"),
    ("json password", '{{"user": "bob", "password": "{S}"}}', "hunter2", "password"),
    ("yaml passphrase", "  password: {S}  # rotated\n", "correct horse battery", "password"),
    ("json passphrase", '{{"passphrase": "{S}"}}', "correct horse battery", "password"),
    ("query secret", "https://x.io/cb?code=1&secret={S}&y=2", r(16), "secret"),
    ("query token", "GET /hook?token={S} HTTP/1.1", r(24), "token"),
    ("yaml api_key", "api_key: {S}\n", r(32, HEX), "api_key"),
    ("export api key", 'export MY_API_KEY="{S}"', r(24), "api_key"),
    ("client secret", "client_secret: '{S}'", r(30, URLSAFE), "secret"),
    ("django secret", "SECRET_KEY={S}", "django-insecure-" + r(40, URLSAFE), "secret"),
    ("python literal", 'password = "{S}"', "Tr0ub4dor&3", "password"),
    (
        "url credentials",
        "clone https://alice:{S}@git.example.com/repo.git",
        "pa55word",
        "url_password",
    ),
    ("db url", "DATABASE_URL=postgres://admin:{S}@db:5432/app", r(20), "url_password"),
    ("cli flag", "mysql --password {S} -u root", "hunter2", "password"),
    # Forms that were once found stored raw.
    ("aws secret after id", "AKIA" + r(16, UPPER_DIGITS) + " {S}\n", r(40, B64), "aws_secret_key"),
    ("aws secret next line", "ASIA" + r(16, UPPER_DIGITS) + "\n{S}", r(40, B64), "aws_secret_key"),
    (
        "aws secret after word",
        "the secret for prod: {S} (rotate monthly)",
        r(40, B64),
        "aws_secret_key",
    ),
    ("aws secret key words", "secret access key {S}", r(39, B64) + "/", "aws_secret_key"),
    (
        "url password slash at",
        "git clone https://bob:{S}@git.example.com/r",
        "pa/ss@wo@rd" + r(4),
        "url_password",
    ),
    ("url password slash", "curl https://u:{S}@h.example/x", "x/" + r(12), "url_password"),
    ("slack refresh", "SLACK_REFRESH={S}", "xoxe-1-" + r(60), "slack_token"),
    ("slack rotated", "token {S} rotated", "xoxe.xoxp-1-" + r(60), "slack_token"),
    ("bare password", "the password {S} works", "hunter2!", "password"),
    ("bare passphrase", "passphrase {S}", "tr0ub4dor&3", "password"),
    ("prose", "my password is {S}, don't share it", "hunter2!", "password"),
    ("entropy near key", "the deploy key is {S} (prod)", r(32, B64), "secret"),
    ("entropy near token", "use this token {S} for staging", r(40), "secret"),
    ("pem rsa", "here:\n{S}\nthanks", pem("RSA PRIVATE KEY"), "private_key"),
    ("pem openssh", "{S}", pem("OPENSSH PRIVATE KEY", 10), "private_key"),
    (
        "pem pkcs8 in json",
        '{{"private_key": "{S}"}}',
        pem("PRIVATE KEY").replace("\n", "\\n"),
        "private_key",
    ),
    ("pem pgp", "{S}", pem("PGP PRIVATE KEY BLOCK"), "private_key"),
    (
        "pem cut short",
        "oops:\n{S}\n\nnext paragraph",
        pem("EC PRIVATE KEY").rsplit("\n", 2)[0],
        "private_key",
    ),
]


@pytest.mark.parametrize(
    ("text", "secret", "kind"), [c[1:] for c in _POS], ids=[c[0] for c in _POS]
)
def test_secret_is_redacted(text: str, secret: str, kind: str) -> None:
    src = text.format(S=secret)
    out = redact(src)
    assert f"[REDACTED:{kind}]" in out, out
    # Nothing of the secret's random part survives (a PEM's lines checked one by one).
    for part in secret.replace("\\n", "\n").splitlines():
        if len(part) >= 8 and "-----" not in part:
            assert part not in out, out
    assert redact(out) == out  # idempotent


def test_at_least_forty_positive_cases() -> None:
    assert len(_POS) >= 40


def test_context_around_a_secret_is_kept() -> None:
    url = redact("clone https://alice:pa55word@git.example.com/repo.git now")
    assert url == "clone https://alice:[REDACTED:url_password]@git.example.com/repo.git now"
    header = redact(f"Authorization: Bearer {r(40)}\nAccept: */*")
    assert header == "Authorization: Bearer [REDACTED:bearer_token]\nAccept: */*"
    assert redact('{"password": "hunter2", "user": "bob"}') == (
        '{"password": "[REDACTED:password]", "user": "bob"}'
    )
    assert redact("my password is hunter2.") == "my password is [REDACTED:password]."
    assert redact("password: two words  # old\n") == "password: [REDACTED:password]  # old\n"
    block = f"before\n{pem('RSA PRIVATE KEY')}\nafter"
    assert redact(block) == "before\n[REDACTED:private_key]\nafter"


_NEG: list[tuple[str, str]] = [
    ("prose", "The quick brown fox jumps over the lazy dog; the task failed twice."),
    ("password prose", "The password is wrong, try again or reset the password."),
    ("secret prose", "The secret to good code is tests. Keep your tokens safe."),
    ("paths", "Read /home/alice/.ssh/id_rsa.pub and C:\\Users\\bob\\secrets\\notes.txt"),
    ("git sha near key", "key commit 3b18e512dba79e4c8300dd08aeb37f8e728b8dad fixed the token bug"),
    ("short sha", "token fix in a1b2c3d (see 3b18e51)"),
    ("uuid near token", "session token id 123e4567-e89b-12d3-a456-426614174000 expired"),
    (
        "sha256 digest",
        "image sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    ),
    ("call", "password = get_password()\n"),
    ("environ", 'token = os.environ["STEWARD_TOKEN"]\n'),
    ("attribute", "client = Client(api_key=settings.api_key, timeout=5)\n"),
    ("annotation", "def login(user: str, password: str) -> bool:\n"),
    ("optional", "    token: str | None = None\n    api_key: Optional[str] = None\n"),
    ("colon prose", "A secret: it ends with a word.\nNote the token: expired yesterday"),
    ("secrets module", "secret = secrets.token_hex(16)\n"),
    ("condition", "if not api_key:\n    raise ValueError('no api key')\n"),
    ("kwargs", "connect(host, password=password, token=token)\n"),
    ("spaced variable", "password = pw\nsecret_key = key\n"),
    ("ruby hash", "user.authenticate(:password => params[:password])"),
    ("comparison", "if password == expected_password and token != old_token:"),
    ("yaml counters", "max_tokens: 1500\ntokens_in: 1234\ntoken_type: bearer\nprimary_key: id\n"),
    ("yaml names", "secret_santa: bob\nsecrets: [a, b]\nsort_key: name\n"),
    ("placeholders", "password: ${DB_PASSWORD}\napi_key=<your key>\ntoken: '{{ secrets.TOKEN }}'"),
    ("empty", "PASSWORD=\nAPI_KEY=''\n"),
    ("pwd path", "PWD=/home/bob/project\nOLDPWD=/tmp\n"),
    ("urls", "see https://example.com/path?page=2&sort=asc and http://localhost:8080/api"),
    ("ssh remotes", "git@github.com:org/repo.git or ssh://git@host.example:22/x.git"),
    ("email", "mail alice@example.com or bob.smith+tag@corp.example.org"),
    ("bearer prose", "the bearer of bad news; Authorization: Bearer ${TOKEN}"),
    ("camel case", "the key insight: SimpleHTTPRequestHandlerFactory caches sockets"),
    ("episode id", "task key 20240101-120000-a1b2c3 and rule r-12"),
    ("kebab words", "token refresh-access-token-handler-v2 was renamed"),
    ("hostname", "deploy to my-service-production.eu-west-1.internal.example.com"),
    ("version", "dulwich 1.2.21, python 3.11.9, ruff 0.17.6"),
    ("sklearn", "scikit-learn (sk-learn) and task-list-item"),
    ("signature", "error_signatures: ['shell:FileNotFoundError:No such file <path>']"),
    ("tokenizer", 'tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")'),
    ("conventions", "STEWARD_SLACK_APP_TOKEN is set but STEWARD_SLACK_BOT_TOKEN is not"),
    ("markdown", "| id | outcome |\n|----|---------|\n| e-1 | success |\n---\n"),
    ("dates", "started: 2024-05-01T12:30:00+00:00, duration 12.5 s"),
    (
        "data url",
        "img src=data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4",
    ),
    ("already redacted", "OPENAI_API_KEY=[REDACTED:openai_key] and [REDACTED:password]"),
    ("cli flag file", "mysql --password-file ~/.my.cnf --token $TOKEN"),
    ("sha after secret", "secret rotated in 3b18e512dba79e4c8300dd08aeb37f8e728b8dad"),
    ("port and at path", "see https://social.example:8443/users/@alice/ and http://h:80/@x"),
    ("bare password words", "password reset link; the password field; pwd && ls -la /tmp"),
    ("password options", "password --help, password $PW, password ./secrets/x1, password -"),
    (
        "forty chars no context",
        "build 3b18e512dba79e4c8300dd08aeb37f8e728b8dad of "
        "Abcdefghij0123456789Abcdefghij0123456789",
    ),
]


@pytest.mark.parametrize("text", [c[1] for c in _NEG], ids=[c[0] for c in _NEG])
def test_ordinary_text_is_untouched(text: str) -> None:
    assert redact(text) == text


def test_at_least_twenty_five_negative_cases() -> None:
    assert len(_NEG) >= 25


def test_redact_obj_recurses_and_uses_key_names() -> None:
    when = datetime(2024, 5, 1, 12, 0)
    obj = {
        "id": "e-1",
        "started": when,
        "tokens_in": 1234,
        "cost_usd": 0.5,
        "password": "hunter",  # no shape at all: only the key says it is a secret
        "SLACK_BOT_TOKEN": "plain-but-long-value",
        "api_key": "short",  # too short for a key, and not password-like: kept
        "secret": False,
        "tools": [
            {"name": "shell", "arguments": f"curl -H 'Authorization: Bearer {r(32)}'"},
            ("tuple", f"ghp_{r(36)}"),
        ],
        "nested": {"db": {"passwd": "x1"}},
    }
    out = redact_obj(obj)
    assert out["started"] is when and out["tokens_in"] == 1234 and out["cost_usd"] == 0.5
    assert out["password"] == "[REDACTED:password]"
    assert out["SLACK_BOT_TOKEN"] == "[REDACTED:token]"
    assert out["api_key"] == "short"
    assert out["secret"] is False
    assert "[REDACTED:bearer_token]" in out["tools"][0]["arguments"]
    assert out["tools"][1] == ("tuple", "[REDACTED:github_token]")
    assert out["nested"]["db"]["passwd"] == "[REDACTED:password]"
    assert obj["password"] == "hunter"  # the input is not mutated


def test_looks_random_rejects_ids_and_accepts_keys() -> None:
    assert looks_random(r(32, B64))
    assert looks_random(r(32, HEX)) and looks_random(r(64, HEX))
    assert not looks_random("3b18e512dba79e4c8300dd08aeb37f8e728b8dad")  # 40 hex: a git SHA
    assert not looks_random("123e4567-e89b-12d3-a456-426614174000")
    assert not looks_random("configuration_settings_value_2024")


def test_kinds_are_listed() -> None:
    listed = kinds()
    for case in _POS:
        assert case[3] in listed
    assert redact("") == ""


def test_large_text_is_fast() -> None:
    import time

    blob = ("word " * 20_000) + ("a_" * 50_000) + r(100_000, ALNUM)
    start = time.perf_counter()
    redact(blob)
    assert time.perf_counter() - start < 2.0


def test_an_episodes_own_counters_do_not_hide_a_secret_beside_them() -> None:
    """`tokens_in:`/`tokens_out:` no longer make every episode pay every context scan;
    a real secret-ish word in the same text still triggers them."""
    plain = "tokens_in: 163\ntokens_out: 8\nrequest: message 5\n"
    assert redact(plain) == plain
    text = plain + "reply: the password is hunter2hunter2\n" + "tokens_out: 9\n"
    out = redact(text)
    assert "hunter2hunter2" not in out and "tokens_in: 163" in out and "tokens_out: 9" in out


def test_a_remembered_redaction_is_the_redaction() -> None:
    """Short texts' redactions are remembered: asked again, long or short,
    secret or not, the answer is what the patterns give, and a long text still gets its
    own pass."""
    from memory.redact import _MEMO_CHARS, _redact

    texts = [c[1].format(S=c[2]) for c in _POS] + [c[1] for c in _NEG]
    texts.append("x " * _MEMO_CHARS + "password=" + r(24))
    for _ in range(2):
        for text in texts:
            assert redact(text) == _redact(text)
    assert "[REDACTED:password]" in redact(texts[-1])
