"""Test helpers around the protocol doubles: daemon settings that launch a double as the engine
server, the double's transcript, and real PEFT adapters of a chosen rank."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import torch

from clawrl.adapters import versions as adapters

DOUBLES = Path(__file__).resolve().parent


def double_command(kind: str) -> str:
    return f"{sys.executable} {DOUBLES / f'{kind}_server.py'}"


def engine_env(kind: str, port: int, transcript: Path, rank: int = 8, **extra) -> dict:
    """CLAWRL_* settings for a daemon whose engine is `kind`, launched as the double."""
    return {"CLAWRL_ENGINE_KIND": kind, "CLAWRL_ENGINE_COMMAND": double_command(kind),
            "CLAWRL_ENGINE_PORT": str(port),
            "CLAWRL_ENGINE_EXTRA_ARGS": f"--transcript {transcript}",
            "CLAWRL_ENGINE_MAX_LORA_RANK": str(rank), "CLAWRL_TRAIN_LORA_R": str(rank),
            "CLAWRL_ENGINE_STARTUP_TIMEOUT_S": "240", "CLAWRL_ENGINE_MAX_CONCURRENT": "16",
            "CLAWRL_SKILLS_ENABLED": "false", **extra}


class Transcript:
    """The JSONL events a double wrote (start, generate, score, load, unload)."""

    def __init__(self, path: Path):
        self.path = path

    def events(self, kind: str | None = None) -> list[dict]:
        if not self.path.exists():
            return []
        out = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        return [e for e in out if kind is None or e["event"] == kind]

    def wait(self, pred, timeout: float = 120, what: str = "an event") -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for e in self.events():
                if pred(e):
                    return e
            time.sleep(0.1)
        raise AssertionError(f"the double never logged {what}: {self.events()[-5:]}")

    def pid(self) -> int:
        return self.events("start")[-1]["pid"]

    def name_of(self, version: int) -> str:
        """The server-side name the newest successful load of adapter `version` used."""
        loads = [e for e in self.events("load")
                 if e["ok"] and Path(e["lora_path"]).name == f"{version:04d}"]
        return loads[-1]["lora_name"]

    def generation(self, input_ids: list[int]) -> dict:
        """The newest request with these prompt ids (the double logs it as its response ends,
        which may be just after clawrl has read the final chunk)."""
        self.wait(lambda e: e["event"] == "generate" and e["input_ids"] == input_ids, 60,
                  "that request")
        return [e for e in self.events("generate") if e["input_ids"] == input_ids][-1]


_BASE: dict = {}


def write_adapter(root: Path, version: int, rank: int, model_dir: Path, seed: int = 0) -> None:
    """A real PEFT LoRA of `rank` on q/v projections of the served model, random small B."""
    import warnings

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
    if "model" not in _BASE:
        _BASE["model"] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft = get_peft_model(_BASE["model"], LoraConfig(r=rank, lora_alpha=2 * rank,
                                                     target_modules=["q_proj", "v_proj"]))
    g = torch.Generator().manual_seed(seed or version)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    adapters.write_version(root, version, peft.save_pretrained,
                           {"parent": version - 1, "samples": [], "loss": 0.0})
    _BASE["model"] = peft.unload()     # the plain base again for the next one


def wait_active(url: str, version: int, timeout: float = 120) -> dict:
    """Until `version` serves and its canary has passed (the swap is over)."""
    deadline, info = time.time() + timeout, {}
    while time.time() < deadline:
        info = httpx.get(f"{url}/v1/adapters", timeout=10).json()
        if info["active"] == version and any(e["version"] == version and e["event"] == "canary passed"
                                             for e in info["events"]):
            return info
        time.sleep(0.1)
    raise AssertionError(f"adapter {version} never became active: {info}")


def chat(url: str, text: str, session: str, max_tokens: int = 8, **extra) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=180, headers={"X-Session-Id": session},
                      json={"model": "m", "max_tokens": max_tokens, "temperature": 0,
                            "messages": [{"role": "user", "content": text}], **extra})


def sse(lines) -> list:
    """The JSON payloads of an SSE stream's data lines ('[DONE]' kept as the string)."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def hold(engine_url: str, name: str | None, on: bool) -> None:
    httpx.post(f"{engine_url}/_double/hold", json={"lora_name": name, "hold": on},
               timeout=10).raise_for_status()
