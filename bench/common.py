"""What the benchmarks share: waiting for a `clawrl serve` subprocess and stopping it."""
from __future__ import annotations

import subprocess
import time

import httpx


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = 300) -> None:
    """Until GET /readyz answers 200; fail early if the process exits or the model cannot load."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"clawrl serve exited with status {proc.returncode} before ready")
        try:
            r = httpx.get(f"{url}/readyz", timeout=2)
            if r.status_code == 200:
                return
            if r.json().get("status") == "failed":
                raise RuntimeError(f"clawrl serve could not load the model: {r.json().get('error')}")
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"clawrl serve not ready after {timeout:.0f} s")


def stop_server(proc: subprocess.Popen | None, grace: float = 20) -> None:
    """SIGTERM (the daemon drains and stops its trainer), then SIGKILL after `grace` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def emit(results: dict, out: str | None) -> None:
    """The machine-readable result: one JSON line on stdout, and in `out` when given."""
    import json
    from pathlib import Path

    line = json.dumps(results, separators=(",", ":"))
    print(line)
    if out:
        Path(out).write_text(line + "\n")
