"""Node 24 and a pinned OpenClaw from the npm registry, fetched once into `<repo>/.cache/` and reused.

OpenClaw 2026.9.6 needs Node >= 24.16; the machine's Node is older, and the registry ships Node
itself as the package `node`. `require_openclaw()` fetches both on first use (about 30 s and
850 MB) and skips the calling test, naming the missing piece, only when that cannot be done.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
NODE_VERSION = "24.21.0"
OPENCLAW_VERSION = "2026.9.6"


@dataclass
class OpenClaw:
    node_bin: Path       # the folder holding node 24
    openclaw: Path       # the openclaw executable

    def env(self, home: Path) -> dict:
        """Environment for a quiet, offline OpenClaw whose state lives under `home`."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCLAW_")}
        env.update(
            HOME=str(home), TMPDIR=str(home / "tmp"),
            PATH=f"{self.openclaw.parent}:{self.node_bin}:{env.get('PATH', '')}",
            OPENCLAW_DISABLE_BONJOUR="1", OPENCLAW_SKIP_CHANNELS="1", OPENCLAW_NO_AUTO_UPDATE="1",
            OPENCLAW_NO_RESPAWN="1", NO_COLOR="1", FORCE_COLOR="0")
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        return env


def _installed(prefix: Path, package: str) -> str | None:
    pkg = prefix / "node_modules" / package / "package.json"
    if not pkg.exists():
        return None
    import json
    return json.loads(pkg.read_text()).get("version")


def _npm_install(prefix: Path, spec: str, path_first: Path | None = None) -> None:
    npm = shutil.which("npm")
    if not npm:
        pytest.skip("npm is not on PATH: it is needed once to fetch Node 24 and OpenClaw "
                    "from the npm registry (install Node.js)")
    env = dict(os.environ)
    if path_first:
        env["PATH"] = f"{path_first}:{env['PATH']}"
    prefix.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", spec],
                       env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        pytest.skip(f"`npm install {spec}` failed (is the npm registry reachable?):\n{r.stderr[-1500:]}")


def require_node24() -> Path:
    prefix = CACHE / "node24"
    if _installed(prefix, "node") != NODE_VERSION:
        _npm_install(prefix, f"node@{NODE_VERSION}")
    return prefix / "node_modules" / "node" / "bin"


def require_openclaw() -> OpenClaw:
    node_bin = require_node24()
    prefix = CACHE / "openclaw"
    if _installed(prefix, "openclaw") != OPENCLAW_VERSION:
        # With an older node first on PATH, npm silently installs an empty placeholder.
        _npm_install(prefix, f"openclaw@{OPENCLAW_VERSION}", path_first=node_bin)
    exe = prefix / "node_modules" / ".bin" / "openclaw"
    if _installed(prefix, "openclaw") != OPENCLAW_VERSION or not exe.exists():
        pytest.skip(f"openclaw@{OPENCLAW_VERSION} did not install into {prefix}")
    return OpenClaw(node_bin=node_bin, openclaw=exe)
