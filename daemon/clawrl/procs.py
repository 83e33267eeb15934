"""Child processes: ones that do not outlive whoever started them, and a free loopback port for
a child server to listen on."""
from __future__ import annotations

import ctypes
import signal
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when the thread that started it exits (its
    parent was killed, even by SIGKILL). Linux only; elsewhere a no-op. Safe as a `preexec_fn`."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, sig)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
