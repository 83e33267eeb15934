"""Skills over HTTP, for the agent's tool and for scripts: list, read, create, patch, delete.

Every write goes through skill_bridge.author, which keeps names and paths inside the skills source
folder and refuses a version that does not validate, then the skill is reconciled at once so the
answer says whether OpenClaw will load it on the next turn.
"""
from __future__ import annotations

import asyncio

import yaml
from skill_bridge import (SkillExists, SkillInvalid, SkillNotFound, SkillPathError, delete_skill,
                          read_skill, write_skill)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..skills import bridge as skills
from ..errors import RequestError
from .httpjson import read_json

MAX_BODY = 1024 * 1024


def _bridge(request: Request) -> skills.SkillBridge:
    bridge = request.app.state.daemon.skills
    if bridge is None:
        raise RequestError("skill_bridge is off in this daemon: set skills.enabled = true in the "
                           "recipe (or CLAWRL_SKILLS_ENABLED=1) and restart it", status=409,
                           code="skills_disabled")
    return bridge


def skill_md(name: str, description: str, instructions: str) -> str:
    """A SKILL.md from its parts; YAML quoting keeps any description well-formed."""
    front = yaml.safe_dump({"name": name, "description": description}, sort_keys=False,
                           allow_unicode=True, width=1000)
    return f"---\n{front}---\n\n{instructions.strip()}\n"


def _files(body: dict, name: str, create: bool) -> dict[str, str]:
    """The files to write: `files` as given, plus a SKILL.md built from description/instructions."""
    files = body.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in files.items()):
        raise RequestError("'files' must map relative paths to text contents", param="files",
                           code="invalid_type")
    description, instructions = body.get("description"), body.get("instructions")
    for key, value in (("description", description), ("instructions", instructions)):
        if value is not None and not isinstance(value, str):
            raise RequestError(f"'{key}' must be a string", param=key, code="invalid_type")
    if description is not None or instructions is not None:
        if "SKILL.md" in files:
            raise RequestError("give either 'files' with a SKILL.md or 'description' and "
                               "'instructions', not both", param="files", code="invalid_value")
        if description is None or instructions is None:
            raise RequestError("'description' and 'instructions' go together: they make the "
                               "whole SKILL.md", param="description" if description is None
                               else "instructions", code="invalid_value")
        files = {**files, "SKILL.md": skill_md(name, description, instructions)}
    if not files:
        raise RequestError("nothing to write: send 'description' and 'instructions', or 'files'",
                           param="files", code="invalid_value")
    if create and "SKILL.md" not in files:
        raise RequestError("a new skill needs a SKILL.md (or 'description' and 'instructions')",
                           param="files", code="invalid_value")
    return files


def _answer(result, status: int = 200) -> JSONResponse:
    return JSONResponse({**result.to_dict(), "live": result.published_hash == result.hash
                         and result.published_hash is not None}, status_code=status)


async def _body(request: Request) -> dict:
    body = await read_json(request, MAX_BODY)
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", param="body", code="invalid_type")
    return body


async def _write(request: Request, name: str, body: dict, create: bool) -> Response:
    bridge = _bridge(request)
    files = _files(body, name, create)
    try:
        result = await asyncio.to_thread(
            bridge.author, name, lambda: write_skill(bridge.source, name, files, create=create))
    except SkillExists:
        raise RequestError(f"a skill named {name!r} exists already: PATCH /v1/skills/{name} "
                           "changes it", status=409, param="name", code="skill_exists") from None
    except SkillNotFound:
        raise RequestError(f"no skill named {name!r}: POST /v1/skills creates one", status=404,
                           param="name", code="skill_not_found") from None
    except SkillPathError as e:
        raise RequestError(str(e), param="name", code="invalid_skill_path") from None
    except SkillInvalid as e:
        raise RequestError("the skill does not validate, nothing was written: "
                           + "; ".join(str(i) for i in e.issues), param="files",
                           code="invalid_skill") from None
    return _answer(result, 201 if create else 200)


async def create(request: Request) -> Response:
    body = await _body(request)
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise RequestError("'name' (the skill's folder name) is required", param="name",
                           code="invalid_value")
    return await _write(request, name, body, create=True)


async def patch(request: Request) -> Response:
    return await _write(request, request.path_params["name"], await _body(request), create=False)


async def show(request: Request) -> Response:
    bridge, name = _bridge(request), request.path_params["name"]
    try:
        files = await asyncio.to_thread(read_skill, bridge.source, name)
    except SkillNotFound:
        raise RequestError(f"no skill named {name!r}", status=404, param="name",
                           code="skill_not_found") from None
    except SkillPathError as e:
        raise RequestError(str(e), param="name", code="invalid_skill_path") from None
    state = (await asyncio.to_thread(skills.latest_versions, bridge.cfg.db_path)).get(name)
    return JSONResponse({"name": name, "files": files, "state": state})


async def remove(request: Request) -> Response:
    bridge, name = _bridge(request), request.path_params["name"]
    try:
        result = await asyncio.to_thread(
            bridge.author, name, lambda: delete_skill(bridge.source, name))
    except SkillNotFound:
        raise RequestError(f"no skill named {name!r}", status=404, param="name",
                           code="skill_not_found") from None
    except SkillPathError as e:
        raise RequestError(str(e), param="name", code="invalid_skill_path") from None
    return _answer(result)


async def listing(request: Request) -> Response:
    bridge = _bridge(request)
    versions = await asyncio.to_thread(skills.latest_versions, bridge.cfg.db_path)
    return JSONResponse({"source": str(bridge.source), "target": str(bridge.target),
                         "in_force": bridge.in_force(), "skills": list(versions.values())})


def routes() -> list[Route]:
    return [
        Route("/v1/skills", listing, methods=["GET"]),
        Route("/v1/skills", create, methods=["POST"]),
        Route("/v1/skills/{name}", show, methods=["GET"]),
        Route("/v1/skills/{name}", patch, methods=["PATCH"]),
        Route("/v1/skills/{name}", remove, methods=["DELETE"]),
    ]
