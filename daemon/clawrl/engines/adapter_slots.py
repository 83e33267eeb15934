"""Adapter slots: where the embedded engine keeps the LoRA versions it serves inside one PeftModel.

A version lives in a slot, a PEFT adapter named `s0`, `s1`, ... . Loading a version through PEFT
(`load_adapter`) builds new LoRA modules in every target layer and walks the whole model several
times: ~0.4 s of Python for SmolLM2-135M's 210 LoRA layers, most of a hot-swap. Every version the
trainer writes has the same LoRA config, so once a version is unloaded its slot is kept free, and
the next version with the same config is copied into that slot's tensors instead (a few
milliseconds for 20 MB). A version with another config, or with tensors that do not fit the slot,
takes PEFT's path into a new slot. At most `keep_free` slots wait free; more are deleted.

It owns the version -> slot map and the copy. What runs on which slot (routing, the fast decode
step) is the engine's.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
# Fields of adapter_config.json that do not change what the tensors mean.
_IRRELEVANT = {"base_model_name_or_path", "revision", "inference_mode", "init_lora_weights",
               "peft_version"}


def _config(path: Path) -> dict:
    cfg = json.loads((Path(path) / CONFIG).read_text())
    return {k: v for k, v in cfg.items() if k not in _IRRELEVANT}


class AdapterSlots:
    def __init__(self, keep_free: int = 2):
        self.keep_free = keep_free
        self.slot: dict[int, str] = {}            # loaded version -> its slot
        self.free: list[str] = []                 # slots of unloaded versions, oldest first
        self._config: dict[str, dict] = {}        # slot -> the LoRA config its tensors follow
        self._tensors: dict[str, dict[str, torch.Tensor]] = {}   # slot -> saved key -> parameter
        self._next = 0
        self.copied = self.peft_loads = 0         # how versions came in (for status and tests)

    def name(self, version: int) -> str:
        return self.slot[version]

    def load(self, model: PreTrainedModel | PeftModel, base: PreTrainedModel, version: int,
             path: Path) -> PreTrainedModel | PeftModel:
        """Put `version` (PEFT files in `path`) into a slot; the model to serve with (the base is
        wrapped in a PeftModel at the first version)."""
        config = _config(path)
        for slot in self.free:
            if self._config[slot] == config and self._copy_into(slot, path):
                self.free.remove(slot)
                self.slot[version] = slot
                self.copied += 1
                return model
        slot = f"s{self._next}"
        self._next += 1
        from peft import PeftModel
        if model is base:
            model = PeftModel.from_pretrained(base, str(path), adapter_name=slot)
            model.eval()
        else:
            cast("PeftModel", model).load_adapter(str(path), adapter_name=slot)
        self.slot[version], self._config[slot] = slot, config
        self._tensors[slot] = self._saved_keys(cast("PeftModel", model), slot)
        self.peft_loads += 1
        return model

    def release(self, model: PeftModel, base: PreTrainedModel, version: int) -> PreTrainedModel | PeftModel:
        """`version` is no longer served: its slot waits for the next version, or is deleted
        when enough wait. The model to serve with afterwards (the bare base once no slot is
        left: PEFT keeps a deleted adapter as its active one, so a base request through the
        PeftModel would fail)."""
        slot = self.slot.pop(version)
        self.free.append(slot)
        while len(self.free) > self.keep_free:
            gone = self.free.pop(0)
            self._config.pop(gone, None)
            self._tensors.pop(gone, None)
            if not self.slot and not self.free:     # the last slot: unwrap
                from peft.tuners.lora import LoraModel
                cast(LoraModel, model.base_model).unload()   # LoRA versions only
                return base
            with warnings.catch_warnings():   # "adapter X was active, setting active to Y": meant
                warnings.simplefilter("ignore")
                model.delete_adapter(gone)
        return model

    @staticmethod
    def _saved_keys(model: PeftModel, slot: str) -> dict[str, torch.Tensor]:
        """The slot's parameters under the names PEFT saves them by (the adapter name dropped)."""
        from peft.utils import get_peft_model_state_dict
        saved = get_peft_model_state_dict(model, adapter_name=slot)
        own = {k: p for k, p in model.named_parameters() if f".{slot}." in k or k.endswith(f".{slot}")}
        out: dict[str, torch.Tensor] = {}
        for key in saved:
            stem, _, leaf = key.rpartition(".")
            # lora_A.weight -> lora_A.<slot>.weight; lora_embedding_A -> lora_embedding_A.<slot>
            for cand in (f"{stem}.{slot}.{leaf}", f"{key}.{slot}"):
                if cand in own:
                    out[key] = own[cand]
                    break
            else:
                return {}                   # a layout this copy does not know: PEFT's path only
        return out

    def _copy_into(self, slot: str, path: Path) -> bool:
        """Copy a version's tensors into a free slot; False (nothing changed) where they do not
        fit it exactly."""
        from safetensors.torch import load_file
        targets = self._tensors.get(slot)
        if not targets:
            return False
        try:
            saved = load_file(str(Path(path) / WEIGHTS))
        except (OSError, ValueError, RuntimeError):
            return False        # PEFT's path reads other file names and raises a clear error
        if saved.keys() != targets.keys() or any(
                saved[k].shape != targets[k].shape for k in saved):
            return False
        with torch.no_grad():
            for k, t in saved.items():
                targets[k].copy_(t)
        return True

    def status(self) -> dict[str, Any]:
        return {"slots": len(self.slot) + len(self.free), "free": len(self.free),
                "copied": self.copied, "peft_loads": self.peft_loads}
