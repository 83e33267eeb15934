"""The OpenClaw plugin's own unit tests (`node --test` on Node 24), run as part of the suite."""
from __future__ import annotations

import subprocess

from openclaw_env import REPO, require_node24


def test_extension_unit_tests_pass_on_node24():
    node = require_node24() / "node"
    r = subprocess.run([str(node), "--test", "src/**/*.test.ts"], cwd=REPO / "extension", capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "ℹ fail 0" in r.stdout and "ℹ pass 0" not in r.stdout
