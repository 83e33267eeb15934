"""`clawrl openclaw-config`: the provider block and plugin entry that point OpenClaw at clawrl.

It prints the snippet, or merges it into an existing `openclaw.json` (JSON5) keeping every other
setting, after a timestamped backup. What it writes is checked twice: by our own shape checks, and
by `openclaw config validate` on a temporary copy when `openclaw` is on PATH; the real file is only
replaced (atomically) when both pass. Comments in a JSON5 file do not survive the rewrite; the
backup keeps them.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import json5

from ..errors import ClawrlError

PLUGIN_ID = "clawrl"


def default_path() -> Path:
    if os.environ.get("OPENCLAW_CONFIG_PATH"):
        return Path(os.environ["OPENCLAW_CONFIG_PATH"])
    state = os.environ.get("OPENCLAW_STATE_DIR")
    return (Path(state) if state else Path.home() / ".openclaw") / "openclaw.json"


def snippet(cfg, base_url: str, provider: str = PLUGIN_ID, user_id: str | None = None,
            opt_out: bool = False) -> dict:
    """The parts of openclaw.json that clawrl owns, for a daemon at `base_url` serving `cfg`."""
    model = cfg.model.name
    plugin_config: dict = {"daemonUrl": base_url}
    if provider != PLUGIN_ID:
        plugin_config["providers"] = [provider]
    if user_id:
        plugin_config["userId"] = user_id
    if opt_out:
        plugin_config["optOut"] = True
    return {
        "models": {"providers": {provider: {
            "baseUrl": f"{base_url}/v1",
            # OpenClaw requires a key; the daemon checks it only when server.api_key is set.
            "apiKey": cfg.server.api_key or "clawrl-local",
            "api": "openai-completions",
            "models": [{
                "id": model, "name": f"{model} (clawrl)", "reasoning": False, "input": ["text"],
                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                "contextWindow": cfg.model.context_length,
                "maxTokens": cfg.model.default_max_tokens,
            }],
        }}},
        "agents": {"defaults": {"model": {"primary": f"{provider}/{model}"}}},
        "plugins": {"entries": {PLUGIN_ID: {
            "enabled": True,
            # Without it OpenClaw silently skips before_model_resolve, and heartbeats, cron and
            # memory runs would be tagged as the user's own turns.
            "hooks": {"allowConversationAccess": True},
            "config": plugin_config,
        }}},
    }


def merge(base: dict, ours: dict) -> dict:
    """`base` with `ours` laid over it: objects merge key by key, anything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in ours.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def check(doc: dict, provider: str) -> list[str]:
    """Shape problems in a merged config, as messages that name the key."""
    problems = []
    p = doc.get("models", {}).get("providers", {}).get(provider)
    if not isinstance(p, dict):
        return [f"models.providers.{provider} is missing"]
    for key in ("baseUrl", "apiKey", "api", "models"):
        if not p.get(key):
            problems.append(f"models.providers.{provider}.{key} is missing")
    if p.get("api") != "openai-completions":
        problems.append(f"models.providers.{provider}.api must be 'openai-completions'")
    ids = [m.get("id") for m in p.get("models") or [] if isinstance(m, dict)]
    primary = doc.get("agents", {}).get("defaults", {}).get("model", {}).get("primary", "")
    if primary.startswith(provider + "/") and primary[len(provider) + 1:] not in ids:
        problems.append(f"agents.defaults.model.primary {primary!r} names no model of "
                        f"models.providers.{provider}")
    entry = doc.get("plugins", {}).get("entries", {}).get(PLUGIN_ID, {})
    if not entry.get("hooks", {}).get("allowConversationAccess"):
        problems.append(f"plugins.entries.{PLUGIN_ID}.hooks.allowConversationAccess must be true")
    return problems


def openclaw_validate(path: Path) -> str | None:
    """OpenClaw's own verdict on `path`, or None when it is valid or openclaw is not installed."""
    exe = shutil.which("openclaw")
    if not exe:
        return None
    env = {**os.environ, "OPENCLAW_CONFIG_PATH": str(path), "OPENCLAW_NO_AUTO_UPDATE": "1"}
    r = subprocess.run([exe, "config", "validate"], env=env, capture_output=True, text=True,
                       timeout=120)
    return None if r.returncode == 0 else (r.stdout + r.stderr).strip()[-2000:]


def write(path: Path, ours: dict, provider: str) -> Path | None:
    """Merge `ours` into `path` (created if absent). Returns the backup's path, if one was made."""
    existing: dict = {}
    if path.exists():
        try:
            existing = json5.loads(path.read_text() or "{}")
        except ValueError as e:
            raise ClawrlError(f"{path} is not valid JSON5 ({e}); fix it or move it away, then "
                              "run this again") from None
        if not isinstance(existing, dict):
            raise ClawrlError(f"{path} must hold a JSON object")
    merged = merge(existing, ours)
    problems = check(merged, provider)
    if problems:
        raise ClawrlError("the merged config would be wrong:\n  " + "\n  ".join(problems))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.clawrl-{os.getpid()}.tmp")
    tmp.write_text(json.dumps(merged, indent=2) + "\n")
    try:
        verdict = openclaw_validate(tmp)
        if verdict:
            raise ClawrlError(f"`openclaw config validate` rejects the merged config; {path} is "
                              f"unchanged:\n{verdict}")
        backup = None
        if path.exists():
            backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
            shutil.copy2(path, backup)
        os.replace(tmp, path)
        return backup
    finally:
        tmp.unlink(missing_ok=True)


def main(args, cfg, base_url: str) -> int:
    """`clawrl openclaw-config [--write]`."""
    ours = snippet(cfg, base_url, provider=args.provider, user_id=args.user_id, opt_out=args.opt_out)
    if not args.write:
        print(json.dumps(ours, indent=2))
        print("\n# Merge this into ~/.openclaw/openclaw.json (or run with --write), then restart "
              "the gateway: openclaw gateway restart", file=sys.stderr)
        return 0
    path = Path(args.file).expanduser() if args.file else default_path()
    backup = write(path, ours, args.provider)
    print(f"wrote {path}" + (f" (backup: {backup})" if backup else ""))
    print("restart the gateway to pick it up: openclaw gateway restart")
    return 0
