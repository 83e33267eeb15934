"""What the sandbox can isolate on this machine, found out once: namespaces, a private uid,
seccomp, and an interpreter the sandbox's user may run.

The probe runs the real command line (unshare, prlimit, the seccomp filter) on `python -c` and
keeps the strongest arrangement that works: as root, namespaces and a private uid; without root,
namespaces inside a user namespace; else rlimits (and seccomp) alone. `Isolation.notes` names
what is missing and why; sandbox.py reads the result to build each command.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform
import shutil
import struct
import subprocess
import sys
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox do; probed once by `isolation()`."""
    namespaces: bool           # network, pid and mount namespaces through unshare
    user_namespace: bool       # not root: the namespaces sit in a new user namespace
    own_uid: bool              # root: each sandbox runs as a uid of its own
    seccomp: bool              # non-Unix sockets kill the process
    python: str                # the interpreter commands get as `python` / `python3`
    notes: tuple[str, ...]     # what is missing, and why

    def describe(self) -> dict:
        return {**asdict(self), "network": self.network()}

    def network(self) -> str:
        if self.namespaces and self.seccomp:
            return "no network: a new network namespace, and opening a socket kills the process"
        if self.namespaces:
            return "no network: a new network namespace (sockets open, but reach nothing)"
        if self.seccomp:
            return "sockets refused by seccomp only (no network namespace on this machine)"
        return "NOT isolated: no network namespace and no seccomp on this machine"


# -- seccomp: a classic-BPF filter, installed with prctl through ctypes ----------------------------

# machine -> (its AUDIT_ARCH, the syscall numbers of socket and io_uring_setup)
_ARCH = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}
_KILL, _ALLOW = 0x80000000, 0x7FFF0000   # SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ALLOW
_AF_UNIX = 1


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


@functools.cache
def seccomp_filter() -> tuple | None:
    """(prog, buffer) for prctl(PR_SET_SECCOMP), or None where the architecture is not known."""
    arch = _ARCH.get(platform.machine())
    if arch is None or not sys.platform.startswith("linux"):
        return None
    audit, nr_socket, nr_uring = arch
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    prog = [
        _bpf(ld, 0, 0, 4),                 # 0: A = arch
        _bpf(jeq, 0, 7, audit),            # 1: another ABI (i386, x32 tricks) -> kill
        _bpf(ld, 0, 0, 0),                 # 2: A = syscall number
        _bpf(jge, 5, 0, 0x40000000),       # 3: x32 numbers -> kill
        _bpf(jeq, 0, 2, nr_socket),        # 4: socket(...)?
        _bpf(ld, 0, 0, 16),                # 5: A = low half of its first argument (the family)
        _bpf(jeq, 3, 2, _AF_UNIX),         # 6: Unix sockets -> allow, others -> kill
        _bpf(jeq, 1, 0, nr_uring),         # 7: io_uring can open sockets too -> kill
        _bpf(ret, 0, 0, _ALLOW),           # 8
        _bpf(ret, 0, 0, _KILL),            # 9
        _bpf(ret, 0, 0, _ALLOW),           # 10
    ]
    # Jumps are relative to the next instruction: 1 -> 9, 3 -> 9, 4 -> 7, 6 -> 10 | 9, 7 -> 9 | 8.
    buf = ctypes.create_string_buffer(b"".join(prog))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    return Prog(len(prog), ctypes.addressof(buf)), buf


_libc = ctypes.CDLL(None, use_errno=True)


def install_seccomp(prog) -> None:
    if _libc.prctl(38, 1, 0, 0, 0) != 0:                       # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if _libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:      # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


# -- the probe -------------------------------------------------------------------------------------

UID_BASE, UID_SPAN = 1 << 20, 1 << 24   # private uids, far above any real account's


def ns_prefix(user_namespace: bool, uid: int | None, procs: int) -> list[str]:
    argv = [shutil.which("unshare") or "unshare", "--net", "--pid", "--fork", "--kill-child",
            "--mount", "--mount-proc"]
    if user_namespace:
        argv += ["--user", "--map-root-user"]
    if uid is not None:
        argv += ["--setuid", str(uid), "--setgid", str(uid)]
    return argv + ["--", shutil.which("prlimit") or "prlimit", f"--nproc={procs}:{procs}", "--"]


def _probe(argv: list[str], seccomp: bool) -> bool:
    filt = seccomp_filter() if seccomp else None
    try:
        r = subprocess.run(argv, capture_output=True, timeout=30, cwd="/",
                           preexec_fn=(lambda: install_seccomp(filt[0])) if filt else None)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and r.stdout.strip() == b"ok"


@functools.cache
def isolation() -> Isolation:
    root = os.geteuid() == 0
    notes: list[str] = []
    candidates = list(dict.fromkeys(p for p in (
        os.path.realpath(sys.executable), shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin"))
        if p))
    seccomp = seccomp_filter() is not None and _probe([candidates[0], "-c", "print('ok')"], True)
    if not seccomp:
        notes.append(f"seccomp unavailable ({platform.machine()}): sockets are not refused")
    check = "import os; os.listdir('/proc'); print('ok')"
    have = shutil.which("unshare") and shutil.which("prlimit")
    for python in candidates:
        if have and root and _probe(ns_prefix(False, UID_BASE, 64) + [python, "-c", check], seccomp):
            return Isolation(True, False, True, seccomp, python, tuple(notes))
    for python in candidates[:1]:
        if have and _probe(ns_prefix(not root, None, 64) + [python, "-c", check], seccomp):
            notes.append(f"no interpreter that another uid may run ({python} is private): "
                         "commands run as root, so the process limit is not enforced" if root else
                         "commands run as this user (in a user namespace): they can read what it "
                         "can read, the turn log included")
            return Isolation(True, not root, False, seccomp, python, tuple(notes))
    notes.append("unshare could not create network/pid namespaces here" if have else
                 "unshare/prlimit (util-linux) not found: no network or pid namespace")
    own_uid = root and _probe_uid(candidates)
    python = own_uid or candidates[0]
    if not own_uid:
        notes.append("commands run as root: the process limit is not enforced" if root else
                     "commands run as this user: they can read what it can read")
    return Isolation(False, False, bool(own_uid), seccomp, python, tuple(notes))


def _become_private_uid() -> None:
    os.setgroups([])
    os.setgid(UID_BASE)
    os.setuid(UID_BASE)


def _probe_uid(candidates: list[str]) -> str | None:
    """Without namespaces, as root: an interpreter a private uid can run, if any."""
    for python in candidates:
        try:
            r = subprocess.run([python, "-c", "print('ok')"], capture_output=True, timeout=30,
                               cwd="/", preexec_fn=_become_private_uid)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            return python
    return None
