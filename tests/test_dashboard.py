"""The web dashboard against a real daemon (with an API key): its JSON endpoints over real turns,
judgments, feedback and hot-swapped adapter versions; the key on every data endpoint and on the
page (a browser without it gets a login page); and the page itself in headless Chromium, which
logs in, renders the plot and rolls an adapter back."""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from clawrl.adapters import versions as adapters
from conftest import REPO, Daemon, make_home, until
from test_swap import make_adapter

pytestmark = pytest.mark.model

KEY = "dashboard-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ARTIFACTS = REPO / "tests" / "artifacts"
DATA_ENDPOINTS = ["/v1/dashboard/sessions", "/v1/dashboard/sessions/alpha/turns",
                  "/v1/dashboard/rewards", "/v1/dashboard/skills", "/v1/adapters"]


class Conversation:
    """One session's growing history, sent whole on each turn as a chat client does."""

    def __init__(self, url: str, session: str):
        self.url, self.session, self.messages = url, session, []

    def say(self, text: str) -> int:
        self.messages.append({"role": "user", "content": text})
        r = httpx.post(f"{self.url}/v1/chat/completions", timeout=120,
                       headers={**AUTH, "X-Session-Id": self.session},
                       json={"model": "m", "max_tokens": 8, "temperature": 0, "messages": self.messages})
        assert r.status_code == 200, r.text
        self.messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
        return int(r.headers["x-clawrl-turn-id"])


def get(d: Daemon, path: str, **kw) -> dict:
    r = httpx.get(f"{d.url}{path}", headers=AUTH, timeout=30, **kw)
    assert r.status_code == 200, r.text
    return r.json()


def new_version(d: Daemon, version: int) -> None:
    # Small weights: close enough to the base model that the swap's canary keeps the version.
    make_adapter(d.home / "adapters", version, scale=0.002)
    # SEEN is written once the swap has decided (after its canary), so the verdict is final.
    until(f"the daemon to decide on adapter {version}",
          lambda: (adapters.read_seen(d.home / "adapters") or 0) >= version, timeout=90, every=0.2)
    info = get(d, "/v1/adapters")
    assert info["active"] == version, info


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A daemon with two sessions of judged turns spread over the base model and two adapter
    versions, one explicit feedback, and one OpenClaw workspace skill."""
    home = make_home(tmp_path_factory.mktemp("dashboard"))
    skill = home / "openclaw" / "workspace" / "skills" / "weather"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: weather\ndescription: Look up the forecast.\n---\n"
                                    "Use the forecast tool.\n")
    # And one skill of clawrl's own, published by skill_bridge into that same workspace.
    ours = home / "skills" / "units"
    ours.mkdir(parents=True)
    (ours / "SKILL.md").write_text("---\nname: units\ndescription: Use metric units.\n---\nSay km.\n")
    d = Daemon(home, env={"CLAWRL_SERVER_API_KEY": KEY, "OPENCLAW_STATE_DIR": str(home / "openclaw"),
                          "OPENCLAW_CONFIG_PATH": "", "CLAWRL_SKILLS_TARGET": ""}).start()
    try:
        alpha, beta = Conversation(d.url, "alpha"), Conversation(d.url, "beta")
        t = {"a1": alpha.say("What is two plus two?"),
             "a2": alpha.say("Thanks! What colour is the sky?")}          # a1 judged +1
        new_version(d, 1)
        t["b1"] = beta.say("Name a large city in France.")
        t["b2"] = beta.say("No, that's wrong. Name the capital city of France, please.")  # b1: -1
        t["b3"] = beta.say("Okay, what is the capital of Spain?")         # b2: +1
        r = httpx.post(f"{d.url}/v1/feedback", headers=AUTH, timeout=30,
                       json={"session_id": "beta", "turn_id": t["b3"], "reward": -1,
                             "comment": "too vague"})
        assert r.status_code == 200, r.text
        new_version(d, 2)
        t["a3"] = alpha.say("Great, and what is a fox?")                   # a2: +1
        t["a4"] = alpha.say("Thanks! Why is grass green?")                 # a3: +1
        assert httpx.post(f"{d.url}/v1/sessions/alpha/end", headers=AUTH).status_code == 200
        until("six judged turns", lambda: len(get(d, "/v1/dashboard/rewards")["points"]) == 6, timeout=90, every=0.2)
        d.turns = t
        yield d
    finally:
        d.stop()


def test_sessions_list_counts_turns_and_judgments(lab):
    sessions = {s["id"]: s for s in get(lab, "/v1/dashboard/sessions")["sessions"]}
    assert set(sessions) == {"alpha", "beta"}
    alpha, beta = sessions["alpha"], sessions["beta"]
    assert (alpha["turns"], alpha["main_turns"], alpha["judged"]) == (4, 4, 3)
    assert alpha["mean_score"] == 1 and alpha["ended_at"] and alpha["feedback"] == 0
    assert (beta["turns"], beta["judged"], beta["feedback"]) == (3, 2, 1)
    assert beta["mean_score"] == 0 and beta["ended_at"] is None
    listed = get(lab, "/v1/dashboard/sessions", params={"limit": 1})["sessions"]
    assert [s["id"] for s in listed] == ["alpha"]          # the most recently seen first
    r = httpx.get(f"{lab.url}/v1/dashboard/sessions", params={"limit": "0"}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"


def test_session_turns_show_prompt_response_judgment_and_feedback(lab):
    data = get(lab, "/v1/dashboard/sessions/beta/turns")
    assert data["session_id"] == "beta"
    b1, b2, b3 = data["turns"]
    assert [t["id"] for t in (b1, b2, b3)] == [lab.turns["b1"], lab.turns["b2"], lab.turns["b3"]]
    assert [t["turn_index"] for t in (b1, b2, b3)] == [0, 1, 2]
    assert (b1["kind"], b1["turn_type"], b1["status"], b1["trainable"]) == ("main", "main", "complete", True)
    assert b1["prompt"] == {"role": "user", "text": "Name a large city in France.", "messages": 1}
    assert b2["prompt"]["messages"] == 3 and b2["prompt"]["text"].startswith("No, that's wrong.")
    stored = lab.turn(lab.turns["b1"])
    assert b1["response_text"] == stored["response_text"] and b1["completion_tokens"] == 8
    assert b1["adapter_version"] == 1 and b1["next_state_role"] == "user"
    assert (b1["judge_status"], b1["judge_votes"], b1["judge_score"]) == ("done", [-1], -1)
    assert "wrong" in b1["judge_hint"]
    assert (b2["judge_votes"], b2["judge_score"], b2["judge_hint"]) == ([1], 1, None)
    assert b3["judge_status"] is None and b3["feedback_reward"] == -1
    assert b3["feedback_comment"] == "too vague"
    last = get(lab, "/v1/dashboard/sessions/alpha/turns", params={"limit": 1})["turns"]
    assert [t["id"] for t in last] == [lab.turns["a4"]] and last[0]["judge_status"] == "no_next_state"
    r = httpx.get(f"{lab.url}/v1/dashboard/sessions/nobody/turns", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"


def test_rewards_carry_adapter_versions_and_activations(lab):
    data = get(lab, "/v1/dashboard/rewards")
    t = lab.turns
    points = data["points"]
    assert [p["turn_id"] for p in points] == [t["a1"], t["a2"], t["b1"], t["b2"], t["b3"], t["a3"]]
    assert [p["adapter_version"] for p in points] == [0, 0, 1, 1, 1, 2]
    assert [p["reward"] for p in points] == [1, 1, -1, 1, -1, 1]
    fb = points[4]
    assert (fb["judge_score"], fb["feedback"], fb["session_id"]) == (None, -1, "beta")
    assert [p["at"] for p in points] == sorted(p["at"] for p in points)
    assert [(v["version"], v["rejected"]) for v in data["versions"]] == [(1, None), (2, None)]
    went_live = {e["version"]: e["at"] for e in data["activations"]}
    assert set(went_live) >= {1, 2} and data["active"] == 2
    assert data["started"] < points[0]["at"]
    # Each version went live after the last turn the previous one served, before its own first.
    assert points[1]["at"] < went_live[1] < points[2]["at"]
    assert points[4]["at"] < went_live[2] < points[5]["at"]
    assert all(v["created_at"] <= went_live[v["version"]] for v in data["versions"])


def test_skills_lists_the_openclaw_workspace_folder(lab):
    data = get(lab, "/v1/dashboard/skills")
    assert Path(data["folder"]) == lab.home / "openclaw" / "workspace" / "skills"
    assert data["skills"] == [
        {"name": "units", "description": "Use metric units.", "folder": "units", "managed": True,
         "status": "published", "issues": []},
        {"name": "weather", "description": "Look up the forecast.", "folder": "weather",
         "managed": False, "status": None, "issues": []}]


def test_data_endpoints_and_the_page_need_the_key(lab):
    for path in DATA_ENDPOINTS:
        assert httpx.get(f"{lab.url}{path}").status_code == 401, path
        wrong = httpx.get(f"{lab.url}{path}", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{lab.url}{path}", headers=AUTH).status_code == 200, path
    # A browser without the key gets a login form and nothing of the dashboard.
    html = {"Accept": "text/html"}
    login = httpx.get(f"{lab.url}/dashboard", headers=html)
    assert login.status_code == 401 and login.headers["content-type"].startswith("text/html")
    assert 'id="login"' in login.text and '<svg id="plot"' not in login.text
    assert httpx.get(f"{lab.url}/dashboard").json()["error"]["code"] == "invalid_api_key"
    page = httpx.get(f"{lab.url}/dashboard", headers={**html, **AUTH})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<svg id="plot"' in page.text and "sessionStorage" in page.text
    assert "localStorage" not in page.text + login.text      # the key is not kept past the tab
    assert "default-src 'none'" in page.headers["content-security-policy"]
    for text in (login.text, page.text):
        # Nothing is fetched from elsewhere: no external scripts, styles or fonts.
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in text


# -- the page in a real browser -------------------------------------------------------------------

class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
    JSON messages ending in a NUL byte, commands on the browser's fd 3, replies on its fd 4), so
    no websocket client is needed."""

    def __init__(self, exe: str, profile: Path):
        to_browser, self._cmd = os.pipe()
        self._out, from_browser = os.pipe()
        # Parked above 10 so that placing them at 3 and 4 in the child cannot clobber one another.
        hi = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser)]
        self.proc = subprocess.Popen(
            [exe, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=lambda: (os.dup2(hi[0], 3), os.dup2(hi[1], 4)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in (to_browser, from_browser, *hi):
            os.close(fd)
        self._buf, self._next, self.events = b"", 0, []

    def call(self, method: str, session: str | None = None, timeout: float = 60, **params) -> dict:
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            while b"\0" not in self._buf:
                if not select.select([self._out], [], [], max(0.0, deadline - time.time()))[0]:
                    raise TimeoutError(f"no answer to {method} within {timeout} s")
                chunk = os.read(self._out, 1 << 20)
                if not chunk:
                    raise EOFError(f"chromium exited ({self.proc.poll()}) during {method}")
                self._buf += chunk
            raw, _, self._buf = self._buf.partition(b"\0")
            reply = json.loads(raw)
            if reply.get("id") != self._next:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            return reply["result"]

    def evaluate(self, session: str, expression: str):
        out = self.call("Runtime.evaluate", session, expression=expression, returnByValue=True,
                        awaitPromise=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def wait_for(self, session: str, expression: str, timeout: float = 60):
        return until(expression, lambda: self.evaluate(session, expression), timeout, every=0.2)

    def screenshot(self, session: str, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", session, format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (OSError, EOFError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd)
        os.close(self._out)


@pytest.fixture
def browser(tmp_path):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("headless Chromium is not installed (Debian package `chromium`: "
                    "apt-get install -y chromium)")
    b = Chromium(exe, tmp_path / "profile")
    yield b
    b.close()


def test_page_renders_the_plot_and_rolls_back_in_a_browser(lab, browser):
    ARTIFACTS.mkdir(exist_ok=True)
    target = browser.call("Target.createTarget", url="about:blank")["targetId"]
    s = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    browser.call("Runtime.enable", s)
    browser.call("Emulation.setDeviceMetricsOverride", s, width=1400, height=1000,
                 deviceScaleFactor=1, mobile=False)
    # A consolidation under way (its progress file, as learn/consolidate.py writes it).
    # Training began 300 s ago: 100 s a step, 7 steps to go.
    adapters.write_consolidation(lab.home / "adapters", {
        "state": "running", "started_at": time.time() - 330, "training_at": time.time() - 300, "step": 3,
        "steps": 10, "loss": [0.5, 0.48, 0.47]})
    browser.call("Page.navigate", s, url=f"{lab.url}/dashboard")

    # A fresh browser has no key: the daemon answers a login form, which refuses a wrong key...
    login = "document.querySelector('#login')"
    browser.wait_for(s, f"{login} !== null")
    browser.evaluate(s, "document.querySelector('#key').value = 'wrong';" f"{login}.requestSubmit()")
    browser.wait_for(s, "document.querySelector('#msg').textContent === 'that key was refused'")
    # ... and with the right one loads the dashboard in its place.
    browser.evaluate(s, f"document.querySelector('#key').value = {json.dumps(KEY)};"
                        f"{login}.requestSubmit()")
    browser.wait_for(s, "document.body.dataset.loaded === 'true'")
    assert browser.evaluate(s, "sessionStorage.getItem('clawrl.apiKey')") == KEY
    assert browser.evaluate(s, "localStorage.length") == 0 and KEY not in browser.evaluate(
        s, "location.href + document.cookie")
    # A reload asks again for nothing: the tab still has the key.
    browser.evaluate(s, "window.beforeReload = true")
    browser.call("Page.reload", s)
    browser.wait_for(s, "!window.beforeReload && document.body?.dataset.loaded === 'true'")
    assert browser.evaluate(s, f"{login}") is None

    plot = browser.evaluate(s, """({
        dots: [...document.querySelectorAll('#plot circle')].map(c => [c.dataset.turn, c.getAttribute('class')]),
        average: document.querySelector('#plot path.ma')?.getAttribute('d') ?? '',
        markers: [...document.querySelectorAll('#plot text.marker')].map(t => t.firstChild.textContent),
        status: Object.fromEntries([...document.querySelectorAll('#status dt')]
          .map(dt => [dt.textContent, dt.nextElementSibling.textContent])),
        adapters: [...document.querySelectorAll('#adapters tbody tr')].map(r => r.innerText),
        skills: document.querySelector('#skills').innerText})""")
    points = get(lab, "/v1/dashboard/rewards")["points"]
    assert [int(t) for t, _ in plot["dots"]] == [p["turn_id"] for p in points]
    assert plot["dots"][4][1] == "neg fb"                   # the feedback turn, ringed
    assert plot["average"].startswith("M") and plot["average"].count("L") == len(points) - 1
    assert plot["markers"] == ["v1", "v2"]
    assert plot["status"]["model"].startswith("SmolLM2") and plot["status"]["live adapter"] == "2"
    assert plot["status"]["turns"] == "7" and plot["status"]["judged"] == "5"
    assert len(plot["adapters"]) == 3 and plot["adapters"][0].startswith("0002")
    assert "weather" in plot["skills"]
    assert "step 3 of 10, loss 0.500 → 0.470, about 12 min left" in plot["status"]["consolidation"] or \
        "step 3 of 10, loss 0.500 → 0.470, about 13 min left" in plot["status"]["consolidation"]   # slow page load

    browser.evaluate(s, "document.querySelector('#sessions tr[data-session=\"beta\"]').click()")
    browser.wait_for(s, "document.querySelectorAll('#turns .turn').length === 3")
    turns = browser.evaluate(s, "document.querySelector('#turns').innerText")
    assert "Name a large city in France." in turns and "hint:" in turns and "too vague" in turns
    browser.screenshot(s, ARTIFACTS / "dashboard.png")

    # Rollback takes two clicks, as a person would make them.
    browser.evaluate(s, "document.querySelector('#rollback').click()")
    assert browser.evaluate(s, "document.querySelector('#rollback').textContent").startswith("Click again")
    assert get(lab, "/v1/adapters")["active"] == 2
    browser.evaluate(s, "document.querySelector('#rollback').click()")
    until("the rollback to version 1", lambda: get(lab, "/v1/adapters")["active"] == 1, timeout=90, every=0.2)
    browser.wait_for(s, "document.querySelector('#action-msg').textContent === 'live adapter: 1'")
    browser.wait_for(s, "document.querySelector('#adapters tr.live td').textContent === '0001'")
    browser.wait_for(s, "document.querySelectorAll('#plot line.marker').length === 3")
    assert get(lab, "/v1/adapters")["versions"][1]["rejected"].startswith("rolled back")
    browser.screenshot(s, ARTIFACTS / "dashboard-after-rollback.png")
    assert (ARTIFACTS / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    errors = [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"]
    assert not errors, errors
