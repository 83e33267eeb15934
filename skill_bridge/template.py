"""A starting point for a new skill: a SKILL.md that already validates, with the sections a
good skill has (when to use it, steps, examples) for the author to fill in."""
from __future__ import annotations

from pathlib import Path

import yaml

from .author import check_name, write_skill

_BODY = """
# {title}

## When to use

- The user asks for ... (say which requests this skill is for, and which it is not for).

## Steps

1. ...
2. ...

## Examples

- User: "..."
  Do: ...
"""


def new_skill(source: Path, name: str, description: str | None = None) -> Path:
    """Create source/<name>/SKILL.md from the template; returns the skill folder. Refuses bad
    or existing names with SkillPathError (SkillExists for the latter)."""
    check_name(name)
    if description is None:
        description = f"Use when the user asks for {name.replace('-', ' ')} (edit this line)."
    # safe_dump quotes whatever needs quoting, e.g. a description containing ': '.
    meta = yaml.safe_dump({"name": name, "description": description}, sort_keys=False,
                          allow_unicode=True, width=10_000)
    title = name.replace("-", " ").capitalize()
    text = f"---\n{meta}---\n{_BODY.format(title=title)}"
    return write_skill(source, name, {"SKILL.md": text}, create=True)
