"""`clawrl skills ...`: write, check, list, and accept or reject proposed skills.

Everything here works on the folders and the turn log directly, so it works with the daemon down;
a running daemon's watcher publishes what lands in the source folder within a moment.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

from skill_bridge import SkillPathError, new_skill, validate_skill

from . import bridge as skills
from ..errors import ClawrlError
from .proposals import Proposals


def add_arguments(sp: argparse.ArgumentParser) -> None:
    sub = sp.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("new", help="create a skill from a valid template in the skills source folder")
    p.add_argument("name", help="lowercase letters, digits and hyphens; also the folder name")
    p.add_argument("--description", help="one sentence: when should the agent use this skill")
    p = sub.add_parser("list", help="skills, their state (published, error, ...) and errors, "
                                    "and proposed drafts")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("check", help="validate skills; exit 1 if any is invalid")
    p.add_argument("path", nargs="?", help="a skill folder, or a folder of skills "
                                           "(default: the skills source folder)")
    p = sub.add_parser("propose", help="draft proposed skills from repeated corrections now "
                                       "(the daemon does this every minute)")
    p.add_argument("--min-sessions", type=int,
                   help="sessions a correction must recur in (default: skills.propose_after)")
    p = sub.add_parser("accept", help="move a proposed skill into the source folder (it is "
                                      "then checked and published)")
    p.add_argument("name")
    p = sub.add_parser("reject", help="delete a proposed skill; it is not proposed again")
    p.add_argument("name")


def _skill_folders(path: Path) -> list[Path]:
    if (path / "SKILL.md").exists():
        return [path]
    if not path.is_dir():
        raise ClawrlError(f"{path} is neither a skill folder (with SKILL.md) nor a folder of skills")
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def check(path: Path) -> int:
    bad = 0
    folders = _skill_folders(path)
    for folder in folders:
        issues = validate_skill(folder, folder.parent)
        print(f"{'ok     ' if not issues else 'invalid'} {folder.name}")
        for issue in issues:
            print(f"  {issue}")
        bad += bool(issues)
    if not folders:
        print(f"no skills in {path}")
    return 1 if bad else 0


def listing(cfg, as_json: bool) -> int:
    source, target = skills.source_folder(cfg), skills.target_folder(cfg)
    recorded = skills.latest_versions(cfg.db_path) if cfg.db_path.exists() else {}
    names = sorted({p.name for p in _skill_folders(source)} if source.is_dir() else set())
    rows = []
    for name in sorted(set(names) | set(recorded)):
        rec = recorded.get(name, {})
        status = rec.get("status") or "not seen by the daemon yet"
        if name not in names and status != "unpublished":
            status = "deleted (the daemon unpublishes it)"
        rows.append({"name": name, "status": status, "hash": rec.get("hash"),
                     "issues": rec.get("issues", []), "at": rec.get("at")})
    proposed = Proposals(skills.proposals_folder(cfg), source).list()
    if as_json:
        print(json.dumps({"source": str(source), "target": str(target), "skills": rows,
                          "proposed": proposed}, indent=2))
        return 0
    print(f"source: {source}\ntarget: {target}")
    for r in rows:
        when = dt.datetime.fromtimestamp(r["at"]).strftime("%Y-%m-%d %H:%M") if r["at"] else ""
        print(f"  {r['name']:<32} {r['status']:<12} {when}")
        for issue in r["issues"]:
            print(f"      {issue['file']}:{issue['line'] or ''} {issue['field'] or ''}: "
                  f"{issue['message']} (fix: {issue['fix']})")
    if not rows:
        print("  no skills yet: `clawrl skills new NAME` makes one")
    for p in proposed:
        print(f"  proposed {p['name']}: from {p['sessions']} sessions of user {p['user']} "
              f"(`clawrl skills accept {p['name']}` or `reject`; draft in {p['path']})")
    return 0


def main(args, cfg) -> int:
    source = skills.source_folder(cfg)
    proposals = Proposals(skills.proposals_folder(cfg), source)
    if args.action == "new":
        try:
            folder = new_skill(source, args.name, args.description)
        except (SkillPathError, FileExistsError) as e:
            raise ClawrlError(str(e)) from None
        print(f"created {folder / 'SKILL.md'}: edit it; a running daemon publishes it on save")
        return 0
    if args.action == "list":
        return listing(cfg, args.json)
    if args.action == "check":
        return check(Path(args.path).expanduser() if args.path else source)
    if args.action == "propose":
        n = args.min_sessions if args.min_sessions is not None else cfg.skills.propose_after
        new = proposals.propose(cfg.db_path, n)
        print("\n".join(f"proposed {name}" for name in new) or "nothing new to propose")
        return 0
    try:
        if args.action == "accept":
            print(f"accepted: {proposals.accept(args.name)} (a running daemon publishes it now)")
        else:
            proposals.reject(args.name)
            print(f"rejected {args.name}; it will not be proposed again")
    except (LookupError, ValueError, FileExistsError) as e:
        raise ClawrlError(str(e)) from None
    return 0
