"""The hot-swap guard's decisions, against a scripted stand-in for the engine (the real engine
path is covered by test_swap.py; a real adapter that collapses on cue cannot be made in a test).
Real adapter folders, a real turn log."""
from __future__ import annotations

import asyncio

import torch
from safetensors.torch import save_file

from clawrl.adapters import versions as adapters
from clawrl.config import load_config
from clawrl.turnlog.store import Store
from clawrl.adapters.swap import Swapper
from clawrl.types import Attribution, Finish, GenParams, TokenEvent


class ScriptedEngine:
    """Answers like the engine API: version 2 loops on one token, version 3 answers nothing."""
    adapter_kind = "peft"

    def __init__(self):
        self.adapter_version, self.loaded_adapters, self.unloaded = 0, set(), []

    def load_adapter(self, version, path):
        import concurrent.futures
        self.loaded_adapters.add(version)
        f = concurrent.futures.Future()
        f.set_result(None)
        return f

    def unload_adapter(self, version):
        import concurrent.futures
        self.loaded_adapters.discard(version)
        self.unloaded.append(version)
        f = concurrent.futures.Future()
        f.set_result(True)
        return f

    def activate(self, version):
        self.adapter_version = version

    def submit(self, ids, params: GenParams, adapter=None):
        tokens = {2: [7] * 16, 3: []}.get(adapter, list(range(100, 116)))

        async def gen():
            for t in tokens:
                yield TokenEvent(t, -0.1, f"w{t} ")
        return gen()


def write(root, version, value=0.01, loss=0.5):
    def save(path):
        save_file({"base_model.model.layer.lora_A.weight": torch.full((2, 2), value)},
                  str(path / adapters.WEIGHTS))
        (path / "adapter_config.json").write_text("{}")
    adapters.write_version(root, version, save, {"parent": version - 1, "samples": [], "loss": loss})


def test_guard_rejects_nan_and_collapsed_versions_and_restores_the_previous(tmp_path):
    cfg = load_config(env={"CLAWRL_HOME": str(tmp_path)})

    async def main():
        store = await Store.open(cfg.db_path)
        tid = await store.begin_turn(Attribution("s"), {"messages": [{"role": "user", "content": "hi"}]},
                                     [1, 2, 3], "m", 0)
        await store.finish_turn(tid, status="complete", text="hello", token_ids=[5], logprobs=[-0.1],
                                tool_calls=None, finish=Finish("stop", 3, 1), ttft_ms=1, total_ms=2)
        engine = ScriptedEngine()
        swap = Swapper(cfg, engine, store)
        root = cfg.adapters_dir
        swap.start()

        async def settle(version):
            for _ in range(200):
                if swap.seen >= version:
                    return
                await asyncio.sleep(0.05)
        write(root, 1)
        await settle(1)
        assert engine.adapter_version == 1 and adapters.read_active(root) == 1
        write(root, 2)                      # loops: rejected, version 1 restored
        await settle(2)
        assert "loop" in adapters.rejection(root, 2)
        assert engine.adapter_version == 1 and 2 in engine.unloaded
        write(root, 3)                      # empty answers
        await settle(3)
        assert "empty" in adapters.rejection(root, 3) and engine.adapter_version == 1
        write(root, 4, value=float("nan"))  # never even loaded
        await settle(4)
        assert "NaN" in adapters.rejection(root, 4) and 4 not in engine.unloaded
        write(root, 5, loss=float("inf"))
        await settle(5)
        assert "loss" in adapters.rejection(root, 5)
        assert adapters.read_active(root) == 1
        events = [(e["version"], e["event"]) for e in swap.status()["events"]]
        assert (2, "rejected") in events and (1, "activated") in events
        await swap.stop()
        # The decisions outlive the daemon: a new one (a restart) shows the same history.
        again = Swapper(cfg, ScriptedEngine(), store)
        assert again.status()["events"] == swap.status()["events"]
        await store.close()

    asyncio.run(main())


def test_the_event_record_survives_a_torn_line_and_stays_bounded(tmp_path):
    for i in range(2 * adapters.EVENTS_KEPT + 1):
        adapters.append_event(tmp_path, {"version": i, "event": "activated", "reason": "x" * 300})
    kept = adapters.read_events(tmp_path, 10 ** 6)
    assert len(kept) == adapters.EVENTS_KEPT and kept[-1]["version"] == 2 * adapters.EVENTS_KEPT
    with open(tmp_path / adapters.EVENTS, "a") as f:
        f.write('{"version": 9999, "ev')                  # a crash mid-write
    assert adapters.read_events(tmp_path, 3)[-1]["version"] == 2 * adapters.EVENTS_KEPT
    adapters.append_event(tmp_path, {"version": 10000, "event": "activated"})   # on a line of its own
    assert [e["version"] for e in adapters.read_events(tmp_path, 3)] == [2 * adapters.EVENTS_KEPT, 10000]

