"""What makes TRL's KTO step quick on a CPU. Consolidation (learn/consolidate.py) applies it to
its KTOTrainer when it trains without a GPU; on a GPU, TRL's own path is the fast one.

- **The LM head.** TRL's trainers ask the model for per-token log-probabilities through a fused
  LM head (`trl.trainer.utils.add_fused_lm_head`: `model(..., labels=..., fused_lm_head=True)`
  returns a `FusedCausalLMOutput`). Where Triton runs, it projects only the positions with a
  label; elsewhere it projects every position of the padded batch, prompt and padding included,
  and folds each [tokens, vocabulary] tile in a torch fallback that makes several passes over
  it. On this CPU that was about 45 % of a KTO step (a profile of SmolLM2-135M, 8 chat-shaped
  turns). `answer_lm_head` installs the same contract projecting only the answer positions,
  with one log-softmax: log_probs (with their gradient), entropy and mean_logits (for TRL's
  metrics), the loss and the label mask, equal to TRL's own to float32 rounding
  (tests/test_kto_cpu.py checks it against TRL's head). A model whose logits are scaled or
  soft-capped keeps TRL's head.
- **The frozen base's products in bfloat16** (clawrl.bf16), where the CPU multiplies bfloat16
  natively; the LoRA, the LM head and the loss stay float32. Off unless asked for (`products`;
  the recipe's `consolidate.cpu_products`). On three judged windows consolidated both ways
  (bench/consolidate_ab.py) it gave TRL's loss to three digits and adapters within 0.02 of
  float32's on 40 held-out prompts, 1.4x faster, but below float32's in all three (by 0.016
  on average), so float32 stays the default.

On 4 KTO steps of 8 chat-shaped turns (bench/consolidate.py's shape, alone on the 2 cores):
168.8 s in TRL's float32 path, 114.2 s with the answer head (1.48x), 70.5 s with bfloat16
products as well.
"""
from __future__ import annotations

import types

import torch

from ..bf16 import products_in
from ..models import bf16_supported

SCALED = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
          "logits_scaling")


def answer_lm_head(model) -> bool:
    """Over the fused LM head TRL installed on `model` (a transformers causal LM), one that
    projects only the labelled positions. False (TRL's head kept) for a model whose logits are
    scaled or soft-capped."""
    from trl.trainer.utils import FusedCausalLMOutput
    text_config = model.config.get_text_config()
    if any(getattr(text_config, name, None) is not None for name in SCALED):
        return False
    trl_forward = model.forward

    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None,
                num_items_in_batch=None, **kwargs):
        if not fused_lm_head or labels is None or shift_labels is not None:
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels,
                               shift_labels=shift_labels, num_items_in_batch=num_items_in_batch, **kwargs)
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state[:, :-1]
        labels = labels[:, 1:]
        mask = labels != -100
        head = self.get_output_embeddings()
        logits = torch.nn.functional.linear(hidden[mask], head.weight, head.bias).float()
        logp = torch.log_softmax(logits, dim=-1)
        token_logp = logp.gather(-1, labels[mask].unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            entropy = -(logp.exp() * logp).sum(-1)
            mean_logits = logits.mean(-1)

        def per_position(x: torch.Tensor) -> torch.Tensor:
            # masked_scatter keeps a batch with no label connected to the graph, as TRL's does
            return x.new_zeros(mask.shape).masked_scatter(mask, x)
        log_probs = per_position(token_logp)
        count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        return FusedCausalLMOutput(loss=-log_probs.sum() / count, log_probs=log_probs,
                                   entropy=per_position(entropy), log_sum_sq_probs=None,
                                   mean_logits=per_position(mean_logits), is_top1=None,
                                   label_mask=mask, aux_loss=None)

    model.forward = types.MethodType(forward, model)
    return True


def for_cpu(trainer, products: torch.dtype = torch.float32) -> dict:
    """The CPU speed-ups on a constructed KTOTrainer whose model is a PEFT model; what was done.
    `products`: the frozen base's product dtype (float32 unless asked; bfloat16 only where the
    CPU has it natively)."""
    peft_model = trainer.model
    base = peft_model.get_base_model()
    if products == torch.bfloat16 and not bf16_supported():
        products = torch.float32
    swapped = products_in(base, products, skip=("lm_head",)) if products != torch.float32 else 0
    return {"answer_lm_head": answer_lm_head(base), "products": str(products).removeprefix("torch."),
            "frozen_linears": swapped}
