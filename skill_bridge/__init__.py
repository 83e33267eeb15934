"""skill_bridge: file-based skill authoring for OpenClaw.

Owns the skills *source* folder (where people and the agent write skills) and the skills
clawrl publishes into OpenClaw's workspace `skills/` folder: validation with fixable messages
(`validate`), atomic publishing that never touches skills it did not publish (`publish`),
a debounced watcher (`watch`), agent-facing create/patch/read/delete with path checks
(`author`) and a starter template (`template`). It does not know about the daemon, its HTTP
API or its config; the daemon wires these pieces together.
"""
from .author import (SkillExists, SkillInvalid, SkillNotFound, SkillPathError, check_name,
                     check_relpath, delete_skill, read_skill, write_skill)
from .publish import Publisher, SkillResult, skill_hash
from .template import new_skill
from .validate import (ALLOWED_SUBDIRS, MAX_SKILL_BYTES, MAX_SKILL_FILES, MAX_SKILL_MD_BYTES,
                       NAME_RE, SkillFormatError, SkillIssue, parse_front_matter, validate_skill)
from .watch import SkillWatcher

__all__ = [
    "ALLOWED_SUBDIRS", "MAX_SKILL_BYTES", "MAX_SKILL_FILES", "MAX_SKILL_MD_BYTES", "NAME_RE",
    "Publisher", "SkillExists", "SkillFormatError", "SkillInvalid", "SkillIssue",
    "SkillNotFound", "SkillPathError", "SkillResult", "SkillWatcher", "check_name",
    "check_relpath", "delete_skill", "new_skill", "parse_front_matter", "read_skill",
    "skill_hash", "validate_skill", "write_skill",
]
