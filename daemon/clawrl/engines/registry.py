"""Which adapter version is loaded on a server engine under which name, and what runs on it."""
from __future__ import annotations

import threading
import uuid
from collections import Counter


class AdapterRegistry:
    """Adapter version -> the name it is loaded under on the server, and requests in flight.

    Every load gets a name never used before, so an adapter a server still holds from an earlier
    run or version can never answer for a new one. A version being replaced is 'retiring': it
    stays loaded while requests that started on it run, and is unloaded when the last one ends.
    Thread-safe: requests come from the event loop, loads from worker threads.
    """

    def __init__(self):
        self.names: dict[int, str] = {}       # loaded on the server (retiring ones included)
        self.retiring: set[int] = set()
        self.inflight: Counter = Counter()    # name -> requests running on it
        self._lock = threading.Lock()

    @staticmethod
    def fresh_name(version: int) -> str:
        return f"clawrl-{version:04d}-{uuid.uuid4().hex[:8]}"

    def add(self, version: int, name: str) -> None:
        with self._lock:
            self.names[version] = name
            self.retiring.discard(version)

    def keep(self, version: int) -> None:
        """A retiring version becomes live again (a rollback to it)."""
        with self._lock:
            self.retiring.discard(version)

    def acquire(self, version: int) -> str | None:
        """The name a new request on `version` uses (None = the base model)."""
        if not version:
            return None
        with self._lock:
            name = self.names.get(version)
            if name is None:
                raise RuntimeError(f"adapter version {version} is not loaded")
            self.inflight[name] += 1
            return name

    def release(self, name: str | None) -> tuple[int, str] | None:
        """A request ended; (version, name) to unload now if it was the last on a retiring one."""
        if name is None:
            return None
        with self._lock:
            if self.inflight[name] <= 1:
                del self.inflight[name]
            else:
                self.inflight[name] -= 1
                return None
            return self._idle_retiring(name)

    def retire(self, version: int) -> tuple[int, str] | None:
        """No new requests on `version`; (version, name) to unload now if none is running."""
        with self._lock:
            name = self.names.get(version)
            if name is None:
                return None
            self.retiring.add(version)
            return self._idle_retiring(name)

    def _idle_retiring(self, name: str) -> tuple[int, str] | None:
        for version in self.retiring:
            if self.names.get(version) == name and not self.inflight[name]:
                self.retiring.discard(version)
                del self.names[version]
                return version, name
        return None

    def reset(self) -> list[tuple[int, str]]:
        """The server (re)started, or came back after an outage: forget every name. The versions
        to load again (under fresh names), each with the name it had."""
        with self._lock:
            keep = sorted((v, n) for v, n in self.names.items() if v not in self.retiring)
            self.names.clear()
            self.retiring.clear()
            self.inflight.clear()
            return keep
