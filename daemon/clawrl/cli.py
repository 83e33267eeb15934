"""The `clawrl` command: serve the daemon, look into the turn log, chat with it."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import uuid

from . import __version__
from .errors import ClawrlError

# On a busy 2-core machine OpenMP's default spin-wait makes every op ~8 ms slower; this must be
# set before torch is imported (engines import it lazily).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _config(args, **overrides):
    from .config import load_config
    return load_config(getattr(args, "recipe", None), overrides=overrides)


def _base_url(cfg) -> str:
    host = "127.0.0.1" if cfg.server.host in ("0.0.0.0", "::") else cfg.server.host
    return f"http://{host}:{cfg.server.port}"


def _headers(cfg) -> dict:
    return {"Authorization": f"Bearer {cfg.server.api_key}"} if cfg.server.api_key else {}


def _when(ts) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


# -- commands -----------------------------------------------------------------------------------------

def cmd_serve(args) -> int:
    from .server import serve
    cfg = _config(args, **{"server.host": args.host, "server.port": args.port})
    serve(cfg)
    return 0


def cmd_status(args) -> int:
    import httpx
    cfg = _config(args)
    url = _base_url(cfg)
    try:
        r = httpx.get(f"{url}/readyz", headers=_headers(cfg), timeout=5)
        info = r.json()
        print(f"daemon     {url}  {info.get('status')}")
        for key in ("model", "adapter_version", "context_length", "queue", "trainer", "turns",
                    "in_flight_or_incomplete", "with_next_state", "awaiting_judge", "judged",
                    "error"):
            if info.get(key) is not None:
                print(f"{key:<24} {info[key]}")
    except httpx.HTTPError:
        print(f"daemon     {url}  not running (start it with `clawrl serve`)")
    print(f"home       {cfg.home}")
    print(f"turn log   {cfg.db_path}{'' if cfg.db_path.exists() else '  (not created yet)'}")
    return 0


def _need_db(cfg):
    if not cfg.db_path.exists():
        raise ClawrlError(f"no turn log at {cfg.db_path} yet: start the daemon with `clawrl serve` "
                          "(or set CLAWRL_HOME to the daemon's data directory)")
    return cfg.db_path


def cmd_sessions(args) -> int:
    from .store import read_sessions
    cfg = _config(args)
    rows = read_sessions(_need_db(cfg), args.limit)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'session':<34} {'user':<12} {'turns':>5} {'main':>5}  {'last seen':<19}  ended")
    for r in rows:
        print(f"{r['id'][:34]:<34} {(r['user_id'] or '-')[:12]:<12} {r['turns']:>5} "
              f"{r['main_turns'] or 0:>5}  {_when(r['last_seen'])}  {_when(r['ended_at'])}")
    return 0


def cmd_turns(args) -> int:
    from .store import read_turns
    cfg = _config(args)
    rows = read_turns(_need_db(cfg), args.session, args.limit)
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    for r in rows:
        text = (r["response_text"] or "").replace("\n", " ")
        nxt = f" next={r['next_state_role']}" if r["next_state_role"] else ""
        print(f"#{r['id']:<5} {r['session_id'][:20]:<20} {r['turn_index']:>3} {r['kind']:<10} "
              f"{r['status']:<9} {r['finish_reason'] or '-':<10} {r['completion_tokens'] or 0:>4} tok "
              f"v{r['adapter_version']}{nxt}  {text[:60]}")
    return 0


def cmd_chat(args) -> int:
    import httpx
    cfg = _config(args)
    url, session = _base_url(cfg), f"chat-{uuid.uuid4().hex[:12]}"
    messages: list[dict] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    interactive = sys.stdin.isatty()
    print(f"chatting with {url} (session {session}); /new starts over, /exit or Ctrl-D quits",
          file=sys.stderr)
    with httpx.Client(timeout=None, headers=_headers(cfg)) as client:
        while True:
            try:
                line = input("you> " if interactive else "")
            except EOFError:
                return 0
            if line.strip() in ("/exit", "/quit"):
                return 0
            if line.strip() == "/new":
                session, messages = f"chat-{uuid.uuid4().hex[:12]}", messages[:1 if args.system else 0]
                continue
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line})
            body = {"model": "clawrl", "messages": messages, "stream": True,
                    "max_tokens": args.max_tokens, "temperature": args.temperature}
            reply = []
            print("bot> ", end="", flush=True)
            try:
                with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                                   headers={"X-Session-Id": session}) as r:
                    if r.status_code != 200:
                        r.read()
                        print(f"[error {r.status_code}] {r.json()['error']['message']}")
                        messages.pop()
                        continue
                    for line_ in r.iter_lines():
                        if not line_.startswith("data: ") or line_ == "data: [DONE]":
                            continue
                        chunk = json.loads(line_[6:])
                        for choice in chunk.get("choices", []):
                            piece = choice["delta"].get("content") or ""
                            reply.append(piece)
                            print(piece, end="", flush=True)
            except httpx.HTTPError as e:
                raise ClawrlError(f"cannot reach the daemon at {url} ({e}); start it with `clawrl serve`")
            print()
            messages.append({"role": "assistant", "content": "".join(reply)})


def cmd_train(args) -> int:
    from .trainer import main_loop
    main_loop(_config(args))
    return 0


def _daemon_call(cfg, method: str, path: str, **kw) -> dict:
    import httpx
    url = _base_url(cfg)
    try:
        r = httpx.request(method, f"{url}{path}", headers=_headers(cfg), timeout=120, **kw)
    except httpx.HTTPError as e:
        raise ClawrlError(f"cannot reach the daemon at {url} ({e}); start it with `clawrl serve`")
    if r.status_code != 200:
        raise ClawrlError(r.json().get("error", {}).get("message", r.text))
    return r.json()


def cmd_adapters(args) -> int:
    cfg = _config(args)
    if args.action == "activate":
        if args.version is None:
            raise ClawrlError("say which version: `clawrl adapters activate N` (0 = the base model)")
        print(f"active: {_daemon_call(cfg, 'POST', '/v1/adapters/activate', json={'version': args.version})['active']}")
        return 0
    if args.action == "rollback":
        print(f"rolled back; active: {_daemon_call(cfg, 'POST', '/v1/adapters/rollback')['active']}")
        return 0
    info = _daemon_call(cfg, "GET", "/v1/adapters")
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"active version: {info['active']}  (0 = base model)")
    if info.get("trainer"):
        print(f"trainer: {info['trainer']['state']} (restarts {info['trainer']['restarts']})")
    for v in info["versions"]:
        mark = "*" if v["version"] == info["active"] else " "
        loss = f"{v['loss']:.4f}" if isinstance(v["loss"], (int, float)) else "-"
        print(f"{mark} {v['version']:04d}  parent {v['parent'] if v['parent'] is not None else '-':<4} "
              f"samples {v['samples']:<3} loss {loss:<8} {_when(v['created_at'])}"
              f"{'  REJECTED: ' + v['rejected'] if v['rejected'] else ''}")
    return 0


def cmd_openclaw_config(args) -> int:
    from pathlib import Path

    from . import openclaw_config as oc
    cfg = _config(args)
    ours = oc.snippet(cfg, (args.base_url or _base_url(cfg)).rstrip("/"), provider=args.provider,
                      user_id=args.user_id, opt_out=args.opt_out)
    if not args.write:
        print(json.dumps(ours, indent=2))
        print("\n# Merge this into ~/.openclaw/openclaw.json (or run with --write), then restart "
              "the gateway: openclaw gateway restart", file=sys.stderr)
        return 0
    path = Path(args.file).expanduser() if args.file else oc.default_path()
    backup = oc.write(path, ours, args.provider)
    print(f"wrote {path}" + (f" (backup: {backup})" if backup else ""))
    print("restart the gateway to pick it up: openclaw gateway restart")
    return 0


def cmd_recipe_keys(args) -> int:
    from .config import describe
    print(describe())
    return 0


# -- parser --------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="clawrl",
        description="Serve a model to OpenClaw behind an OpenAI-compatible API, record every turn, "
                    "and learn from use. Data lives in $CLAWRL_HOME (default ~/.clawrl).",
        epilog="Every recipe key can be overridden with CLAWRL_<SECTION>_<KEY> "
               "(see `clawrl recipe-keys`).")
    p.add_argument("--version", action="version", version=f"clawrl {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def add(name, fn, help, recipe=True):
        sp = sub.add_parser(name, help=help, description=help)
        if recipe:
            sp.add_argument("--recipe", help="recipe TOML path or name under recipes/ "
                                             "(default: $CLAWRL_RECIPE or default)")
        sp.set_defaults(fn=fn)
        return sp

    sp = add("serve", cmd_serve, "run the daemon in the foreground")
    sp.add_argument("--host", help="bind address (default from the recipe: 127.0.0.1)")
    sp.add_argument("--port", type=int, help="bind port (default from the recipe: 30000)")
    add("status", cmd_status, "show whether the daemon runs and what it serves")
    sp = add("sessions", cmd_sessions, "list recorded sessions, newest first")
    sp.add_argument("--limit", type=int, default=50, help="how many (default 50)")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp = add("turns", cmd_turns, "list recorded turns, oldest of the newest N first")
    sp.add_argument("--session", help="only this session")
    sp.add_argument("--limit", type=int, default=50, help="how many (default 50)")
    sp.add_argument("--json", action="store_true", help="print one JSON object per turn, all fields")
    sp = add("chat", cmd_chat, "chat with a running daemon in the terminal")
    sp.add_argument("--system", help="a system prompt")
    sp.add_argument("--max-tokens", type=int, default=256, help="reply budget (default 256)")
    sp.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    add("train", cmd_train, "run the trainer in the foreground (the daemon normally starts it)")
    sp = add("adapters", cmd_adapters, "list adapter versions, activate one, or roll back "
                                       "(talks to the running daemon)")
    sp.add_argument("action", nargs="?", default="list", choices=("list", "activate", "rollback"))
    sp.add_argument("version", nargs="?", type=int, help="with activate: the version (0 = base)")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp = add("openclaw-config", cmd_openclaw_config,
             "print the provider block and plugin entry for openclaw.json, or merge them into it")
    sp.add_argument("--write", action="store_true",
                    help="merge into the config file, keeping everything else and a backup")
    sp.add_argument("--file", help="with --write: the file (default: $OPENCLAW_CONFIG_PATH, else "
                                   "~/.openclaw/openclaw.json)")
    sp.add_argument("--provider", default="clawrl", help="provider id to use (default clawrl)")
    sp.add_argument("--base-url", help="the daemon's URL as OpenClaw reaches it "
                                       "(default: from the recipe's server.host and port)")
    sp.add_argument("--user-id", help="whose feedback this is (default: the message sender)")
    sp.add_argument("--opt-out", action="store_true", help="serve and log, but never train")
    add("recipe-keys", cmd_recipe_keys, "list every recipe key with its default and meaning",
        recipe=False)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return 2
    try:
        return args.fn(args)
    except ClawrlError as e:
        print(f"clawrl: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
