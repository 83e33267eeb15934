"""`clawrl status`: what the daemon serves and where the learning loop stands.

The daemon's `/readyz` says whether it runs, what it serves and how its trainer is; the turn log
and the adapters folder are read directly, so everything but the live parts still shows when the
daemon is down.
"""
from __future__ import annotations

import datetime as dt
import json
import time

from ..adapters import versions as adapters
from ..config import Config
from ..turnlog.forget import count
from ..turnlog.store import read_counts
from .consolidate import about_left


def daemon_url(cfg: Config) -> str:
    """Where this machine reaches the daemon the recipe describes."""
    host = "127.0.0.1" if cfg.server.host in ("0.0.0.0", "::") else cfg.server.host
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{cfg.server.port}"


def probe(cfg: Config, timeout: float = 3.0) -> dict:
    """The daemon's /readyz: {"up": False} when nothing answers, {"up": True, "clawrl": False}
    when something that is not a clawrl daemon does."""
    import httpx
    headers = {"Authorization": f"Bearer {cfg.server.api_key}"} if cfg.server.api_key else {}
    try:
        r = httpx.get(f"{daemon_url(cfg)}/readyz", headers=headers, timeout=timeout)
    except httpx.ConnectError:
        return {"up": False}
    except httpx.HTTPError as e:
        return {"up": True, "clawrl": False, "error": f"{type(e).__name__}: {e}"}
    try:
        info = r.json()
    except ValueError:
        info = None
    if r.status_code == 401 and isinstance(info, dict) and \
            (info.get("error") or {}).get("code") == "invalid_api_key":
        return {"up": True, "clawrl": True, "status": "refused",
                "error": "the daemon refused this recipe's API key; set server.api_key "
                         "(or CLAWRL_SERVER_API_KEY) to the key it was started with"}
    ours = (isinstance(info, dict) and info.get("status") in ("ready", "loading", "failed")
            and (info["status"] != "ready" or "adapter_version" in info))
    if not ours:
        return {"up": True, "clawrl": False, "error": f"HTTP {r.status_code}: {r.text[:120]!r}"}
    return {"up": True, "clawrl": True, **info}


def last_adapter(cfg: Config) -> dict | None:
    version = adapters.newest(cfg.adapters_dir)
    if version is None:
        return None
    try:
        meta = adapters.read_meta(cfg.adapters_dir, version)
    except (OSError, ValueError):
        meta = {}
    return {"version": version, "loss": meta.get("loss"),
            "samples": len(meta.get("samples") or meta.get("consolidated") or []),
            "created_at": meta.get("created_at"),
            "rejected": adapters.rejection(cfg.adapters_dir, version)}


def gather(cfg: Config) -> dict:
    daemon = probe(cfg)
    live = daemon.get("status") == "ready"
    return {
        "url": daemon_url(cfg), "daemon": daemon,
        "model": daemon.get("model") if live else cfg.model.name, "source": cfg.model.source,
        "adapter": daemon["adapter_version"] if live else adapters.read_active(cfg.adapters_dir),
        "adapter_live": live,
        "trainer": daemon.get("trainer") if live else None, "train_enabled": cfg.train.enabled,
        "engine": daemon.get("engine") if live else None, "engine_kind": cfg.engine.kind,
        "counts": read_counts(cfg.db_path) if cfg.db_path.exists() else None,
        "last_adapter": last_adapter(cfg), "adapters": len(adapters.list_versions(cfg.adapters_dir)),
        "consolidation": adapters.read_consolidation(cfg.adapters_dir),
        "consolidate_when": cfg.consolidate.when,
        "home": str(cfg.home), "db": str(cfg.db_path),
    }


def _when(ts) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _version(v) -> str:
    return "base model" if not v else f"{v:04d}"


def engine_line(kind: str, e: dict | None) -> str:
    """What computes: the serving server's state (sglang/vllm), Tinker's, or the embedded model's."""
    if not e:
        return f"{kind} (not running)"
    state = e.get("state") or ("available" if e.get("available") else "unavailable")
    text = f"{e.get('kind', kind)}  {state}"
    where = [f"at {e['url']}" if e.get("url") else "", f"pid {e['pid']}" if e.get("pid") else "",
             count(e["restarts"], "restart") if e.get("restarts") else "",
             f"version {e['server_version']}" if e.get("server_version") else "",
             e.get("base_model") or ""]
    text += "".join(f", {w}" for w in where if w)
    if e.get("last_error"):
        text += f"; last error: {e['last_error']}"
    return text


def render(info: dict) -> str:
    d = info["daemon"]
    lines = []

    def row(label: str, text: str) -> None:
        lines.append(f"{label:<13}{text}")

    if not d["up"]:
        row("daemon", f"{info['url']}  not running (start it with `clawrl serve`)")
    elif not d["clawrl"]:
        row("daemon", f"{info['url']}  something else answers there ({d['error']}); "
                      "see `clawrl doctor`")
    else:
        row("daemon", f"{info['url']}  {d['status']}"
                      + (f": {d['error']}" if d.get("error") else ""))
    row("model", f"{info['model']}  ({info['source']})")
    row("engine", engine_line(info["engine_kind"], info["engine"]))
    if info["adapter_live"]:
        row("adapter", f"{_version(info['adapter'])} (live)")
    else:
        row("adapter", f"{_version(info['adapter'])} (live when the daemon last ran)"
            if info["adapter"] else "base model (no adapter was live)")
    if not info["train_enabled"]:
        row("trainer", "off (train.enabled = false)")
    elif info["trainer"]:
        row("trainer", info["trainer"] + (f"; {d['queue']} requests queued" if d.get("queue") else ""))
    else:
        row("trainer", "not running (the daemon starts it)")
    c = info["counts"]
    if c is None:
        row("turns", "none yet (the turn log is created by `clawrl serve`)")
    else:
        row("turns", f"{c['turns']} in {c['sessions']} sessions ({c['open_sessions']} open), "
                     f"{_when(c['first_at'])} .. {_when(c['last_at'])}" if c["turns"] else
                     f"0 in {c['sessions']} sessions")
        row("  waiting", f"{c['in_flight']} in flight, {c['awaiting_next_state']} for their next "
                         f"state, {c['awaiting_judge']} for the judge, {c['awaiting_trainer']} for "
                         "the trainer")
        row("  done", f"{c['judged']} judged, {c['with_feedback']} with feedback, "
                      f"{c['trained']} trained")
        row("  judge vs you", agreement_text(c.get("judge_vs_feedback")))
    a = info["last_adapter"]
    if a is None:
        row("last adapter", "none trained yet")
    else:
        loss = f"loss {a['loss']:.4f}" if isinstance(a["loss"], (int, float)) else "loss -"
        row("last adapter", f"{a['version']:04d}  {loss}, {count(a['samples'], 'sample')}, "
                            f"{_when(a['created_at'])}  ({info['adapters']} kept)"
                            + (f"  REJECTED: {a['rejected']}" if a["rejected"] else ""))
    row("consolidate", consolidation_text(info.get("consolidation"), info.get("consolidate_when")))
    row("home", info["home"])
    row("turn log", info["db"] + ("" if info["counts"] is not None else "  (not created yet)"))
    return "\n".join(lines)


def consolidation_text(c: dict | None, when: str | None) -> str:
    """The newest consolidation run (learn/consolidate.py) and the schedule."""
    schedule = f"schedule: {when}" if when else ""
    if not c:
        return f"none yet ({schedule}; `clawrl consolidate` runs one now)"
    if c.get("state") == "running":
        loss = f", loss {c['loss'][-1]:.4f}" if c.get("loss") else ""
        return (f"running since {_when(c.get('started_at'))}: step {c.get('step')} of {c.get('steps') or '?'}"
                f"{loss}{time_left(c)}")
    return f"{c.get('state')} {_when(c.get('finished_at'))}: {c.get('message')}  ({schedule})"


def time_left(c: dict, now: float | None = None) -> str:
    """The words `, about N min left` for a running consolidation that has taken a step, at the
    pace of its steps so far (from when training began, after the teacher's answers); else ""."""
    step, steps, began = c.get("step") or 0, c.get("steps") or 0, c.get("training_at")
    if not (began and 0 < step < steps):
        return ""
    return ", " + about_left((now if now is not None else time.time()) - began, step, steps - step)


def agreement_text(a: dict | None) -> str:
    """How often the judge read a turn as the user's explicit feedback rated it."""
    if not a or not a["rated"]:
        return "no turn both judged and rated yet (rate one with /clawrl good|bad)"
    return (f"agreed on {a['agree']} of {a['rated']} rated turns ({a['agreement']:.0%}), "
            f"wrong sign on {a['wrong_sign']}, no reading on {a['abstain']}")


def as_json(info: dict) -> str:
    return json.dumps(info, indent=1)
