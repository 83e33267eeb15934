"""The embedded engine's prefix pool: KV caches kept by the tokens they hold.

Every request's KV cache lives in a small pool keyed by the tokens it holds. A new request takes
the cache with the longest common prefix (OpenClaw resends the same ~10k-token system prompt on
each call), crops it to that prefix and prefills only the rest. A cache still in use by another
request is copied, never shared. Idle caches are evicted least-recently-used. A cache is only
valid under the weights that computed it, so it is matched within its adapter version only.

It owns the pool and the choice of what to reuse. Running the model over what is left is the
engine's (engines/embedded.py).
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import DynamicCache


def worth_reusing(cached: int, total: int) -> bool:
    """Is prefilling `total - cached` tokens against a cached prefix cheaper than `total` cold?

    Cold prefill runs causal attention (~n^2/2 pairs); continuing a cache attends through a mask
    over every (new, all) pair at ~1.4x the cost per pair. Linear cost per token ~2000x a pair's:
    fitted on this CPU to 2k-8k prefills (e.g. 4k cached + 4k new: 20 s; 8k cold: 22 s)."""
    new = total - cached
    warm = 2000 * new + 1.4 * new * (cached + new / 2)
    cold = 2000 * total + total * total / 2
    return cached >= 16 and warm < cold


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Entry:
    """A KV cache and exactly the tokens it holds, computed under one adapter version."""
    ids: list[int]
    cache: DynamicCache | None       # None while joined into the decode batch (kvbatch.py)
    adapter: int = 0
    in_use: bool = True
    used_at: float = field(default_factory=time.monotonic)


class PrefixPool:
    def __init__(self, keep: int):
        self.keep = keep                  # idle entries kept (engine.prefix_cache_entries)
        self.entries: list[Entry] = []

    def take(self, ids: list[int], adapter: int, new_cache: Callable[[], DynamicCache],
             unbatch: Callable[[], None]) -> tuple[Entry, int]:
        """An entry for a request with prompt `ids` on `adapter`, and how many of its tokens it
        already holds (at most all but the last: the last prompt token is always fed).
        `unbatch` gives the decode batch's caches back to their entries (a cache to copy may be
        joined into it); `new_cache` makes an empty one."""
        best, best_n = None, 0
        for e in self.entries:
            if e.adapter != adapter:      # a KV cache is only valid under its own weights
                continue
            n = common_prefix(e.ids, ids)
            if n > best_n:
                best, best_n = e, n
        best_n = min(best_n, len(ids) - 1)
        if best is not None and worth_reusing(best_n, len(ids)):
            if best.in_use:
                if best.cache is None:           # joined into the decode batch
                    unbatch()
                cache = copy.deepcopy(best.cache)
            else:
                cache = best.cache
                self.entries.remove(best)
            assert cache is not None         # unbatch() gave the batch's caches back
            cache.crop(-(cache.get_seq_length() - best_n))
            entry = Entry(list(ids[:best_n]), cache, adapter)
        else:
            entry, best_n = Entry([], new_cache(), adapter), 0
        self.entries.append(entry)
        return entry, best_n

    def release(self, entry: Entry) -> None:
        """The request is done with `entry`: it stays for reuse, the least recent beyond `keep`
        idle ones go."""
        entry.in_use = False
        entry.used_at = time.monotonic()
        idle = sorted((e for e in self.entries if not e.in_use), key=lambda e: e.used_at)
        for e in idle[:max(0, len(idle) - self.keep)]:
            self.entries.remove(e)

    def drop(self, entry: Entry) -> None:
        """Forget an entry whose cache is suspect (its request failed)."""
        self.entries = [e for e in self.entries if e is not entry]

    def drop_version(self, version: int) -> None:
        """Forget the idle caches computed under an unloaded adapter version."""
        self.entries = [e for e in self.entries if e.in_use or e.adapter != version]

    def clear(self) -> None:
        self.entries.clear()
