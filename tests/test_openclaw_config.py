"""`clawrl openclaw-config`: the snippet it prints, and --write merging into an existing JSON5 file.

These run the real CLI in a subprocess on real files. `openclaw config validate` is not on PATH
here (the end-to-end tests run it for real), so the shape checks are what guards the write.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import json5

from clawrl.ops import openclaw_config as oc


def run(*args, home: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    # PATH without openclaw: these tests are about our own checks and merge.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCLAW_")}
    env.update(HOME=str(home), PATH=os.path.dirname(sys.executable) + ":/usr/bin:/bin", **(extra_env or {}))
    return subprocess.run([sys.executable, "-m", "clawrl", "openclaw-config", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_prints_a_provider_the_default_model_and_the_plugin_entry(tmp_path):
    r = run("--user-id", "alice", home=tmp_path, extra_env={"CLAWRL_SERVER_PORT": "31111"})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    provider = doc["models"]["providers"]["clawrl"]
    assert provider["baseUrl"] == "http://127.0.0.1:31111/v1"
    assert provider["api"] == "openai-completions"
    model = provider["models"][0]
    assert model["contextWindow"] == 32768 and model["maxTokens"] == 512
    assert doc["agents"]["defaults"]["model"]["primary"] == f"clawrl/{model['id']}"
    entry = doc["plugins"]["entries"]["clawrl"]
    assert entry["hooks"]["allowConversationAccess"] is True
    assert entry["config"] == {"daemonUrl": "http://127.0.0.1:31111", "userId": "alice"}
    assert "--write" in r.stderr  # tells the user what to do with it


def test_write_merges_into_a_json5_file_keeping_everything_else_and_a_backup(tmp_path):
    cfg = tmp_path / ".openclaw" / "openclaw.json"
    cfg.parent.mkdir()
    original = """// my settings
{
  gateway: { port: 18789 },
  models: { providers: { openai: { baseUrl: 'https://example.invalid/v1', apiKey: 'k',
                                   api: 'openai-completions', models: [] } } },
  agents: { defaults: { model: { primary: 'openai/gpt' }, workspace: '~/ws' } },
  plugins: { entries: { other: { enabled: true } }, load: { paths: ['/opt/p'] } },
}
"""
    cfg.write_text(original)
    r = run("--write", "--provider", "local", "--opt-out", home=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(cfg.read_text())
    assert doc["gateway"] == {"port": 18789}
    assert doc["models"]["providers"]["openai"]["apiKey"] == "k"
    assert doc["models"]["providers"]["local"]["baseUrl"] == "http://127.0.0.1:30000/v1"
    assert doc["agents"]["defaults"]["workspace"] == "~/ws"
    assert doc["agents"]["defaults"]["model"]["primary"].startswith("local/")
    assert doc["plugins"]["entries"]["other"] == {"enabled": True}
    assert doc["plugins"]["load"]["paths"] == ["/opt/p"]
    assert doc["plugins"]["entries"]["clawrl"]["config"]["providers"] == ["local"]
    assert doc["plugins"]["entries"]["clawrl"]["config"]["optOut"] is True
    backups = list(cfg.parent.glob("openclaw.json.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == original
    assert not list(cfg.parent.glob(".openclaw.json.clawrl-*"))  # no temp file left behind
    # Writing again changes nothing but the backup count: the merge is idempotent.
    assert run("--write", "--provider", "local", "--opt-out", home=tmp_path).returncode == 0
    assert json.loads(cfg.read_text()) == doc


def test_write_creates_the_file_and_honours_openclaw_config_path(tmp_path):
    target = tmp_path / "elsewhere" / "oc.json"
    r = run("--write", home=tmp_path, extra_env={"OPENCLAW_CONFIG_PATH": str(target)})
    assert r.returncode == 0, r.stderr
    assert json5.loads(target.read_text())["models"]["providers"]["clawrl"]["api"] == "openai-completions"
    assert not list(target.parent.glob("*.bak-*"))


def test_a_broken_file_is_refused_and_left_as_it_was(tmp_path):
    cfg = tmp_path / ".openclaw" / "openclaw.json"
    cfg.parent.mkdir()
    cfg.write_text("{ models: ")
    r = run("--write", home=tmp_path)
    assert r.returncode == 2
    assert "not valid JSON5" in r.stderr and "fix it or move it away" in r.stderr
    assert cfg.read_text() == "{ models: "
    assert not list(cfg.parent.glob("*.bak-*"))


def test_check_names_what_is_wrong():
    doc = {"models": {"providers": {"clawrl": {"baseUrl": "u", "apiKey": "k", "api": "openai-responses",
                                               "models": [{"id": "a"}]}}},
           "agents": {"defaults": {"model": {"primary": "clawrl/b"}}},
           "plugins": {"entries": {"clawrl": {}}}}
    problems = oc.check(doc, "clawrl")
    assert "models.providers.clawrl.api must be 'openai-completions'" in problems
    assert any("primary 'clawrl/b' names no model" in p for p in problems)
    assert any("allowConversationAccess must be true" in p for p in problems)
    assert oc.check({}, "clawrl") == ["models.providers.clawrl is missing"]


def test_merge_replaces_lists_and_scalars_and_merges_objects():
    assert oc.merge({"a": {"x": 1, "l": [1]}, "b": 2}, {"a": {"y": 2, "l": [3]}, "b": {"z": 1}}) == \
        {"a": {"x": 1, "y": 2, "l": [3]}, "b": {"z": 1}}
