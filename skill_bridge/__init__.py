"""skill_bridge: file-based skill authoring for OpenClaw (not built yet; see issue "skill_bridge")."""
