"""Decode several streams in one forward pass by left-padding their KV caches into one batch.

Each request owns a KV cache of its own length. While the set of decoding requests stays the same,
their caches live joined in one padded batch cache that every step extends by one position per row;
the attention mask hides the padding and explicit position ids keep each row's RoPE positions its
own. When a request joins or leaves, the batch is split back into per-request caches (padding
stripped) and rebuilt. Joining costs one copy of the caches; a step costs one forward for all.
"""
from __future__ import annotations

import torch


def _layers(cache):
    return [(layer.keys, layer.values) for layer in cache.layers]


class DecodeBatch:
    def __init__(self, model_config):
        self.config = model_config
        self.members: list = []      # requests, in row order
        self.cache = None
        self.mask: torch.Tensor | None = None

    def matches(self, reqs: list) -> bool:
        return [id(r) for r in reqs] == [id(r) for r in self.members]

    def join(self, reqs: list) -> None:
        """Build the batch cache from the requests' own caches (they must hold their tokens)."""
        from transformers import DynamicCache

        lengths = [len(r.entry.ids) for r in reqs]
        longest = max(lengths)
        per_layer = list(zip(*(_layers(r.entry.cache) for r in reqs)))
        data = []
        for layer in per_layer:
            keys, values = [], []
            for (k, v), n in zip(layer, lengths):
                pad = longest - n
                keys.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
                values.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
            data.append((torch.cat(keys), torch.cat(values)))
        self.cache = DynamicCache(ddp_cache_data=data, config=self.config)
        self.mask = torch.zeros(len(reqs), longest, dtype=torch.long)
        for row, n in enumerate(lengths):
            self.mask[row, longest - n:] = 1
        self.members = list(reqs)
        for r in reqs:
            r.entry.cache = None     # the batch holds it now; split() gives it back

    def split(self) -> None:
        """Give every member its own cache again, padding stripped."""
        from transformers import DynamicCache

        if not self.members:
            return
        assert self.mask is not None     # join() made it with the members
        longest = self.mask.shape[1]
        for row, r in enumerate(self.members):
            start = longest - int(self.mask[row].sum())
            data = [(k[row:row + 1, :, start:].clone(), v[row:row + 1, :, start:].clone())
                    for k, v in _layers(self.cache)]
            r.entry.cache = DynamicCache(ddp_cache_data=data, config=self.config)
        self.members, self.cache, self.mask = [], None, None

    @torch.inference_mode()
    def step(self, model, tokens: list[int], extra: dict | None = None) -> torch.Tensor:
        """Feed one token per row; return the next-token logits, one row per member."""
        assert self.mask is not None     # a step follows join()
        positions = self.mask.sum(dim=1, keepdim=True)
        self.mask = torch.cat([self.mask, torch.ones(len(tokens), 1, dtype=torch.long)], dim=1)
        out = model(input_ids=torch.tensor(tokens).unsqueeze(1), attention_mask=self.mask,
                    position_ids=positions, cache=self.cache, use_cache=True, **(extra or {}))
        for r, t in zip(self.members, tokens):
            r.entry.ids.append(t)
        return out.logits[:, -1].float()

    def step_with(self, fast, tokens: list[int], adapter: str | None) -> torch.Tensor:
        """The same step through the fast decode step (engines/fastdecode.py), on `adapter`."""
        assert self.mask is not None     # a step follows join()
        positions = self.mask.sum(dim=1)
        self.mask = torch.cat([self.mask, torch.ones(len(tokens), 1, dtype=torch.long)], dim=1)
        logits = fast.step(tokens, positions, self.cache, self.mask, adapter)
        for r, t in zip(self.members, tokens):
            r.entry.ids.append(t)
        return logits
