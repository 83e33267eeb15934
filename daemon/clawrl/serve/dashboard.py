"""The web dashboard: one static page at /dashboard and the read-only JSON it polls.

The page (static/dashboard.html: plain HTML and JavaScript, no build step, nothing fetched from
elsewhere) and every /v1/dashboard/* endpoint sit behind the API key like the rest of the API. A
browser that opens /dashboard without it gets static/login.html instead (from the proxy's key
check): it asks for the key once, keeps it in sessionStorage, and loads the page with it as a
Bearer header, the same header the page then sends on every call. The key never goes into a URL
or a cookie (see SECURITY.md).

Reads use their own sqlite3 connection in a thread: safe beside the daemon's writer under WAL, and
they never wait on the store's write lock. The page's buttons call the control endpoints
(serve/control.py); this module changes nothing.
"""
from __future__ import annotations

import asyncio
import sqlite3
from importlib import resources
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ..skills import bridge as skills_module
from ..chat.format import content_text
from ..errors import RequestError
from ..turnlog.rows import value
from ..turnlog.store import connect_sync

EXCERPT_CHARS, RESPONSE_CHARS = 600, 4000
# Scripts and styles are inline; anything from another origin is refused, and no other site may
# frame the page (its buttons roll adapters back).
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
HEADERS = {"Cache-Control": "no-store", "Content-Security-Policy": CSP,
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def _limit(request: Request, default: int, most: int) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    # isdigit() alone takes "²" (which int() refuses) and 5000-digit numbers (which it refuses too).
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or not 1 <= int(raw) <= most:
        raise RequestError(f"'limit' must be an integer from 1 to {most}", param="limit",
                           code="invalid_value")
    return int(raw)


async def _read(request: Request, fn, *args):
    """Run `fn(db, *args)` on a fresh read connection to the turn log, off the event loop."""
    path = request.app.state.daemon.cfg.db_path

    def run():
        db = connect_sync(path)
        try:
            return fn(db, *args)
        finally:
            db.close()
    return await asyncio.to_thread(run)


def _json(row, column: str):
    """A JSON column for display: what does not parse shows as nothing."""
    try:
        return value(row, column)
    except ValueError:
        return None


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + "…"


# -- reads -----------------------------------------------------------------------------------------

def read_sessions(db: sqlite3.Connection, limit: int) -> list[dict]:
    rows = db.execute(
        "SELECT s.id, s.user_id, s.derived, s.created_at, s.last_seen, s.ended_at,"
        " count(t.id) AS turns, coalesce(sum(t.turn_type='main'), 0) AS main_turns,"
        " coalesce(sum(t.judge_status='done'), 0) AS judged, avg(t.judge_score) AS mean_score,"
        " count(t.feedback_reward) AS feedback"
        " FROM sessions s LEFT JOIN turns t ON t.session_id = s.id"
        " GROUP BY s.id ORDER BY s.last_seen DESC LIMIT ?", (limit,)).fetchall()
    return [{**dict(r), "derived": bool(r["derived"])} for r in rows]


def _prompt(row) -> dict:
    """The message that prompted the turn: the last user message, else the last one."""
    messages = (_json(row, "request_json") or {}).get("messages") or []
    last = next((m for m in reversed(messages) if m.get("role") == "user"),
                messages[-1] if messages else {})
    return {"role": last.get("role"), "text": _clip(content_text(last.get("content")), EXCERPT_CHARS),
            "messages": len(messages)}


def read_turns(db: sqlite3.Connection, session_id: str, limit: int) -> list[dict] | None:
    if db.execute("SELECT 1 FROM sessions WHERE id=?", (session_id,)).fetchone() is None:
        return None
    rows = db.execute(
        "SELECT id, turn_index, turn_type, kind, trainable, status, adapter_version, request_json,"
        " response_text, tool_calls, finish_reason, prompt_tokens, completion_tokens, error,"
        " created_at, total_ms, next_state_role, judge_status, judge_votes, judge_score, judge_hint,"
        " judge_error, judged_at, feedback_reward, feedback_comment, feedback_at"
        " FROM turns WHERE session_id=? ORDER BY turn_index DESC LIMIT ?",
        (session_id, limit)).fetchall()
    turns = []
    for r in reversed(rows):
        t = {k: r[k] for k in r.keys() if k not in ("request_json", "judge_votes", "tool_calls")}
        t.update(trainable=bool(r["trainable"]), prompt=_prompt(r),
                 response_text=_clip(r["response_text"] or "", RESPONSE_CHARS),
                 tool_calls=_json(r, "tool_calls"), judge_votes=_json(r, "judge_votes"))
        turns.append(t)
    return turns


def read_rewards(db: sqlite3.Connection, limit: int) -> list[dict]:
    """Judged or rated turns, oldest first; `reward` is the feedback where given, else the judge's."""
    rows = db.execute(
        "SELECT id, session_id, created_at, adapter_version, judge_score, feedback_reward"
        " FROM turns WHERE judge_status='done' OR feedback_reward IS NOT NULL"
        " ORDER BY created_at DESC, id DESC LIMIT ?", (limit,)).fetchall()
    return [{"turn_id": r["id"], "session_id": r["session_id"], "at": r["created_at"],
             "adapter_version": r["adapter_version"], "judge_score": r["judge_score"],
             "feedback": r["feedback_reward"],
             "reward": r["feedback_reward"] if r["feedback_reward"] is not None else r["judge_score"]}
            for r in reversed(rows)]


def read_skills(folder: Path, most: int = 100) -> list[dict]:
    """Each skill folder with a SKILL.md: its name and description from the YAML front matter."""
    skills = []
    for d in sorted(p for p in folder.iterdir() if (p / "SKILL.md").is_file())[:most]:
        meta = {"name": d.name, "description": ""}
        lines = (d / "SKILL.md").read_text(errors="replace").splitlines()
        if lines and lines[0].strip() == "---":
            for line in lines[1:]:
                if line.strip() == "---":
                    break
                key, sep, value = line.partition(":")
                if sep and key.strip() in meta and value.strip():
                    meta[key.strip()] = value.strip().strip("\"'")
        skills.append({**meta, "folder": d.name})
    return skills


# -- handlers --------------------------------------------------------------------------------------

def _static(name: str) -> str:
    return (resources.files("clawrl") / "static" / name).read_text(encoding="utf-8")


async def page(request: Request) -> Response:
    return HTMLResponse(_static("dashboard.html"), headers=HEADERS)


def login_page() -> Response:
    """What a browser gets at /dashboard without the key: a form for it, and no data."""
    return HTMLResponse(_static("login.html"), status_code=401,
                        headers={**HEADERS, "WWW-Authenticate": "Bearer"})


async def sessions(request: Request) -> Response:
    rows = await _read(request, read_sessions, _limit(request, 50, 1000))
    return JSONResponse({"sessions": rows})


async def session_turns(request: Request) -> Response:
    session_id = request.path_params["session_id"]
    turns = await _read(request, read_turns, session_id, _limit(request, 200, 2000))
    if turns is None:
        raise RequestError(f"no session {session_id!r} has been recorded", status=404,
                           param="session_id", code="session_not_found")
    return JSONResponse({"session_id": session_id, "turns": turns})


async def rewards(request: Request) -> Response:
    state = request.app.state.daemon
    points = await _read(request, read_rewards, _limit(request, 2000, 20000))
    swapper = state.swapper
    versions = (await asyncio.to_thread(swapper.status))["versions"] if swapper else []
    # Every swapper event but a rejection or a passed canary (which follows its activation) is a
    # switch of the live version; they are kept since `started`, so the page marks older versions
    # where they were made instead.
    activations = [e for e in (swapper.events if swapper else [])
                   if e["event"] not in ("rejected", "canary passed")]
    return JSONResponse({
        "points": points,
        "versions": [{k: v[k] for k in ("version", "created_at", "rejected")} for v in versions],
        "activations": activations,
        "active": state.engine.adapter_version,
        "started": state.started})


def skill_states(state, folder: Path) -> list[dict]:
    """The skills OpenClaw loads from `folder`, each marked as clawrl's or not, with skill_bridge's
    state; plus clawrl skills that are not live because they do not validate or clash."""
    found = read_skills(folder) if folder.is_dir() else []
    if state.skills is None:
        return [{**s, "managed": False, "status": None, "issues": []} for s in found]
    versions = skills_module.latest_versions(state.cfg.db_path)
    in_force = state.skills.in_force()
    out = [{**s, "managed": s["folder"] in in_force,
            "status": versions.get(s["folder"], {}).get("status") if s["folder"] in in_force else None,
            "issues": versions.get(s["folder"], {}).get("issues", []) if s["folder"] in in_force else []}
           for s in found]
    live = {s["folder"] for s in found}
    out += [{"name": name, "description": "", "folder": None, "managed": True, "status": v["status"],
             "issues": v["issues"]}
            for name, v in versions.items() if name not in live and v["status"] in ("error", "conflict")]
    return out


async def skills(request: Request) -> Response:
    state = request.app.state.daemon
    folder = state.skills.target if state.skills else skills_module.target_folder(state.cfg)
    found = await asyncio.to_thread(skill_states, state, folder)
    return JSONResponse({"folder": str(folder), "source": str(state.skills.source) if state.skills
                         else None, "skills": found})


def routes() -> list[Route]:
    return [
        Route("/dashboard", page, methods=["GET"]),
        Route("/v1/dashboard/sessions", sessions, methods=["GET"]),
        Route("/v1/dashboard/sessions/{session_id:path}/turns", session_turns, methods=["GET"]),
        Route("/v1/dashboard/rewards", rewards, methods=["GET"]),
        Route("/v1/dashboard/skills", skills, methods=["GET"]),
    ]
