"""Hot-swap through the HTTP API: new adapter versions go live without failing a request; bad
ones are rejected; the operator can activate and roll back while the daemon runs."""
from __future__ import annotations

import subprocess
import threading
import time

import httpx
import pytest
import torch

from clawrl.adapters import versions as adapters
from conftest import CLAWRL, MODEL_CACHE, Daemon, make_home

pytestmark = pytest.mark.model


def make_adapter(root, version: int, scale: float = 0.02, poison: bool = False,
                 model=None) -> None:
    """Write version `version`: a real PEFT LoRA (`model`, else one from `lora`)."""
    model = model or lora(version, scale, poison)
    adapters.write_version(root, version, lambda path: model.save_pretrained(path),
                           {"parent": version - 1, "samples": [], "loss": 0.0})


def lora(version: int, scale: float = 0.02, poison: bool = False):
    """A real PEFT LoRA for the served base model, with small random (or NaN) B weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model_dir = MODEL_CACHE / "SmolLM2-135M-Instruct"
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    g = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
                if poison:
                    p[0, 0] = float("nan")
    return model


def wait_active(url: str, version: int, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = httpx.get(f"{url}/v1/adapters", timeout=10).json()
        if info["active"] == version:
            return info
        time.sleep(0.1)
    raise AssertionError(f"version {version} not active: {info}")


def chat(url: str, session: str, text: str, max_tokens: int = 6) -> int:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, headers={"X-Session-Id": session},
                   json={"model": "m", "max_tokens": max_tokens, "temperature": 0,
                         "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return int(r.headers["x-clawrl-turn-id"])


def test_new_adapter_goes_live_while_a_stream_finishes_on_the_old_one(tmp_path):
    home = make_home(tmp_path / "home")
    d = Daemon(home).start()
    try:
        chat(d.url, "warm", "Hello there, how are you today?")          # a prompt for the canary
        ready = lora(1)         # built first: on a busy machine that takes longer than the stream
        streamed, done = [], threading.Event()

        def stream():
            body = {"model": "m", "stream": True, "max_tokens": 120, "temperature": 0.7, "seed": 1,
                    "messages": [{"role": "user", "content": "Tell me a long story about a fox."}]}
            with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=300,
                              headers={"X-Session-Id": "across"}) as r:
                streamed.append(int(r.headers["x-clawrl-turn-id"]))
                streamed.extend(line for line in r.iter_lines() if line.startswith("data: "))
            done.set()

        t = threading.Thread(target=stream)
        t.start()
        while len(streamed) < 4:
            time.sleep(0.05)
        make_adapter(home / "adapters", 1, model=ready)
        info = wait_active(d.url, 1)
        assert info["versions"][0]["loaded"] and not info["versions"][0]["rejected"]
        assert not done.is_set(), "the swap happened while the stream was still running"
        after = chat(d.url, "after", "Hello there, how are you today?")
        t.join(timeout=300)
        assert streamed[-1] == "data: [DONE]"
        old = d.wait_turn(streamed[0])
        assert old["status"] == "complete" and old["completion_tokens"] == 120
        assert old["adapter_version"] == 0
        assert d.wait_turn(after)["adapter_version"] == 1
        assert adapters.read_active(home / "adapters") == 1
    finally:
        d.stop()


def test_bad_adapters_are_rejected_and_the_operator_can_activate_and_roll_back(tmp_path):
    home = make_home(tmp_path / "home")
    root = home / "adapters"
    d = Daemon(home).start()
    env = d.env
    try:
        chat(d.url, "warm", "What is two plus two?")
        make_adapter(root, 1)
        wait_active(d.url, 1)
        make_adapter(root, 2, poison=True)
        deadline = time.time() + 60
        while adapters.rejection(root, 2) is None and time.time() < deadline:
            time.sleep(0.1)
        assert "NaN" in adapters.rejection(root, 2)
        assert httpx.get(f"{d.url}/v1/adapters").json()["active"] == 1
        assert d.wait_turn(chat(d.url, "s", "What is two plus two?"))["adapter_version"] == 1

        make_adapter(root, 3)
        wait_active(d.url, 3)
        listing = subprocess.run([*CLAWRL, "adapters"], env=env, capture_output=True, text=True, timeout=60)
        assert "* 0003" in listing.stdout and "REJECTED" in listing.stdout
        out = subprocess.run([*CLAWRL, "adapters", "rollback"], env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0 and "active: 1" in out.stdout
        assert adapters.rejection(root, 3).startswith("rolled back")
        assert d.wait_turn(chat(d.url, "s2", "What is two plus two?"))["adapter_version"] == 1
        out = subprocess.run([*CLAWRL, "adapters", "activate", "0"], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and "active: 0" in out.stdout
        assert d.wait_turn(chat(d.url, "s3", "What is two plus two?"))["adapter_version"] == 0
        bad = subprocess.run([*CLAWRL, "adapters", "activate", "2"], env=env, capture_output=True,
                             text=True, timeout=60)
        assert bad.returncode == 2 and "rejected" in bad.stderr
        assert httpx.post(f"{d.url}/v1/adapters/activate", json={"version": 1}).json() == {"active": 1}
    finally:
        d.stop()
    # After a restart the daemon serves what was active.
    d2 = Daemon(home, port=d.port).start()
    try:
        assert wait_active(d2.url, 1)["active"] == 1
        assert d2.wait_turn(chat(d2.url, "s4", "What is two plus two?"))["adapter_version"] == 1
    finally:
        d2.stop()
