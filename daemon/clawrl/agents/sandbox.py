"""Run an agent's commands in a throwaway folder: resource limits, a wall-clock timeout, no network.

A `Sandbox` is one episode's folder: `work/` (the commands' working directory and HOME) and
`tmp/` (their TMPDIR). `run()` executes one command there and says whether a limit stopped it.
What isolation is in force depends on the machine; it is probed once per process
(`isolation()`) and `clawrl agents sandbox` prints it:

* always: setrlimit on every process (CPU seconds, address space, file size, open files, no core
  files) and a wall-clock timeout after which the whole process tree is killed;
* where seccomp is available (x86_64, aarch64): a filter that kills any process opening a socket
  other than a Unix one (and io_uring, which could open one), so a network attempt *stops* the
  command instead of merely failing;
* where `unshare` works (as root, or with unprivileged user namespaces): new network (only a
  loopback, down), pid and mount namespaces with a private /proc. When the command ends, every
  process it left behind dies with its namespace; on timeout the namespace's init is killed;
* as root: each sandbox runs as a uid of its own, so the process limit counts only its processes
  (root is exempt from RLIMIT_NPROC) and it cannot read root's private files, the turn log among
  them. Without root the process limit is set inside the user namespace (prlimit), where it
  counts only that namespace's processes.

What it does not do: it is no filesystem jail. A command can read world-readable files and write
world-writable places such as /tmp; the size of its own folder is checked after each command.
"""
from __future__ import annotations

import asyncio
import os
import random
import resource
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ClawrlError
from .isolation import (UID_BASE, UID_SPAN, Isolation, install_seccomp, isolation, ns_prefix,
                        seccomp_filter)

__all__ = ["Isolation", "Limits", "Result", "STOPS", "Sandbox", "isolation"]


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 10            # CPU seconds per process (SIGXCPU, then SIGKILL one second later)
    memory_mb: int = 1024      # address space per process
    file_mb: int = 16          # the largest file a process may write (SIGXFSZ / EFBIG)
    procs: int = 64            # processes of the sandbox at once
    open_files: int = 256
    timeout_s: float = 20.0    # wall clock per command
    disk_mb: int = 64          # work/ + tmp/, checked after every command
    output_chars: int = 4000   # kept of a command's output: its head and its tail


@dataclass(frozen=True)
class Result:
    exit_code: int | None      # None when the command was killed at the timeout
    output: str                # stdout and stderr together, clipped to Limits.output_chars
    stopped: str | None        # which limit stopped it, or None: see STOPS
    seconds: float


# What `Result.stopped` can say, and what it means.
STOPS = {
    "timeout": "ran past the wall-clock timeout and was killed",
    "cpu time": "used up its CPU time",
    "memory": "ran out of its memory limit",
    "file size": "wrote a file larger than allowed",
    "processes": "started more processes than allowed",
    "network": "opened a network socket (the sandbox has no network)",
    "disk": "filled its folder past the allowed size",
}


# -- the sandbox -----------------------------------------------------------------------------------

class Sandbox:
    """One episode's folder and the way commands run in it. Use as a context manager, or close()."""

    def __init__(self, limits: Limits = Limits(), parent: str | None = None):
        self.limits, self.iso = limits, isolation()
        self.root = Path(tempfile.mkdtemp(prefix="clawrl-box-", dir=parent))
        self.root.chmod(0o711)   # the sandbox's uid may pass through, not list
        self.work, self.tmp, self.bin = self.root / "work", self.root / "tmp", self.root / "bin"
        for d in (self.work, self.tmp, self.bin):
            d.mkdir()
        for name in ("python", "python3"):
            (self.bin / name).symlink_to(self.iso.python)
        self.uid = UID_BASE + random.randrange(1, UID_SPAN) if self.iso.own_uid else None
        if self.uid is not None and (shut := [str(d) for d in self.root.parents
                                              if not d.stat().st_mode & 0o001]):
            self.close()
            raise ClawrlError(f"the sandbox's uid cannot reach {self.root}: {shut[0]} is closed to "
                              "other users; put sandboxes in a folder everyone may pass through "
                              "(the default, the system temp folder, is)")
        self.env = {"PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin", "HOME": str(self.work),
                    "TMPDIR": str(self.tmp), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                    "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
                    "PYTHONUNBUFFERED": "1", "TERM": "dumb"}
        self.seal()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # -- files, for environments and verifiers (run by us, not by the agent) --
    def path(self, rel: str) -> Path:
        """`rel` inside work/, resolved. A path (or a symlink the agent made) that leads outside
        work/ raises ValueError: verifiers run as us and must not read what the agent may not."""
        p = (self.work / rel).resolve()
        if not p.is_relative_to(self.work.resolve()):
            raise ValueError(f"{rel!r} leads outside the sandbox")
        return p

    def write(self, rel: str, text: str) -> None:
        p = self.path(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def read(self, rel: str, limit: int = 1 << 20) -> str | None:
        """A file the agent was to write, as text; None when it is missing, not a plain file,
        outside the sandbox, or larger than `limit`."""
        try:
            p = self.path(rel)
            if not p.is_file() or p.stat().st_size > limit:
                return None
            return p.read_text(errors="replace")
        except (OSError, ValueError):
            return None

    def seal(self) -> None:
        """Hand work/ and tmp/ to the sandbox's uid (after an environment wrote its files)."""
        if self.uid is None:
            return
        for top in (self.work, self.tmp):
            for dirpath, dirnames, filenames in os.walk(top):
                for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                    os.lchown(name, self.uid, self.uid)
            top.chmod(0o700)

    def used_bytes(self) -> int:
        total = 0
        for top in (self.work, self.tmp):
            for dirpath, dirnames, filenames in os.walk(top):
                for name in dirnames + filenames:
                    try:
                        total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
                    except OSError:
                        pass
        return total

    # -- commands --
    def _argv(self, argv: list[str]) -> list[str]:
        lim = self.limits
        # A shell as the namespace's init runs the command as its child: the kernel shields a
        # pid-namespace init from the very signals (SIGXCPU, SIGXFSZ) the limits rely on.
        init = ["bash", "-c", '"$@"; exit $?', "init", *argv]
        if self.iso.namespaces:
            return ns_prefix(self.iso.user_namespace, self.uid, lim.procs) + init
        return init

    def _preexec(self):
        lim, filt = self.limits, seccomp_filter() if self.iso.seccomp else None
        limits = [(resource.RLIMIT_CPU, (lim.cpu_s, lim.cpu_s + 1)),
                  (resource.RLIMIT_AS, (lim.memory_mb << 20,) * 2),
                  (resource.RLIMIT_FSIZE, (lim.file_mb << 20,) * 2),
                  (resource.RLIMIT_NOFILE, (lim.open_files,) * 2),
                  (resource.RLIMIT_CORE, (0, 0))]
        uid = None
        if not self.iso.namespaces:
            # No namespace to set the process limit in: set it here, on a private uid as root,
            # else on top of what this user already runs (RLIMIT_NPROC counts all of a uid's).
            uid = self.uid
            mine = 0 if uid is not None else _processes_of(os.getuid())
            limits.append((resource.RLIMIT_NPROC, (mine + lim.procs,) * 2))

        def preexec() -> None:
            for which, value in limits:
                resource.setrlimit(which, value)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            if filt:
                install_seccomp(filt[0])

        return preexec

    async def run(self, argv: list[str], stdin: str | None = None) -> Result:
        """Run `argv` in work/ under the limits. Never raises for what the command does."""
        lim, t0 = self.limits, time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *self._argv(argv), cwd=self.work, env=self.env, start_new_session=True,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            preexec_fn=self._preexec())
        output = _Clipped(lim.output_chars)
        both = asyncio.ensure_future(asyncio.gather(proc.wait(), output.drain(proc.stdout),
                                                    _feed(proc.stdin, stdin)))
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(both), lim.timeout_s)
        except TimeoutError:
            timed_out = True
        _kill_tree(proc.pid, timed_out)   # also what a command without a pid namespace left
        try:
            await asyncio.wait_for(both, 10)
        except TimeoutError:   # something outside our reach still holds the pipe
            both.cancel()
        if proc.returncode is None:
            await proc.wait()
        text = output.text()
        code = None if timed_out else proc.returncode
        stopped = "timeout" if timed_out else None
        stopped = _stop_reason(code, text) or stopped
        if stopped is None and self.used_bytes() > lim.disk_mb << 20:
            stopped = "disk"
        return Result(code, text, stopped, time.monotonic() - t0)


async def _feed(pipe, text: str | None) -> None:
    if pipe is None or text is None:
        return
    try:
        pipe.write(text.encode())
        await pipe.drain()
        pipe.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


class _Clipped:
    """A command's output, holding at most its first and last `limit`/2 characters."""

    def __init__(self, limit: int):
        self.half, self.head, self.tail, self.total = max(limit // 2, 1), bytearray(), bytearray(), 0

    async def drain(self, stream) -> None:
        while chunk := await stream.read(65536):
            self.total += len(chunk)
            room = self.half - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            self.tail = (self.tail + chunk)[-self.half:]

    def text(self) -> str:
        cut = self.total - len(self.head) - len(self.tail)
        middle = f"\n…[{cut} bytes of output cut]…\n" if cut > 0 else ""
        return self.head.decode(errors="replace") + middle + self.tail.decode(errors="replace")


# Exit codes and output that show which limit stopped a command. A signal is reported either as
# a negative code (the process itself) or as 128 + N (a shell whose child it killed). A shell
# reports a child's death in its output and may go on, so those lines count whatever the exit
# code; an exception's name counts only when the command failed.
_SIGNAL_STOPS = {signal.SIGXCPU: "cpu time", signal.SIGXFSZ: "file size", signal.SIGSYS: "network"}
_SHELL_STOPS = (
    ("network", "Bad system call"),
    ("file size", "File size limit exceeded"),
    ("cpu time", "CPU time limit exceeded"),
    ("processes", "fork: retry: Resource temporarily unavailable"),
    ("processes", "fork: Resource temporarily unavailable"),
    ("processes", "Cannot fork"),                       # dash
)
_ERROR_STOPS = (
    ("file size", "File too large"),
    ("memory", "MemoryError"),
    ("memory", "Cannot allocate memory"),
    ("memory", "std::bad_alloc"),
    ("processes", "BlockingIOError"),
    ("processes", "Resource temporarily unavailable"),
)


def _stop_reason(code: int | None, output: str) -> str | None:
    for sig, reason in _SIGNAL_STOPS.items():
        if code in (-sig, 128 + sig):
            return reason
    if code in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return "cpu time"   # the hard CPU limit's SIGKILL (we kill only at the timeout)
    cues = _SHELL_STOPS + (_ERROR_STOPS if code != 0 else ())
    return next((reason for reason, cue in cues if cue in output), None)


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _kill_tree(pid: int, init_too: bool) -> None:
    """SIGKILL the process group and, with `init_too`, the namespace's init first: its death ends
    every process in the pid namespace, even one that left the process group. (A command that
    ended by itself took its namespace with it.)"""
    for child in _children(pid) if init_too else ():
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _processes_of(uid: int) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                n += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return n
