"""Authoring: create, patch, read and delete skills in the source folder for the agent.

Owns the path rules for agent-supplied names and file paths, and the staged, validated,
atomic replacement of a skill folder. It writes only inside `source/<name>` (and a dot-named
staging folder beside it, which the watcher and publisher ignore); publishing to OpenClaw is
the watcher's job. Every refusal is a SkillPathError whose message says how to fix the call.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path, PurePosixPath

from .publish import copy_skill
from .validate import (ALLOWED_SUBDIRS, NAME_RE, SKILL_FILE, SkillIssue, is_hidden,
                       validate_skill, walk)

_STAGE, _ASIDE = ".clawrl-author-", ".clawrl-old-"
_lock = threading.Lock()  # one author operation at a time: the check-then-swap is not atomic


class SkillPathError(ValueError):
    """A skill name or file path the agent may not use."""


class SkillExists(SkillPathError):
    """create=True for a skill that already exists."""


class SkillNotFound(SkillPathError):
    """A patch, read or delete of a skill that does not exist."""


class SkillInvalid(ValueError):
    """The skill as written would not validate; nothing was changed."""

    def __init__(self, issues: list[SkillIssue]):
        super().__init__("skill not saved, it would be invalid:\n"
                         + "\n".join(f"  {i}" for i in issues))
        self.issues = issues


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise SkillPathError(
            f"{name!r} is not a valid skill name — fix: use 1-64 lowercase letters, digits and "
            "single hyphens, not starting or ending with a hyphen, e.g. 'pdf-summary'")
    return name


def check_relpath(relpath: object) -> PurePosixPath:
    """A file path inside a skill: SKILL.md, or a file under one of the allowed folders."""
    allowed = ", ".join(f"{d}/" for d in ALLOWED_SUBDIRS)
    if not isinstance(relpath, str) or not relpath:
        raise SkillPathError(f"file path {relpath!r} must be a non-empty string")
    if "\\" in relpath or "\0" in relpath:
        raise SkillPathError(f"file path {relpath!r} contains a backslash or NUL — fix: use "
                             "'/' between folders, e.g. 'references/api.md'")
    if relpath.startswith("/"):
        raise SkillPathError(f"file path {relpath!r} is absolute — fix: give it relative to "
                             "the skill folder, e.g. 'references/api.md'")
    parts = relpath.split("/")
    if any(p in ("", ".", "..") or is_hidden(p) for p in parts):
        raise SkillPathError(f"file path {relpath!r} has an empty, '.', '..' or hidden part — "
                             "fix: use plain names, e.g. 'references/api.md'")
    if parts != [SKILL_FILE] and not (len(parts) >= 2 and parts[0] in ALLOWED_SUBDIRS):
        raise SkillPathError(f"file path {relpath!r} is not allowed — fix: use SKILL.md or a "
                             f"file under {allowed}")
    return PurePosixPath(relpath)


def _skill_dir(source: Path, name: str) -> tuple[Path, Path]:
    """(resolved source, the skill's folder), refusing a skill folder that is a link."""
    check_name(name)
    root = Path(source).resolve()
    path = root / name
    if path.is_symlink():
        raise SkillPathError(f"skill {name!r} is a symlink; clawrl edits only real folders — "
                             "fix: replace the link with a copy of the skill")
    return root, path


def _write_file(skill: Path, rel: PurePosixPath, text: str) -> None:
    """Write one file under `skill`, refusing to pass through or onto any link."""
    current = skill
    for part in rel.parts[:-1]:
        current = current / part
        if current.is_symlink():
            raise SkillPathError(f"{rel}: folder {part}/ is a symlink, writing through it could "
                                 "leave the skill — fix: replace the link with a real folder")
        if not current.exists():
            current.mkdir()
        elif not current.is_dir():
            raise SkillPathError(f"{rel}: {part} is a file, not a folder — fix: pick another path")
    out = current / rel.name
    if out.is_symlink() or out.is_dir():
        raise SkillPathError(f"{rel} is a symlink or a folder — fix: pick another path")
    if not out.parent.resolve().is_relative_to(skill.resolve()):  # belt and braces
        raise SkillPathError(f"{rel} resolves outside the skill folder")
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def write_skill(source: Path, name: str, files: dict[str, str], *, create: bool) -> Path:
    """Create (create=True) or patch (create=False: the given files replace theirs, the others
    stay) the skill `name`. The new version is built and validated in a staging folder and
    swapped in with renames; if it is invalid, SkillInvalid is raised and nothing changes."""
    checked = {}
    for relpath, text in files.items():
        if not isinstance(text, str):
            raise SkillPathError(f"content of {relpath!r} must be a string")
        checked[check_relpath(relpath)] = text
    with _lock:
        Path(source).mkdir(parents=True, exist_ok=True)
        root, live = _skill_dir(source, name)
        exists = os.path.lexists(live)
        if exists and not live.is_dir():
            raise SkillPathError(f"{name!r} in the skills folder is a file, not a skill folder "
                                 "— fix: remove or rename that file")
        if create and exists:
            raise SkillExists(f"skill {name!r} already exists — fix: patch it instead, or "
                              "choose another name")
        if not create and not exists:
            raise SkillNotFound(f"skill {name!r} does not exist — fix: create it first")
        stage = Path(tempfile.mkdtemp(prefix=_STAGE, dir=root))
        try:
            new = stage / name
            if exists:
                copy_skill(live, new)
            else:
                new.mkdir()
            for rel, text in checked.items():
                _write_file(new, rel, text)
            issues = validate_skill(new, stage)
            if issues:
                raise SkillInvalid(issues)
            if exists:  # swap: old aside, new in; the old copy goes with the staging folder
                os.rename(live, stage / ".old")
            os.rename(new, live)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return Path(source) / name


def delete_skill(source: Path, name: str) -> None:
    """Remove the skill folder: renamed aside first, so it vanishes in one step."""
    with _lock:
        root, live = _skill_dir(source, name)
        if not live.is_dir():
            raise SkillNotFound(f"skill {name!r} does not exist — fix: check the name")
        aside = Path(tempfile.mkdtemp(prefix=_ASIDE, dir=root))
        os.rename(live, aside / name)
        shutil.rmtree(aside)


def read_skill(source: Path, name: str) -> dict[str, str]:
    """relative path -> text for each UTF-8 file of the skill. Binary files (images under
    assets/) and links are left out: they cannot be returned as text."""
    _, live = _skill_dir(source, name)
    if not live.is_dir():
        raise SkillNotFound(f"skill {name!r} does not exist — fix: check the name")
    out = {}
    for rel, path, st in walk(live):
        if stat.S_ISREG(st.st_mode):
            try:
                out[rel.as_posix()] = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                continue
    return out
