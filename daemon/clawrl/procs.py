"""Child processes that do not outlive whoever started them."""
from __future__ import annotations

import ctypes
import signal


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when the thread that started it exits (its
    parent was killed, even by SIGKILL). Linux only; elsewhere a no-op. Safe as a `preexec_fn`."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, sig)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
