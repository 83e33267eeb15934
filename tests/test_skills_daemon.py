"""skill_bridge inside a real `clawrl serve`: the watcher publishes what lands in the source folder,
the endpoint lets the agent write skills (and nothing outside the folder), every change is in
SQLite, each turn records the skills in force, and repeated corrections become a proposed skill
that `clawrl skills accept` publishes. The CLI's new/check/list run as real subprocesses."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import CLAWRL, Daemon, make_home, until

pytestmark = pytest.mark.model

SKILL = """---
name: {name}
description: {description}
---

# {name}

Say hello in the user's language.
"""


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    # home's parent is this module's own folder: the write-containment test scans all of it.
    daemon = Daemon(make_home(tmp_path_factory.mktemp("skills") / "home"),
                    env={"CLAWRL_SKILLS_DEBOUNCE_S": "0.1"}).start()
    yield daemon
    daemon.stop()


@pytest.fixture
def source(d) -> Path:
    return d.home / "skills"


@pytest.fixture
def target(d) -> Path:
    return d.home / "openclaw-skills"


def cli(d, *args) -> subprocess.CompletedProcess:
    return subprocess.run([*CLAWRL, "skills", *args], env=d.env, capture_output=True, text=True,
                          timeout=60)


def versions(d, name: str) -> list[dict]:
    return d.rows("SELECT * FROM skill_versions WHERE name=? ORDER BY id", name)


def test_a_skill_written_into_the_source_is_published_recorded_and_in_force_for_turns(d, source, target):
    folder = source / "greeting"
    folder.mkdir()
    (folder / "SKILL.md").write_text(SKILL.format(name="greeting", description="Greet the user"))
    until("greeting published", lambda: (target / "greeting" / "SKILL.md").exists())
    assert (target / "greeting" / "SKILL.md").read_text() == (folder / "SKILL.md").read_text()
    row = until("a published row", lambda: [v for v in versions(d, "greeting")
                                               if v["status"] == "published"])[-1]
    assert row["hash"] == row["published_hash"]

    r = httpx.post(f"{d.url}/v1/chat/completions", timeout=60, headers={"X-Session-Id": "sk-1"},
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200
    turn = d.wait_turn(int(r.headers["x-clawrl-turn-id"]))
    assert json.loads(turn["skills"]) == {"greeting": row["hash"]}

    # Broken: the published version stays, the error is recorded with its line and fix.
    (folder / "SKILL.md").write_text("---\nname: greeting\ndescription: [unclosed\n---\nbody\n")
    bad = until("an error row", lambda: [v for v in versions(d, "greeting") if v["status"] == "error"])[-1]
    issues = json.loads(bad["issues"])
    assert issues and issues[0]["file"].startswith("greeting/SKILL.md") and issues[0]["fix"]
    assert bad["published_hash"] == row["hash"]
    assert "Greet the user" in (target / "greeting" / "SKILL.md").read_text()
    listed = cli(d, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    entry = next(s for s in json.loads(listed.stdout)["skills"] if s["name"] == "greeting")
    assert entry["status"] == "error" and entry["issues"]

    # Deleted in the source: unpublished in OpenClaw's folder.
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    until("greeting unpublished", lambda: not (target / "greeting").exists())
    until("an unpublished row", lambda: versions(d, "greeting")[-1]["status"] == "unpublished")


def test_the_agent_endpoint_creates_patches_and_deletes(d, source, target):
    url = f"{d.url}/v1/skills"
    r = httpx.post(url, json={"name": "metric-units", "description": "Units: this user wants metric",
                              "instructions": "Give lengths in km and m, weights in kg."})
    assert r.status_code == 201, r.text
    assert r.json()["live"] is True and r.json()["status"] == "published"
    assert "kg" in (target / "metric-units" / "SKILL.md").read_text()

    again = httpx.post(url, json={"name": "metric-units", "description": "x", "instructions": "y"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "skill_exists"

    # An invalid patch (empty description) is refused whole; the live skill does not change.
    bad = httpx.patch(f"{url}/metric-units", json={"description": "", "instructions": "z"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_skill"
    assert "description" in bad.json()["error"]["message"]
    assert "kg" in (source / "metric-units" / "SKILL.md").read_text()

    ok = httpx.patch(f"{url}/metric-units", json={"description": "Units: metric, always",
                                                  "instructions": "Use SI units."})
    assert ok.status_code == 200 and ok.json()["live"] is True
    assert "SI units" in (target / "metric-units" / "SKILL.md").read_text()
    shown = httpx.get(f"{url}/metric-units").json()
    assert "SI units" in shown["files"]["SKILL.md"] and shown["state"]["status"] == "published"
    assert "metric-units" in httpx.get(url).json()["in_force"]

    gone = httpx.delete(f"{url}/metric-units")
    assert gone.status_code == 200 and gone.json()["status"] == "unpublished"
    assert not (target / "metric-units").exists() and not (source / "metric-units").exists()
    assert httpx.delete(f"{url}/metric-units").status_code == 404


@pytest.mark.parametrize("body", [
    {"name": "..", "description": "d", "instructions": "i"},
    {"name": ".hidden", "description": "d", "instructions": "i"},
    {"name": "Bad Name", "description": "d", "instructions": "i"},
    {"name": "ok-name", "files": {"SKILL.md": SKILL.format(name="ok-name", description="d"),
                                  "../../escape.txt": "x"}},
    {"name": "ok-name", "files": {"SKILL.md": SKILL.format(name="ok-name", description="d"),
                                  "/tmp/escape.txt": "x"}},
    {"name": "ok-name", "files": {"SKILL.md": SKILL.format(name="ok-name", description="d"),
                                  "references/../../../escape.txt": "x"}},
    {"name": "ok-name", "files": {"SKILL.md": SKILL.format(name="ok-name", description="d"),
                                  "notes.txt": "not an allowed place"}},
])
def test_the_endpoint_keeps_every_write_inside_the_skills_folder(d, body):
    before = tree(d.home.parent)
    r = httpx.post(f"{d.url}/v1/skills", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] in ("invalid_skill_path", "invalid_skill")
    after = tree(d.home.parent)
    # The daemon's own writers run meanwhile: its log, the turn log, and the proposer's drafts
    # (from earlier tests' corrections), none of them the endpoint's.
    own = (f"{d.home.name}/daemon-", f"{d.home.name}/skills-proposed/")
    new = {k for k in after if k not in before and not k.startswith(own) and "clawrl.db" not in k}
    assert new == set()
    assert not any(k.endswith(("escape.txt", "notes.txt")) or "ok-name" in k for k in after)


@pytest.mark.parametrize("path", ["..%2F..%2Fetc", "%2E%2E", "a%00b"])
def test_encoded_names_in_the_url_are_refused(d, path):
    for method in ("GET", "PATCH", "DELETE"):
        r = httpx.request(method, f"{d.url}/v1/skills/{path}", json={"description": "d",
                                                                      "instructions": "i"})
        assert r.status_code in (400, 404), (method, r.status_code, r.text)
        assert "error" in r.json()


def test_cli_new_makes_a_valid_skill_and_check_reports_breakage(d, source, target):
    made = cli(d, "new", "weekly-report", "--description", "How this user wants weekly reports")
    assert made.returncode == 0, made.stderr
    assert cli(d, "check").returncode == 0
    until("the template published", lambda: (target / "weekly-report" / "SKILL.md").exists())
    (source / "weekly-report" / "stray.txt").write_text("x")
    checked = cli(d, "check", str(source / "weekly-report"))
    assert checked.returncode == 1 and "stray.txt" in checked.stdout
    assert cli(d, "new", "weekly-report").returncode == 2     # exists already
    assert cli(d, "new", "../x").returncode == 2


def _corrected_session(d, session: str, correction: str, user: str = "ana") -> None:
    msgs = [{"role": "user", "content": "Tell me about the moon."}]
    first = httpx.post(f"{d.url}/v1/chat/completions", timeout=60, headers={"X-Session-Id": session,
                       "X-User-Id": user}, json={"messages": msgs, "max_tokens": 8})
    msgs += [{"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
             {"role": "user", "content": correction}]
    httpx.post(f"{d.url}/v1/chat/completions", timeout=60, headers={"X-Session-Id": session,
               "X-User-Id": user}, json={"messages": msgs, "max_tokens": 4})


def test_repeated_corrections_become_a_proposed_skill_that_accept_publishes(d, source, target):
    corrections = ["No, that's too long. Keep it shorter, two sentences.",
                   "Too long again! Shorter please.",
                   "Wrong length: I wanted it much shorter."]
    for i, text in enumerate(corrections):
        _corrected_session(d, f"prop-{i}", text)
    until("three judged corrections", lambda: len(d.rows(
        "SELECT id FROM turns WHERE session_id LIKE 'prop-%' AND judge_score=-1")) == 3, timeout=60)

    proposed = cli(d, "propose")      # skills.propose_after = 3 by default
    assert proposed.returncode == 0, proposed.stderr
    assert "proposed ana-prefers-shorter" in proposed.stdout
    draft = d.home / "skills-proposed" / "ana-prefers-shorter" / "SKILL.md"
    assert "Too long again! Shorter please." in draft.read_text()
    assert not (target / "ana-prefers-shorter").exists()          # a proposal is never published
    assert "nothing new" in cli(d, "propose").stdout               # and is proposed once
    listed = json.loads(cli(d, "list", "--json").stdout)
    assert [p["name"] for p in listed["proposed"]] == ["ana-prefers-shorter"]

    accepted = cli(d, "accept", "ana-prefers-shorter")
    assert accepted.returncode == 0, accepted.stderr
    assert (source / "ana-prefers-shorter" / "SKILL.md").exists() and not draft.exists()
    until("the accepted skill published",
             lambda: (target / "ana-prefers-shorter" / "SKILL.md").exists())
    missing = cli(d, "accept", "ana-prefers-shorter")
    assert missing.returncode == 2 and "no proposed skill" in missing.stderr


def test_forgetting_a_user_deletes_the_drafts_that_quote_them(d):
    for i in range(3):
        _corrected_session(d, f"bo-{i}", "No, don't use bullet points, write prose.", user="bo")
    until("bo's judged corrections", lambda: len(d.rows(
        "SELECT id FROM turns WHERE session_id LIKE 'bo-%' AND judge_score=-1")) == 3, timeout=60)
    assert "proposed bo-prefers-" in cli(d, "propose").stdout
    drafts = list((d.home / "skills-proposed").glob("bo-prefers-*"))
    assert drafts
    gone = subprocess.run([*CLAWRL, "forget", "--user", "bo", "--yes"], env=d.env,
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 0, gone.stderr
    assert "proposed skill draft" in gone.stdout
    assert not any(p.exists() for p in drafts)
    state = json.loads((d.home / "skills-proposed" / ".state.json").read_text())
    assert all(v["user"] != "bo" for v in state["seen"].values())

