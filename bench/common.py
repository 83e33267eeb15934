"""What the benchmarks share: how a result is written. (Their `clawrl serve` children are the
package's one harness, clawrl.evals.child.DaemonChild.)"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def portable(value):
    """`value` with this machine's paths written as the reader's: the repository as `.`, the
    temporary folder as `$TMPDIR` and the home folder as `~`, so a committed result names no path
    of the machine that produced it."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable(v) for v in value]
    if not isinstance(value, str) or os.sep not in value:
        return value
    for root, shown in ((str(REPO), "."), (tempfile.gettempdir(), "$TMPDIR"), (str(Path.home()), "~")):
        if root and root != os.sep and root in value:
            value = value.replace(root, shown)
    return value


def emit(results: dict, out: str | None) -> None:
    """The machine-readable result: one JSON line on stdout, and in `out` when given."""
    line = json.dumps(portable(results), separators=(",", ":"))
    print(line)
    if out:
        Path(out).write_text(line + "\n")


def env_for(home: Path, extra: dict | None = None) -> dict:
    """This process's environment for a `clawrl` child in `home`, without our own CLAWRL_*
    settings (the child reads the recipe and `extra` only)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWRL_")}
    return {**env, "CLAWRL_HOME": str(home), **(extra or {})}
