"""What the benchmarks share: how a result is written. (Their `clawrl serve` children are the
package's one harness, clawrl.evals.child.DaemonChild.)"""
from __future__ import annotations


def emit(results: dict, out: str | None) -> None:
    """The machine-readable result: one JSON line on stdout, and in `out` when given."""
    import json
    from pathlib import Path

    line = json.dumps(results, separators=(",", ":"))
    print(line)
    if out:
        Path(out).write_text(line + "\n")
