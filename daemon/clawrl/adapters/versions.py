"""Adapter versions on disk: the filesystem is the state.

`$CLAWRL_HOME/adapters/NNNN/` holds one PEFT LoRA adapter (`adapter_config.json`,
`adapter_model.safetensors`) and `meta.json` (parent version, samples used, loss, reward stats,
recipe, base model). A *remote* version (engine.kind = "tinker": the weights stay with the service
that trained them) holds `remote.json` instead of the PEFT files: where the service keeps its
sampler weights and its training state. A version is written to a hidden temp folder and renamed
into place, so a folder named `NNNN` is always complete; a crash leaves at most a `.tmp-*` folder,
which is ignored and cleaned up. The largest number is the newest. Which version *serves* is the
daemon's choice (guard, activate, rollback); this module only reads and writes versions.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Callable, TextIO

META = "meta.json"
WEIGHTS = "adapter_model.safetensors"
REMOTE = "remote.json"
PEFT_KIND, REMOTE_KIND = "peft", "remote"   # what an engine serves: engine.adapter_kind


def version_dir(root: Path, version: int) -> Path:
    return root / f"{version:04d}"


def kind(path: Path) -> str:
    """peft (weights in the folder) or remote (a pointer to weights a service holds)."""
    return REMOTE_KIND if (path / REMOTE).exists() else PEFT_KIND


def is_complete(path: Path) -> bool:
    if not (path / META).exists():
        return False
    return (path / REMOTE).exists() or ((path / WEIGHTS).exists()
                                        and (path / "adapter_config.json").exists())


def read_remote(path: Path) -> dict:
    """The pointer of a remote version: {"service", "sampler_path", "state_path", ...}."""
    return json.loads((path / REMOTE).read_text())


def save_remote(ref: dict) -> Callable[[Path], None]:
    """A `save` for write_version that writes a remote version's pointer."""
    def save(folder: Path) -> None:
        (folder / REMOTE).write_text(json.dumps(ref, indent=1))
    return save


def list_versions(root: Path) -> list[int]:
    if not root.exists():
        return []
    return sorted(int(p.name) for p in root.iterdir()
                  if p.name.isdigit() and len(p.name) >= 4 and is_complete(p))


def newest(root: Path) -> int | None:
    versions = list_versions(root)
    return versions[-1] if versions else None


def read_meta(root: Path, version: int) -> dict:
    return json.loads((version_dir(root, version) / META).read_text())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_version(root: Path, version: int, save: Callable[[Path], None], meta: dict) -> Path:
    """Write a new version atomically: `save(tmp)` writes the PEFT files, then meta.json, fsync,
    rename. Fails if the version exists (two writers never share a number)."""
    root.mkdir(parents=True, exist_ok=True)
    final = version_dir(root, version)
    if final.exists():
        raise FileExistsError(f"adapter version {version} already exists at {final}")
    tmp = root / f".tmp-{version:04d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save(tmp)
        (tmp / META).write_text(json.dumps({"version": version, "created_at": time.time(), **meta},
                                           indent=1))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


TRAINER_LOCK = ".trainer.lock"   # held (flock) by the one trainer that writes versions


def hold_trainer_lock(root: Path, stop: Callable[[float], bool], say: Callable[[str], None]) -> TextIO | None:
    """Become the one trainer that writes versions here: the lock's open file, held until this
    process exits (the kernel frees it even after SIGKILL). A trainer orphaned by a killed daemon
    finishes its step before it notices and exits; the next one waits for it here instead of
    cleaning up under it or writing the same version number. `stop(seconds)` waits and says
    whether to give up; then None."""
    import fcntl
    root.mkdir(parents=True, exist_ok=True)
    f = open(root / TRAINER_LOCK, "a")
    told = False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if not told:
                say("another trainer is still writing to this adapters folder (one left by a "
                    "stopped daemon finishes its step first); waiting for it")
                told = True
            if stop(0.5):
                f.close()
                return None


def trainer_running(root: Path) -> bool:
    """Whether some trainer holds the lock right now."""
    import fcntl
    try:
        with open(root / TRAINER_LOCK, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def clean_temp(root: Path) -> list[str]:
    """Remove half-written versions left by a crash."""
    removed = []
    if root.exists():
        for p in root.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
    return removed


def prune(root: Path, keep: int, protect: set[int]) -> list[dict]:
    """Delete all but the newest `keep` versions, never one in `protect` (e.g. the active one).
    Returns the pointers of the remote versions deleted (their checkpoints live elsewhere)."""
    versions = list_versions(root)
    doomed = [v for v in versions[:max(0, len(versions) - keep)] if v not in protect]
    remote = []
    for v in doomed:
        path = version_dir(root, v)
        if kind(path) == REMOTE_KIND:
            with contextlib.suppress(OSError, ValueError):
                remote.append(read_remote(path))
        shutil.rmtree(path, ignore_errors=True)
    return remote


def weights_problem(path: Path) -> str | None:
    """None if every tensor is finite; else a sentence naming the first bad one. A remote version's
    tensors are out of reach: its pointer must name the sampler weights (its training loss is
    checked like any version's)."""
    if kind(path) == REMOTE_KIND:
        try:
            ref = read_remote(path)
        except (OSError, ValueError) as e:
            return f"{REMOTE} is unreadable ({e})"
        sampler = ref.get("sampler_path") if isinstance(ref, dict) else None
        return None if isinstance(sampler, str) and sampler else f"{REMOTE} names no sampler_path"
    from safetensors import safe_open

    with safe_open(str(path / WEIGHTS), framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if not bool(t.float().isfinite().all()):
                return f"tensor {name} has NaN or inf values"
            if t.numel() and not math.isfinite(float(t.float().abs().max())):
                return f"tensor {name} overflows"
    return None


# -- verdicts and the active pointer (written by the daemon, read by everyone) ---------------------
REJECTED = "REJECTED"
ACTIVE = "ACTIVE"


def reject(root: Path, version: int, reason: str) -> None:
    """Mark a version as never to be served or trained on (guard failure or rollback)."""
    (version_dir(root, version) / REJECTED).write_text(reason + "\n")


def rejection(root: Path, version: int) -> str | None:
    p = version_dir(root, version) / REJECTED
    return p.read_text().strip() if p.exists() else None


def good_versions(root: Path) -> list[int]:
    return [v for v in list_versions(root) if rejection(root, v) is None]


def newest_good(root: Path) -> int | None:
    versions = good_versions(root)
    return versions[-1] if versions else None


SEEN = "SEEN"   # the newest version the daemon has decided on (served or rejected)


def write_small(root: Path, name: str, text: str) -> None:
    """A small file of the adapters folder, replaced whole: a reader sees the old or the new one."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, root / name)


def _write_number(root: Path, name: str, version: int) -> None:
    write_small(root, name, f"{version}\n")


def _read_number(root: Path, name: str) -> int | None:
    try:
        return int((root / name).read_text().strip())
    except (OSError, ValueError):
        return None


def write_active(root: Path, version: int) -> None:
    _write_number(root, ACTIVE, version)


def read_active(root: Path) -> int | None:
    return _read_number(root, ACTIVE)


def write_seen(root: Path, version: int) -> None:
    _write_number(root, SEEN, version)


def read_seen(root: Path) -> int | None:
    return _read_number(root, SEEN)


EVENTS = "EVENTS.jsonl"   # the daemon's swap decisions (served, rejected, rolled back)
EVENTS_KEPT = 500


def append_event(root: Path, event: dict) -> None:
    """One decision, appended as a line; past twice EVENTS_KEPT lines the file is cut to the
    newest EVENTS_KEPT (rewritten and renamed, so a crash leaves the old or the new file)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / EVENTS
    with open(path, "ab+") as f:
        f.seek(0, os.SEEK_END)
        torn = f.tell() > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
        f.write((b"\n" if torn else b"") + json.dumps(event).encode() + b"\n")
    if path.stat().st_size > 400 * EVENTS_KEPT:   # cheap test first; lines are ~100 bytes
        lines = path.read_text(errors="replace").splitlines()
        if len(lines) > 2 * EVENTS_KEPT:
            tmp = root / f".{EVENTS}.tmp"
            tmp.write_text("".join(line + "\n" for line in lines[-EVENTS_KEPT:]))
            os.replace(tmp, path)


def read_events(root: Path, n: int) -> list[dict]:
    """The newest `n` decisions, oldest first; a line torn by a crash is skipped."""
    try:
        lines = (root / EVENTS).read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines[-n:]:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


CONSOLIDATION = "CONSOLIDATION.json"   # the current or last consolidation (learn/consolidate.py)


def read_consolidation(root: Path) -> dict | None:
    """The consolidation run's progress: state, step, steps, loss curve, version, message."""
    try:
        status = json.loads((root / CONSOLIDATION).read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def write_consolidation(root: Path, status: dict) -> None:
    write_small(root, CONSOLIDATION, json.dumps(status))
