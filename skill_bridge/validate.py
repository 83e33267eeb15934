"""What a valid skill folder is, and every way one can be wrong.

Owns the skill format rules (front matter, name, layout, limits) and the walk over a skill's
files that hashing and copying share. It reads only; publishing and authoring live elsewhere.
The rules follow OpenClaw's loader and the AgentSkills spec it implements; where OpenClaw is
lenient (it falls back to a line parser on bad YAML, and to the folder name when `name` is
missing) we are strict, so a skill that passes here loads the same way everywhere.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import asdict, dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Iterator

import yaml

# OpenClaw's own rule for skill names (node-skill-constraints in its dist), which is the
# AgentSkills one: 1-64 of a-z 0-9 and '-', no leading, trailing or doubled hyphen.
NAME_RE = re.compile(r"(?!.*--)[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?")
MAX_NAME_CHARS = 64
# OpenClaw caps descriptions at 1024 characters; its docs ask for one line under 160.
MAX_DESCRIPTION_CHARS = 1024
# The whole SKILL.md enters the model's context when the skill is used: 64 KiB is ~16k tokens,
# already a lot for a local model, and it is OpenClaw's node-hosted skill limit (its loader
# silently skips SKILL.md files over 256 000 bytes, so we must refuse well before that).
MAX_SKILL_MD_BYTES = 64 * 1024
# Below OpenClaw's managed-bundle limits (256 files, 8 MiB): a skill is instructions plus a few
# helpers, and copying it must stay cheap because every edit republishes the whole folder.
MAX_SKILL_BYTES = 5 * 1024 * 1024
MAX_SKILL_FILES = 200
ALLOWED_SUBDIRS = ("references", "templates", "scripts", "assets")
SKILL_FILE = "SKILL.md"

_DELIMITER = re.compile(r"---[^\S\n]*")  # OpenClaw accepts trailing blanks after '---'
_LAYOUT_FIX = "move it into references/, templates/, scripts/ or assets/, or delete it"
_NAME_FIX = ("use 1-64 lowercase letters, digits and single hyphens, not starting or ending "
             "with a hyphen, e.g. 'pdf-summary'")


@dataclass(frozen=True)
class SkillIssue:
    """One problem, located as precisely as we can, with the way to fix it."""

    file: str  # relative to the source folder, e.g. "my-skill/SKILL.md"
    line: int | None
    field: str | None
    message: str
    fix: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        field = f" {self.field}:" if self.field else ""
        return f"{where}:{field} {self.message} — fix: {self.fix}"

    def to_dict(self) -> dict:
        return asdict(self)


class SkillFormatError(ValueError):
    """SKILL.md text that cannot be read as front matter + Markdown."""

    def __init__(self, issue: SkillIssue):
        super().__init__(str(issue))
        self.issue = issue


def is_hidden(name: str) -> bool:
    # Dot entries are editor swap/lock files, .DS_Store, .git, or our own staging folders.
    # OpenClaw never loads them either, so they are not part of a skill: never validated,
    # hashed or published. Without this, a skill open in vim could never publish.
    return name.startswith(".")


def walk(folder: Path) -> Iterator[tuple[PurePosixPath, Path, os.stat_result]]:
    """Every non-hidden entry under `folder`, sorted, never following links."""
    entries = sorted(os.scandir(folder), key=lambda e: e.name)
    for entry in entries:
        if is_hidden(entry.name):
            continue
        path = Path(entry.path)
        st = path.lstat()
        yield PurePosixPath(entry.name), path, st
        if stat.S_ISDIR(st.st_mode):
            for rel, sub, sub_st in walk(path):
                yield PurePosixPath(entry.name) / rel, sub, sub_st


def normalize_text(text: str) -> str:
    """What OpenClaw does before parsing: drop a BOM, make every line end in '\\n'."""
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def _split(text: str) -> tuple[str, int]:
    """(YAML block, 1-based line where the body starts); the block begins on line 2."""
    lines = normalize_text(text).split("\n")
    if not _DELIMITER.fullmatch(lines[0]):
        raise SkillFormatError(SkillIssue(
            SKILL_FILE, 1, None, "does not start with front matter",
            "make the first line '---', then 'name: <folder name>' and 'description: <when to "
            "use it>', then a line with only '---', then the instructions"))
    for i, line in enumerate(lines[1:], start=2):
        if _DELIMITER.fullmatch(line):
            return "\n".join(lines[1:i - 1]), i + 1
    raise SkillFormatError(SkillIssue(
        SKILL_FILE, 1, None, "front matter opened on line 1 is never closed",
        "add a line containing only '---' after the last front-matter field"))


def _parse(text: str) -> tuple[dict, int, dict[str, int]]:
    """(meta, body line, front-matter key -> its line in the file)."""
    block, body_line = _split(text)
    try:
        meta = yaml.safe_load(block)
        node = yaml.compose(block, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise SkillFormatError(SkillIssue(
            SKILL_FILE, None if mark is None else mark.line + 2, None,
            f"front matter is not valid YAML: {problem}",
            "correct the YAML on that line; quote a value that contains ': ' or starts with "
            "one of * & ! | > ' \" % @ ` [ {")) from None
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise SkillFormatError(SkillIssue(
            SKILL_FILE, 2, None, f"front matter is a {type(meta).__name__}, not a mapping",
            "write one 'key: value' per line, e.g. 'name: my-skill'"))
    lines = {}
    if isinstance(node, yaml.MappingNode):
        lines = {str(k.value): k.start_mark.line + 2 for k, _ in node.value}
    return meta, body_line, lines


def parse_front_matter(text: str) -> tuple[dict, int]:
    """(meta, 1-based line where the Markdown body starts); raises SkillFormatError."""
    meta, body_line, _ = _parse(text)
    return meta, body_line


def _check_fields(meta: dict, lines: dict[str, int],
                  folder_name: str) -> list[tuple[int | None, str, str, str]]:
    """(line, field, message, fix) for each problem with `name` and `description`."""
    fixes = {"name": f"set 'name: {folder_name}' in the front matter",
             "description": "write one sentence saying when to use the skill, as "
                            "'description: ...' in the front matter"}
    out: list[tuple[int | None, str, str, str]] = []
    for key, fix in fixes.items():
        value, line = meta.get(key), lines.get(key)
        if key not in meta:
            out.append((None, key, "is missing", fix))
        elif value is None or (isinstance(value, str) and not value.strip()):
            out.append((line, key, "is empty", fix))
        elif not isinstance(value, str):
            out.append((line, key, f"must be a string, got {type(value).__name__}",
                        "write it as plain text on one line (quote it if needed)"))
    name, desc = meta.get("name"), meta.get("description")
    if isinstance(name, str) and name.strip():
        if not NAME_RE.fullmatch(name):
            out.append((lines.get("name"), "name", f"{name!r} is not a valid skill name", _NAME_FIX))
        elif name != folder_name:
            out.append((lines.get("name"), "name",
                        f"{name!r} does not match the folder name {folder_name!r}",
                        f"rename the folder to {name!r}, or set 'name: {folder_name}'"))
    if isinstance(desc, str) and len(desc) > MAX_DESCRIPTION_CHARS:
        out.append((lines.get("description"), "description",
                    f"is {len(desc)} characters, over the {MAX_DESCRIPTION_CHARS} limit",
                    "shorten it to one line (under 160 characters is best); put details in "
                    "the body"))
    return out


def _check_skill_md(path: Path, rel: str, folder_name: str) -> list[SkillIssue]:
    data = path.read_bytes()
    if len(data) > MAX_SKILL_MD_BYTES:
        return [SkillIssue(rel, None, None,
                           f"is {len(data)} bytes, over the {MAX_SKILL_MD_BYTES} byte limit",
                           "move long material into references/ and link to it from SKILL.md")]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        return [SkillIssue(rel, line, None, f"is not UTF-8 text (byte {e.start})",
                           "save the file as UTF-8")]
    try:
        meta, _, lines = _parse(text)
    except SkillFormatError as e:
        return [replace(e.issue, file=rel)]
    return [SkillIssue(rel, *f) for f in _check_fields(meta, lines, folder_name)]


def validate_skill(folder: Path, root: Path | None = None) -> list[SkillIssue]:
    """Every problem with the skill in `folder` (empty list: valid). Paths in the issues are
    relative to `root`, which defaults to the folder's parent (the source folder)."""
    folder = Path(folder)
    root = folder.parent if root is None else Path(root)
    name = folder.name

    def rel(p: str | PurePosixPath) -> str:
        return (folder / p).relative_to(root).as_posix()

    if folder.is_symlink():
        return [SkillIssue(rel(""), None, None, "is a symlink",
                           "replace the link with the real folder; links could point outside "
                           "the skills folder")]
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is a file, not a folder"
        return [SkillIssue(rel(""), None, None, what,
                           f"a skill is a folder holding SKILL.md: create {name}/SKILL.md")]
    issues, files, size = [], 0, 0
    for relpath, path, st in walk(folder):
        top, kind = relpath.parts[0], stat.S_IFMT(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            issues.append(SkillIssue(rel(relpath), None, None, "is a symlink",
                                     "replace the link with a copy of what it points to; links "
                                     "could point outside the skill folder"))
        elif kind not in (stat.S_IFREG, stat.S_IFDIR):
            issues.append(SkillIssue(rel(relpath), None, None, "is not a regular file",
                                     "delete it; skills hold only files and folders"))
        elif len(relpath.parts) == 1 and top != SKILL_FILE and not (
                top in ALLOWED_SUBDIRS and kind == stat.S_IFDIR):
            what = "folder" if kind == stat.S_IFDIR else "file"
            issues.append(SkillIssue(rel(relpath), None, None,
                                     f"unexpected {what} beside SKILL.md", _LAYOUT_FIX))
        elif kind == stat.S_IFREG:
            files, size = files + 1, size + st.st_size
            if relpath == PurePosixPath(SKILL_FILE):
                issues += _check_skill_md(path, rel(relpath), name)
    if not (folder / SKILL_FILE).is_file() and not (folder / SKILL_FILE).is_symlink():
        issues.insert(0, SkillIssue(
            rel(SKILL_FILE), None, None, "is missing (or not a file)",
            f"create it: a '---' line, 'name: {name}', 'description: <when to use it>', a "
            "closing '---' line, then the instructions in Markdown"))
    if files > MAX_SKILL_FILES:
        issues.append(SkillIssue(rel(""), None, None,
                                 f"has {files} files, over the {MAX_SKILL_FILES} file limit",
                                 "remove files the skill does not need, or merge small ones"))
    if size > MAX_SKILL_BYTES:
        issues.append(SkillIssue(rel(""), None, None,
                                 f"holds {size} bytes, over the {MAX_SKILL_BYTES} byte limit",
                                 "remove large assets; link to them instead of copying them"))
    return issues
