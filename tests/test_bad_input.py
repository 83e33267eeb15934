"""Bad input gets a clear OpenAI-shaped 4xx and loses nothing: the daemon keeps serving."""
from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from conftest import CLAWRL, Daemon, make_home

pytestmark = pytest.mark.model

OK = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}

CASES = [
    # (name, raw body or dict, status, param, code)
    ("malformed json", b'{"messages": [', 400, None, "invalid_json"),
    ("not an object", [1, 2], 400, "body", "invalid_type"),
    ("no messages", {"model": "m"}, 400, "messages", "invalid_type"),
    ("empty messages", {"messages": []}, 400, "messages", "invalid_value"),
    ("unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role", "invalid_value"),
    ("content wrong type", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", "invalid_type"),
    ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages[0].content[0]", "invalid_value"),
    ("temperature type", {**OK, "temperature": "hot"}, 400, "temperature", "invalid_type"),
    ("temperature range", {**OK, "temperature": 7}, 400, "temperature", "invalid_value"),
    ("max_tokens zero", {**OK, "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ("max_completion_tokens type", {**OK, "max_completion_tokens": 1.5}, 400, "max_completion_tokens", "invalid_type"),
    ("stream type", {**OK, "stream": "yes"}, 400, "stream", "invalid_type"),
    ("bad tools", {**OK, "tools": [{"type": "function"}]}, 400, "tools[0]", "invalid_value"),
    ("n > 1", {**OK, "n": 3}, 400, "n", "invalid_value"),
    ("bad turn type", {**OK, "turn_type": "sideways"}, 400, "turn_type", "invalid_value"),
]


def assert_openai_error(r: httpx.Response, status: int, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err


def still_serving(url: str):
    r = httpx.post(f"{url}/v1/chat/completions", json=OK, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None


@pytest.mark.parametrize("name,body,status,param,code", CASES, ids=[c[0] for c in CASES])
def test_bad_request_is_a_clear_400(daemon, name, body, status, param, code):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{daemon.url}/v1/chat/completions", content=data,
                   headers={"content-type": "application/json"}, timeout=60)
    assert_openai_error(r, status, param, code)


def test_bad_requests_leave_the_daemon_serving(daemon):
    for _, body, *_ in CASES:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        httpx.post(f"{daemon.url}/v1/chat/completions", content=data, timeout=60)
    still_serving(daemon.url)


def test_oversize_body_is_413(daemon):
    big = {**OK, "messages": [{"role": "user", "content": "x" * (9 * 1024 * 1024)}]}
    r = httpx.post(f"{daemon.url}/v1/chat/completions", json=big, timeout=60)
    assert_openai_error(r, 413, code="request_too_large")
    still_serving(daemon.url)


def test_prompt_longer_than_context_is_context_length_exceeded(daemon):
    window = httpx.get(f"{daemon.url}/v1/models").json()["data"][0]["context_length"]
    # over 10 tokens a fact, so a tenth of the window in facts is longer than the window
    text = " ".join(f"Fact {i}: the sky over town {i} is blue." for i in range(window // 10))
    r = httpx.post(f"{daemon.url}/v1/chat/completions", timeout=120,
                   json={**OK, "messages": [{"role": "user", "content": text}]})
    err = assert_openai_error(r, 400, "messages", "context_length_exceeded")
    assert str(window) in err["message"]
    still_serving(daemon.url)


def test_unknown_route_and_wrong_method(daemon):
    assert_openai_error(httpx.get(f"{daemon.url}/v1/nothing"), 404, code="not_found")
    assert_openai_error(httpx.get(f"{daemon.url}/v1/chat/completions"), 405, code="method_not_allowed")


def test_api_key_is_enforced(tmp_path):
    d = Daemon(make_home(tmp_path / "home"), env={"CLAWRL_SERVER_API_KEY": "sekret"}).start()
    try:
        assert httpx.get(f"{d.url}/healthz").status_code == 200   # probes stay open
        assert_openai_error(httpx.post(f"{d.url}/v1/chat/completions", json=OK, timeout=60), 401,
                            code="invalid_api_key")
        assert_openai_error(httpx.get(f"{d.url}/v1/models", headers={"Authorization": "Bearer nope"}),
                            401, code="invalid_api_key")
        r = httpx.post(f"{d.url}/v1/chat/completions", json=OK, timeout=60,
                       headers={"Authorization": "Bearer sekret"})
        assert r.status_code == 200
    finally:
        d.stop()


def test_non_loopback_bind_without_key_is_refused(tmp_path):
    out = subprocess.run([*CLAWRL, "serve", "--host", "0.0.0.0", "--port", "0"], capture_output=True,
                         text=True, timeout=60, env={"CLAWRL_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2
    assert "refusing to bind 0.0.0.0 without an API key" in out.stderr and "api_key" in out.stderr


def test_bad_recipe_value_fails_at_start_up_naming_the_key(tmp_path):
    out = subprocess.run([*CLAWRL, "serve"], capture_output=True, text=True, timeout=60,
                         env={"CLAWRL_HOME": str(tmp_path), "CLAWRL_ENGINE_MAX_QUEUE": "lots",
                              "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and "CLAWRL_ENGINE_MAX_QUEUE" in out.stderr
