"""The embedded engine's prefix pool on real transformers KV caches (no model weights: each
cache holds one small key/value tensor per position, numbered, so a crop or a copy shows)."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from clawrl.engines.prefix_pool import PrefixPool, worth_reusing


def cache_of(n: int) -> DynamicCache:
    c = DynamicCache()
    kv = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1)
    c.update(kv.clone(), kv.clone(), 0)
    return c


def filled(pool: PrefixPool, ids: list[int], adapter: int = 0, done: bool = True):
    """A request that prefilled all of `ids`: its entry holds them; `done`: then it ended."""
    entry, _ = pool.take(ids, adapter, DynamicCache, lambda: None)
    entry.ids, entry.cache = list(ids), cache_of(len(ids))
    if done:
        pool.release(entry)
    return entry


def test_the_longest_prefix_of_the_same_version_is_reused_and_cropped_to_it():
    pool = PrefixPool(keep=4)
    system = list(range(100))
    running = filled(pool, system + [7] * 20, done=False)
    filled(pool, system[:50] + [8] * 10)
    filled(pool, system + [9] * 30, adapter=2)        # longer, but another version's weights
    entry, cached = pool.take(system + [5, 6], 0, DynamicCache, lambda: None)
    assert cached == 100 and entry.ids == system and entry.cache.get_seq_length() == 100
    assert entry.cache.layers[0].keys[0, 0, -1, 0].item() == 99   # cropped, not rebuilt
    assert running.cache.get_seq_length() == 120 and running in pool.entries
    # an idle cache is handed over, not copied: it leaves the pool's idle entries
    idle = [e for e in pool.entries if not e.in_use]
    taken, cached = pool.take(system[:50] + [8] * 10 + [1], 0, DynamicCache, lambda: None)
    assert cached == 60 and len([e for e in pool.entries if not e.in_use]) == len(idle) - 1


def test_a_cache_in_use_is_copied_never_shared_and_the_last_prompt_token_is_always_fed():
    pool = PrefixPool(keep=4)
    ids = list(range(40))
    first, _ = pool.take(ids, 0, DynamicCache, lambda: None)
    first.ids, first.cache = list(ids), cache_of(40)          # still running
    second, cached = pool.take(ids, 0, DynamicCache, lambda: None)
    assert cached == 39                                          # the same prompt: all but one
    assert second.cache is not first.cache and first.cache.get_seq_length() == 40
    # a cache joined into the decode batch is given back before it is copied
    first.cache, given = None, []
    pool.take(ids, 0, DynamicCache, lambda: (given.append(1), setattr(first, "cache", cache_of(40))))
    assert given == [1]


def test_short_prefixes_prefill_cold_and_idle_caches_go_least_recent_first():
    assert not worth_reusing(8, 400) and worth_reusing(300, 400)
    pool = PrefixPool(keep=2)
    a, b, c = (filled(pool, [k] * 30) for k in (1, 2, 3))
    assert a not in pool.entries and {id(b), id(c)} == {id(e) for e in pool.entries}
    entry, cached = pool.take([2] * 8 + [4] * 300, 0, DynamicCache, lambda: None)
    assert cached == 0 and entry.ids == [] and entry.cache.get_seq_length() == 0
    pool.drop(entry)
    pool.drop_version(0)
    assert pool.entries == []
