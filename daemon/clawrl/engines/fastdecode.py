"""The embedded engine's decode step: one token per stream through a Llama-family model, with
the per-token Python and operator overhead of a general model class taken out.

At batch 1 a 135M model's decode is bound by two things on a CPU: the bytes of weights read per
token, and the number of small operations run on them. transformers' forward spends about a
third of a step outside its matrix products (masks, cache bookkeeping, hooks), and reads each
projection separately. This step reads the model's own weights packed once at load
(engines/packed.py): q, k and v as one matrix, gate and up as one, and (optionally) as int8 with a
scale per output row, which reads a quarter of float32's bytes. LoRA adapters are applied
unmerged, as PEFT computes them (base + B·A·x·scale), from the very tensors PEFT loaded, so a swap
costs nothing here and a version's weights are never copied.

Prefill stays on transformers: it is bound by arithmetic, not by bytes, and is already fast. The
KV caches are transformers' own (`DynamicCache`), so prefix reuse, copying and batching work on
them as before; a step writes its new position in place into spare room at the end of them
(`_Room`) rather than copying them whole, as transformers' own update does. What is exact: in
float32 weights, a step computes what transformers computes, up to the order of float additions
(tests/test_engine.py checks greedy tokens and logprobs against the general path). With int8
weights the logprobs are those of the int8 model; the trainer recomputes its own and corrects
for the difference (truncated importance sampling).
"""
from __future__ import annotations

import threading
import weakref

import torch
import torch.nn.functional as F

from .packed import (PARTS, STATIC_ROPE, Matrix, PackedLayer, PackedModel, base_of, int8_available,
                     merged_weight, rms_norm, rope_tables, rotate, supported)

__all__ = ["DECODE_WEIGHTS", "STATIC_ROPE", "FastDecoder", "int8_available", "supported"]

DECODE_WEIGHTS = ("float32", "bfloat16", "int8")


def _check_adapter(peft_model, name: str) -> None:
    """ValueError unless adapter `name` is plain LoRA on the layers' projections or the LM head."""
    cfg = peft_model.peft_config.get(name)
    if cfg is not None and getattr(cfg, "modules_to_save", None):
        raise ValueError(f"modules_to_save {cfg.modules_to_save} have no fast decode step")
    for path, m in peft_model.named_modules():
        if name not in getattr(m, "lora_A", {}) and name not in getattr(m, "lora_embedding_A", {}):
            continue
        last = path.rsplit(".", 1)[-1]
        if not (last in PARTS and ".layers." in path) and last != "lm_head":
            raise ValueError(f"LoRA on {path} has no fast decode step")
        if getattr(m, "use_dora", {}).get(name):
            raise ValueError("a DoRA adapter has no fast decode step")



class _Lora:
    """One adapter version's LoRA for one layer, packed like the layer: A's of q, k, v stacked and
    their B's block-diagonal, so q/k/v (and gate/up) take two small products each, not six."""

    def __init__(self, layer, name: str):
        at, mlp = layer.self_attn, layer.mlp
        self.qkv = self._pack([at.q_proj, at.k_proj, at.v_proj], name)
        self.o = self._pack([at.o_proj], name)
        self.gate_up = self._pack([mlp.gate_proj, mlp.up_proj], name)
        self.down = self._pack([mlp.down_proj], name)

    @staticmethod
    def _pack(modules, name: str):
        parts = []
        for m in modules:
            if name in getattr(m, "lora_A", {}):
                a, b = m.lora_A[name].weight.detach(), m.lora_B[name].weight.detach()
                parts.append((a.float(), b.float() * float(m.scaling[name])))
            else:
                w = base_of(m).weight
                parts.append((torch.zeros(0, w.shape[1]), torch.zeros(w.shape[0], 0)))
        if not any(a.shape[0] for a, _ in parts):
            return None
        a = torch.cat([a for a, _ in parts]).contiguous()
        b = torch.block_diag(*[b for _, b in parts]).contiguous()
        return a, b

    @staticmethod
    def apply(y: torch.Tensor, x: torch.Tensor, packed) -> torch.Tensor:
        if packed is None:
            return y
        a, b = packed
        return y + (x @ a.T) @ b.T


class _Room:
    """Spare room at the end of each layer's keys and values, so a decode step writes its one new
    position in place instead of copying the whole cache (transformers' `DynamicLayer.update`
    concatenates: at 13k tokens that copy was a quarter of a step).

    The layer still holds a plain tensor of its exact length (a view of the first `n` positions
    of a longer buffer), so everything else that reads or replaces it (prefill, crop, batching,
    copies of the prefix pool) works as before. Room is used only while the layer holds exactly
    the view this step handed out last; anything else (a crop, a new tensor from prefill or from
    a batch, another kind of layer) takes transformers' own update, and the next step makes new
    room. A write past the view's end never touches positions any other view can see: those
    views end at or before it."""

    def __init__(self):
        from transformers.cache_utils import DynamicLayer

        self._kind = DynamicLayer          # the one kind of layer whose update is a concatenation
        # layer -> (keys buffer, values buffer, length of the view handed out)
        self._rooms: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @staticmethod
    def _spare(n: int) -> int:
        return max(256, n // 8)

    def append(self, cache, i: int, k: torch.Tensor, v: torch.Tensor):
        layer = cache.layers[i] if getattr(cache, "layers", None) else None
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if type(layer) is not self._kind or not layer.is_initialized or keys is None or values is None \
                or not keys.numel() or keys.dtype != k.dtype or keys.shape[0] != k.shape[0]:
            return cache.update(k, v, i)
        n = keys.shape[-2]
        room = self._rooms.get(layer)
        if room is not None:
            kbuf, vbuf, handed = room
            ours = (n == handed < kbuf.shape[-2] and keys.data_ptr() == kbuf.data_ptr()
                    and values.data_ptr() == vbuf.data_ptr()
                    and keys.stride() == kbuf.stride() and values.stride() == vbuf.stride())
            if not ours:
                room = None
        if room is None:
            rows, heads, _, dim = keys.shape
            kbuf = keys.new_empty(rows, heads, n + 1 + self._spare(n), dim)
            vbuf = values.new_empty(rows, values.shape[1], n + 1 + self._spare(n), values.shape[-1])
            kbuf[:, :, :n].copy_(keys)
            vbuf[:, :, :n].copy_(values)
        kbuf[:, :, n:n + 1].copy_(k)
        vbuf[:, :, n:n + 1].copy_(v)
        layer.keys, layer.values = kbuf[:, :, :n + 1], vbuf[:, :, :n + 1]
        self._rooms[layer] = (kbuf, vbuf, n + 1)
        return layer.keys, layer.values


class FastDecoder(PackedModel):
    """The decode step over `model`'s own weights, packed once (see the module docstring): the
    packed layers of engines/packed.py, all of them, and the LM head.

    `weights` picks their storage for decode: float32 (exact), bfloat16, or int8 (a quarter of
    the bytes, one scale per output row, activations quantized per row at each step)."""

    def __init__(self, model, weights: str = "float32"):
        if weights not in DECODE_WEIGHTS:
            raise ValueError(f"decode weights {weights!r}: use one of {', '.join(DECODE_WEIGHTS)}")
        super().__init__(model, weights, rows=None)
        self.weights = weights
        with torch.no_grad():
            self.lm_head = Matrix(model.lm_head.weight, None, weights)
        self._lora: dict[str, list[_Lora]] = {}
        self._lock = threading.Lock()     # adapters come and go on the worker, merges land from theirs
        self._head_lora: dict[str, tuple | None] = {}
        self._merged: dict[str, tuple[list[PackedLayer], Matrix]] = {}
        self._room = _Room()              # in-place appends to the KV cache

    # -- adapters ---------------------------------------------------------------------------------
    def add_adapter(self, peft_model, name: str) -> None:
        """Read adapter `name`'s A and B from the layers PEFT loaded (no copy of base weights).
        ValueError for an adapter that changes anything else (embeddings, modules_to_save):
        PEFT's path serves those."""
        _check_adapter(peft_model, name)
        inner = peft_model.base_model.model
        with torch.no_grad():
            layers = [_Lora(layer, name) for layer in inner.model.layers]
            head = _Lora._pack([inner.lm_head], name)
        with self._lock:
            self._lora[name], self._head_lora[name] = layers, head

    def merge_adapter(self, peft_model, name: str) -> bool:
        """Pack the weights with adapter `name` merged in, so its steps cost what the base's do.
        Slow (seconds for int8): meant for a background thread while the unmerged adapter
        serves. Whether it was kept: an adapter dropped meanwhile is not, nor one whose name
        was given to another version meanwhile (its slot reused: the weights read may be mixed)."""
        inner = peft_model.base_model.model
        unmerged = self._lora.get(name)
        with torch.no_grad():
            merged = [PackedLayer(layer, self.weights, merge=name) for layer in inner.model.layers]
            head = self.lm_head if self._head_lora.get(name) is None else \
                Matrix(merged_weight(inner.lm_head, name), None, self.weights)
        with self._lock:
            if unmerged is None or self._lora.get(name) is not unmerged:
                return False
            self._merged[name] = (merged, head)
        return True

    def is_merged(self, name: str) -> bool:
        return name in self._merged

    def drop_adapter(self, name: str) -> None:
        with self._lock:
            self._lora.pop(name, None)
            self._head_lora.pop(name, None)
            self._merged.pop(name, None)

    def has_adapter(self, name: str) -> bool:
        return name in self._lora

    # -- the step -----------------------------------------------------------------------------------
    def _attend(self, q, keys, values, starts):
        """Each row's one new position attending over its keys; rows with left padding (`starts`)
        one at a time over their own keys, exactly as alone, so a stream's tokens never depend on
        the batch."""
        if starts is None:
            return self._attend_one(q, keys, values)
        return torch.cat([self._attend_one(q[r:r + 1], keys[r:r + 1, :, s:], values[r:r + 1, :, s:])
                          for r, s in enumerate(starts)])

    def _attend_one(self, q, keys, values):
        """Attention for one query position, in float32 whatever the cache holds: each key/value
        head's group of query heads as one [group, head_dim] x [head_dim, length] product, the
        softmax over it, then the values. On a CPU this is what SDPA computes, faster at batch 1:
        SDPA's kernels are built for query blocks, and in bfloat16 over a 13k-token cache it took
        7.5 ms a layer where this takes 1.2 (0.12 against 0.04 ms over 200 tokens; one layer of
        SmolLM2-135M on a 2-core Zen 4 EPYC). The cache's bfloat16 is widened on the way, so the
        scores and probabilities are float32 (SDPA's bfloat16 rounds its output to bfloat16)."""
        rows, group = q.shape[0], self.heads // self.kv_heads
        grouped = q.float().reshape(rows, self.kv_heads, group, self.head_dim) * self.head_dim ** -0.5
        scores = torch.matmul(grouped, keys.float().transpose(-1, -2))
        out = torch.matmul(scores.softmax(-1), values.float())
        return out.reshape(rows, self.heads, 1, self.head_dim)

    @torch.inference_mode()
    def step(self, tokens: list[int], positions: list[int] | torch.Tensor, cache,
             mask: torch.Tensor | None = None, adapter: str | None = None) -> torch.Tensor:
        """Feed one token per row at `positions`, appending to `cache` (a transformers cache whose
        rows hold each stream's keys and values, left-padded where `mask`, [rows, length + 1]
        with the new position last, is 0). Returns float32 logits, one row per stream."""
        rows = len(tokens)
        h, kvh, hd = self.heads, self.kv_heads, self.head_dim
        x = self.embed[torch.tensor(tokens)].float()
        cos, sin = (t[:, None, None, :] for t in
                    rope_tables(torch.as_tensor(positions).reshape(rows), self.inv_freq, self.rope_scale))
        # where each row's keys begin (left padding ends; `_attend`)
        starts = None if mask is None else (mask.shape[1] - mask.sum(dim=1)).tolist()
        merged = self._merged.get(adapter) if adapter else None
        lora = self._lora.get(adapter) if adapter and not merged else None
        layers, head = merged or (self.layers, self.lm_head)
        first_keys = getattr(cache.layers[0], "keys", None) if getattr(cache, "layers", None) else None
        # the prefill's, else float32
        kv_dtype = first_keys.dtype if first_keys is not None and first_keys.numel() else torch.float32
        for i, layer in enumerate(layers):
            ad = lora[i] if lora else None
            y = rms_norm(x, layer.norm1, self.eps)
            qkv = layer.qkv(y)
            if ad:
                qkv = _Lora.apply(qkv, y, ad.qkv)
            # q and k rotated in one pass: both are heads of hd at the same positions
            qk = rotate(qkv[:, :(h + kvh) * hd].view(rows, h + kvh, 1, hd), cos, sin)
            q, k = qk[:, :h], qk[:, h:]
            v = qkv[:, (h + kvh) * hd:].view(rows, kvh, 1, hd)
            keys, values = self._room.append(cache, i, k.to(kv_dtype), v.to(kv_dtype))
            att = self._attend(q, keys, values, starts).reshape(rows, h * hd)
            out = layer.o(att)
            if ad:
                out = _Lora.apply(out, att, ad.o)
            x = x + out
            y = rms_norm(x, layer.norm2, self.eps)
            gu = layer.gate_up(y)
            if ad:
                gu = _Lora.apply(gu, y, ad.gate_up)
            gate, up = gu.chunk(2, dim=-1)
            act = F.silu(gate) * up
            down = layer.down(act)
            if ad:
                down = _Lora.apply(down, act, ad.down)
            x = x + down
        y = rms_norm(x, self.norm, self.eps)
        logits = head(y)
        return _Lora.apply(logits, y, self._head_lora.get(adapter)) if adapter and lora else logits
