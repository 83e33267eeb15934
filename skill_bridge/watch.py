"""Watching: republish a skill shortly after its source folder stops changing.

Owns the watchdog observer and the per-skill debounce; what to do with a skill is the
Publisher's business. Every event is reduced to the top-level folder name under the source,
so an editor's temp files only cause a reconcile and validation decides. One worker thread
runs the reconciles, so stop() has exactly two threads to join.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

from watchdog.events import (EVENT_TYPE_CLOSED_NO_WRITE, EVENT_TYPE_OPENED, FileSystemEvent,
                             FileSystemEventHandler)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from .publish import Publisher, SkillResult
from .validate import is_hidden

log = logging.getLogger(__name__)

# Reads are not changes; reacting to them would loop, since reconciling reads the source.
_IGNORED_EVENTS = {EVENT_TYPE_OPENED, EVENT_TYPE_CLOSED_NO_WRITE}


class SkillWatcher:
    """Keeps the target in step with the source while running."""

    def __init__(self, publisher: Publisher, debounce_s: float = 0.3,
                 on_result: Callable[[SkillResult], None] | None = None):
        self.publisher = publisher
        self.debounce_s = debounce_s
        self.on_result = on_result
        self._cond = threading.Condition()
        self._due: dict[str, float] = {}  # skill name -> monotonic time to reconcile it
        self._stopping = False
        self._observer: BaseObserver | None = None
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        """Publish everything once, then follow changes. Watching starts before the initial
        sync so that nothing changed during the sync is missed (it is reconciled again)."""
        self.publisher.source.mkdir(parents=True, exist_ok=True)
        # Event paths start with the watched path as given; resolve it once for both.
        source = self.publisher.source.resolve()
        self._stopping = False
        self._worker = threading.Thread(target=self._run, name="skill-watcher", daemon=True)
        self._worker.start()
        self._observer = Observer()
        self._observer.schedule(_Handler(self, source), str(source), recursive=True)
        self._observer.start()
        for result in self.publisher.sync():
            self._report(result)

    def stop(self) -> None:
        """Stop watching and wait for a reconcile in progress; pending ones are dropped (the
        next start() syncs everything anyway)."""
        if self._observer is not None:
            self._observer.stop()
            self._observer.join()
            self._observer = None
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join()
            self._worker = None

    def touch(self, name: str) -> None:
        """(Re)start the debounce timer for one skill."""
        with self._cond:
            self._due[name] = time.monotonic() + self.debounce_s
            self._cond.notify_all()

    def _run(self) -> None:
        with self._cond:
            while not self._stopping:
                if not self._due:
                    self._cond.wait()
                    continue
                name, when = min(self._due.items(), key=lambda kv: kv[1])
                delay = when - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                del self._due[name]
                self._cond.release()
                try:
                    self._reconcile(name)
                finally:
                    self._cond.acquire()

    def _reconcile(self, name: str) -> None:
        try:
            result = self.publisher.reconcile(name)
        except Exception:  # a bad skill or a full disk must not end the watching
            log.exception("skill_bridge: reconciling skill %r failed", name)
            return
        self._report(result)

    def _report(self, result: SkillResult) -> None:
        if self.on_result is None:  # nobody else will tell the author what is wrong
            for issue in result.issues:
                log.warning("skill_bridge: %s: %s", result.name, issue)
            return
        try:
            self.on_result(result)
        except Exception:
            log.exception("skill_bridge: on_result callback failed for %r", result.name)


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: SkillWatcher, source: Path):
        self.watcher = watcher
        self.source = source

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in _IGNORED_EVENTS:
            return
        # A move reconciles both ends: the old name may need unpublishing.
        for path in (event.src_path, getattr(event, "dest_path", "")):
            name = self._skill_name(path)
            if name is not None:
                self.watcher.touch(name)

    def _skill_name(self, path: str | bytes) -> str | None:
        if not path:
            return None
        if isinstance(path, bytes):
            path = path.decode(errors="surrogateescape")
        try:
            parts = Path(path).relative_to(self.source).parts
        except ValueError:
            return None
        if not parts or is_hidden(parts[0]):
            return None
        return parts[0]
