"""The `clawrl` command: serve the daemon, look into the turn log, chat with it."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import uuid

from .. import __version__
from ..errors import ClawrlError

# OpenMP's wait policy is left at its default (spin briefly, then sleep): the embedded engine's
# worker is the one thread that runs multi-threaded torch, and a decode step's hundreds of small
# parallel regions are 3x slower when the workers sleep between them (PASSIVE: 17.6 against 56
# tok/s, bench/RESULTS-serve.md). Set OMP_WAIT_POLICY yourself to choose otherwise.


def _config(args, **overrides):
    from ..config import load_config
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
    from ..serve.server import serve
    cfg = _config(args, **{"server.host": args.host, "server.port": args.port})
    serve(cfg)
    return 0


def cmd_status(args) -> int:
    from . import status
    info = status.gather(_config(args))
    print(status.as_json(info) if args.json else status.render(info))
    return 0


def _need_db(cfg):
    if not cfg.db_path.exists():
        raise ClawrlError(f"no turn log at {cfg.db_path} yet: start the daemon with `clawrl serve` "
                          "(or set CLAWRL_HOME to the daemon's data directory)")
    return cfg.db_path


def cmd_sessions(args) -> int:
    from ..turnlog.store import read_sessions
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
    from ..turnlog.store import read_turns
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
    cfg = _config(args)   # a bad recipe fails here, before torch loads, in a crash loop too
    from ..learn.trainer import main_loop
    main_loop(cfg)
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


def cmd_consolidate(args) -> int:
    from .consolidate import main
    return main(args, _config(args))


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
    from .openclaw_config import main
    cfg = _config(args)
    return main(args, cfg, (args.base_url or _base_url(cfg)).rstrip("/"))


def cmd_eval(args) -> int:
    from ..evals.evaluate import main
    return main(args, _config(args))


def cmd_install_service(args) -> int:
    from .service import cmd_install_service as run
    return run(args)


def cmd_export(args) -> int:
    from pathlib import Path

    from ..turnlog import export
    cfg = _config(args)
    filters = export.Filters(
        session=args.session, user=args.user, judged_only=args.judged_only,
        since=export.parse_when(args.since) if args.since else None,
        until=export.parse_when(args.until, end=True) if args.until else None)
    if args.out:
        n = export.export_to_file(_need_db(cfg), filters, Path(args.out))
        print(f"exported {n} turns to {args.out}", file=sys.stderr)
    else:
        try:
            n = export.export(_need_db(cfg), filters, sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:   # `clawrl export | head`: the reader has all it wants
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        print(f"exported {n} turns", file=sys.stderr)
    return 0


def _confirm(question: str) -> bool:
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


def cmd_forget(args) -> int:
    from ..turnlog import forget
    cfg = _config(args)
    db = _need_db(cfg)
    if args.older_than is not None:
        if args.older_than <= 0:
            raise ClawrlError("--older-than takes a positive number of days")
        what = f"turns older than {args.older_than:g} days that the judge and trainer are done with"
        if not args.yes and sys.stdin.isatty() and not _confirm(f"delete {what}?"):
            print("nothing deleted")
            return 1
        gone = forget.prune(db, args.older_than)
    else:
        who = f"session {args.session}" if args.session else f"user {args.user}"
        plan = forget.preview(db, session=args.session, user=args.user)
        if not plan.turns and not plan.sessions and not plan.feedback_cleared:
            print(f"nothing recorded for {who}")
            return 0
        if not args.yes and sys.stdin.isatty() and not _confirm(
                f"delete {forget.count(plan.turns, 'turn')} in "
                f"{forget.count(len(plan.per_session), 'session')} of {who}?"):
            print("nothing deleted")
            return 1
        gone = forget.forget(db, session=args.session, user=args.user)
    print(forget.describe(gone))
    if args.user:
        from ..skills.proposals import Proposals
        from ..skills.bridge import proposals_folder, source_folder
        drafts = Proposals(proposals_folder(cfg), source_folder(cfg)).forget_user(args.user)
        if drafts:
            print(f"deleted {forget.count(len(drafts), 'proposed skill draft')} quoting "
                  f"{args.user}'s corrections: {', '.join(drafts)}")
    return 0


def cmd_doctor(args) -> int:
    from pathlib import Path

    from . import doctor
    checks = doctor.run(args.recipe, args.base_url,
                        Path(args.openclaw_config) if args.openclaw_config else None)
    for c in checks:
        print(c.line())
    bad = sum(not c.ok for c in checks)
    print(f"\n{bad} problem{'s' if bad != 1 else ''} found" if bad else "\nall good")
    return 1 if bad else 0


def cmd_recipe_keys(args) -> int:
    from ..config import describe
    print(describe())
    return 0


# -- parser --------------------------------------------------------------------------------------------

def cmd_skills(args) -> int:
    from ..skills import cli as skills_cli
    return skills_cli.main(args, _config(args))


def cmd_agents(args) -> int:
    from ..agents import cli as agents_cli
    return agents_cli.main(args, _config(args))


def cmd_judge(args) -> int:
    from ..judge import evaluate as judge_eval
    return judge_eval.main(args, _config(args))


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
    sp = add("status", cmd_status, "show whether the daemon runs, what it serves and where the "
                                   "learning loop stands (read from the turn log when it is down)")
    sp.add_argument("--json", action="store_true", help="print JSON")
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
    sp = add("consolidate", cmd_consolidate,
             "train a fresh adapter from the newest judged turns with TRL's KTO (what the "
             "recipe's [consolidate] schedule runs in quiet hours); the daemon serves it like any version")
    from .consolidate import add_arguments as add_consolidate_arguments
    add_consolidate_arguments(sp)
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
    sp = add("eval", cmd_eval, "simulate users (personas) against fresh daemons and measure how the "
                               "held-out score moves with interactions, per learning method")
    sp.add_argument("--persona", action="append", required=True,
                    help="built-in persona (concise, student, teacher, yesno) or a persona .py file; repeatable")
    sp.add_argument("--methods", default="rl,opd,combine", help="comma list (default rl,opd,combine)")
    sp.add_argument("--no-control", dest="control", action="store_false",
                    help="skip the no-train control run")
    sp.add_argument("--judge", choices=("probe", "rules", "engine", "openai"),
                    help="judge backend of the daemons (default: the recipe's)")
    sp.add_argument("--seeds", type=int, default=3, help="seeds per method (default 3)")
    sp.add_argument("--interactions", type=int, default=36, help="interactions per run (default 36)")
    sp.add_argument("--checkpoints", default="0,12,24,36",
                    help="held-out measurements after these many interactions (default 0,12,24,36)")
    sp.add_argument("--heldout", type=int, default=40, help="held-out prompts per checkpoint (default 40)")
    sp.add_argument("--consolidate-at", metavar="N,M",
                    help="also run each method with consolidation (`clawrl consolidate`) after these "
                         "many interactions, on the same seeds, e.g. 36,72")
    sp.add_argument("--settle-timeout", type=float, default=600,
                    help="seconds to wait at a checkpoint for judge, trainer and swap, and for a "
                         "consolidation to take its next step (default 600)")
    sp.add_argument("--out", default="bench/out/eval", help="where results go (default bench/out/eval)")
    sp.add_argument("--work", help="where the runs' daemon homes go (default: a temp folder)")
    sp.add_argument("--resume", action="store_true",
                    help="keep the completed runs already in --out's results.json and run only "
                         "the rest (a failed run is recorded, and the others go on)")
    sp = add("export", cmd_export, "write recorded turns as JSON Lines for other trainers: request, "
                                   "response tokens and logprobs, next state, judge, feedback")
    sp.add_argument("--format", default="jsonl", choices=("jsonl",), help="output format (jsonl)")
    sp.add_argument("--out", help="write to this file (default: stdout)")
    sp.add_argument("--session", help="only this session")
    sp.add_argument("--user", help="only this user's turns and sessions")
    sp.add_argument("--since", help="only turns created at or after this date (YYYY-MM-DD[THH:MM], local)")
    sp.add_argument("--until", help="only turns created before this date; a bare date includes that day")
    sp.add_argument("--judged-only", action="store_true",
                    help="only turns with a reward: a judge score or explicit feedback")
    sp = add("forget", cmd_forget, "delete a session's or a user's turns, or old settled ones "
                                   "(adapters are kept); works while the daemon runs")
    which = sp.add_mutually_exclusive_group(required=True)
    which.add_argument("--session", help="delete this session's turns and session row")
    which.add_argument("--user", help="delete this user's turns, sessions and feedback")
    which.add_argument("--older-than", type=float, metavar="DAYS",
                       help="delete turns older than DAYS that the judge and trainer are done with")
    sp.add_argument("--yes", action="store_true", help="do not ask (it never asks without a terminal)")
    sp = add("doctor", cmd_doctor, "check the model, port, data directory, turn log, OpenClaw config "
                                   "and plugin; say how to fix each problem (exit 1 if any)")
    sp.add_argument("--base-url", help="the daemon's URL as OpenClaw reaches it "
                                       "(default: from the recipe's server.host and port)")
    sp.add_argument("--openclaw-config", help="OpenClaw config file (default: $OPENCLAW_CONFIG_PATH, "
                                              "else ~/.openclaw/openclaw.json)")
    sp = add("install-service", cmd_install_service,
             "write the systemd unit for this installation (then: systemctl enable --now clawrl)",
             recipe=False)
    sp.add_argument("--user", action="store_true", help="a user unit (~/.config/systemd/user) "
                                                        "instead of a system one")
    sp.add_argument("--dry-run", action="store_true", help="print the unit, write nothing")
    sp = add("skills", cmd_skills, "write, check and list OpenClaw skills that clawrl publishes; "
                                   "accept or reject skills proposed from repeated corrections")
    from ..skills.cli import add_arguments
    add_arguments(sp)
    sp = add("agents", cmd_agents, "tool-calling, terminal and software-engineering agents: play "
                                   "sandboxed environments against the daemon and learn from them")
    from ..agents.cli import add_arguments as add_agents_arguments
    add_agents_arguments(sp)
    sp = sub.add_parser("judge", help="measure a judge on labelled feedback, or fit the probe "
                                      "judge's head", description="Measure how well a judge reads "
                                      "feedback (`judge eval`), or fit the probe judge (`judge train`).")
    sp.set_defaults(fn=cmd_judge)
    from ..judge.evaluate import add_arguments as add_judge_arguments
    add_judge_arguments(sp)
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
