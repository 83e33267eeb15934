"""A tiny hand-built model that answers one of two fixed texts, for end-to-end tests.

`build_scripted_model(dest, tokenizer_dir, plain, marked, marker)` writes a Hugging Face
`LlamaForCausalLM` with SmolLM2's tokenizer. Given any chat prompt that ends in the generation
header (`<|im_start|>assistant\\n`) it writes `marked` if the token `marker` occurs anywhere in the
prompt and `plain` otherwise, then the end-of-turn token. No weight is trained: each is set by hand
so that the chosen token beats every other by a wide logit margin, and the daemon's temperature-1
sampling is as deterministic as greedy decoding.

How (one layer, two attention heads, the MLP zero):

* The answer is a state machine: next = f(previous token, current token, flag), the flag saying
  "a marker is in the context". A bigram machine (current token only) is not enough: SmolLM2's
  pre-tokenizer keeps "\\n", "_", ">" and most quotes in tokens of their own, so a tool call
  repeats tokens that are followed by different ones. Each text is spelled with tokens whose
  strings concatenate to it (longest first, not necessarily the tokenizer's own split), chosen by a
  depth-first search so that the machine below stays unambiguous.
* Residual stream: dim BIAS is 1 for every token; each token the machine uses has an identity dim
  (all other tokens share OTHER), so every embedding is two ones and the input RMSNorm makes each
  sqrt(d/2), which the projections divide by.
* Head 0, the flag: a constant query (from BIAS) and a key only on the marker, in the lowest
  frequency RoPE pair (rope_theta 1e7 turns it 1.7e-7 rad per token: position makes no difference
  over 32k tokens). The score is 40 at a marker and 0 elsewhere, so one marker among 16k tokens
  takes all the weight (16k * e^-40 ~ 0). Its value, 1 on the marker only, goes to dim FLAG.
* Head 1, the previous token: constant queries and keys in the other 31 RoPE pairs, the query
  turned back by one position's angle in each, so the score 10 * sum_i cos((p-j-1) w_i) peaks at
  j = p-1 and is >= 7 lower at p and p-2 and >= 24 lower everywhere else up to 32k tokens (weight
  on p-1 > 0.998). Its value writes the previous token's identity into a PREV dim of its own.
* The final RMSNorm scales the (0/1) features to equal values >= sqrt(d/4). The lm_head is linear
  in them: token t gets A for "t follows the current token somewhere in the texts" and A for "t
  comes two after the previous token somewhere". The right token has both; the search admits only
  spellings where no other token has both at any step, so the right one leads by >= A. The one place
  two answers share (previous, current) is the header itself, where the flag decides: the plain
  text's first token gets -D * flag, the marked one's +2D * flag - D (D = A/2), which costs any
  other step at most D. So every step wins by >= D times the norm scale, MARGIN at ideal features
  (`_check`); the tests measure real margins in float32 and bfloat16 over 12k-token prompts.
"""
from __future__ import annotations

import math
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import torch

HEAD_DIM = 64            # 32 RoPE pairs per head; head 1's value also holds one dim per PREV token
ROPE_THETA = 1e7
MAX_POSITIONS = 32768
MARKER_SCORE = 40.0      # head 0's attention score on a marker
PREV_SCORE = 10.0        # head 1's score per RoPE pair at the previous position
MARGIN = 50.0            # logit margin of every step at ideal features
BIAS, OTHER, FLAG = 0, 1, 2
MARKED_START = -1        # the header's last-but-one token when the flag is on (it decides there)


class _Machine:
    """Transitions (prev, cur) -> next of the texts spelled so far, checked to stay linear-readable:
    for each, no other token both follows `cur` somewhere and comes two after `prev` somewhere."""

    def __init__(self):
        self.next: dict[tuple[int, int], int] = {}
        self.count: Counter = Counter()
        self.succ: dict[int, Counter] = defaultdict(Counter)
        self.succ2: dict[int, Counter] = defaultdict(Counter)

    def fits(self, prev: int, cur: int, nxt: int) -> bool:
        if (prev, cur) in self.next:
            return self.next[(prev, cur)] == nxt
        if (set(self.succ[cur]) & set(self.succ2[prev])) - {nxt}:
            return False
        return not any(t != nxt and (c == cur or nxt in self.succ[c])
                       and (p == prev or nxt in self.succ2[p])
                       for (p, c), t in self.next.items())

    def add(self, prev: int, cur: int, nxt: int) -> None:
        self.next[(prev, cur)] = nxt
        self.count[(prev, cur)] += 1
        self.succ[cur][nxt] += 1
        self.succ2[prev][nxt] += 1

    def remove(self, prev: int, cur: int, nxt: int) -> None:
        self.count[(prev, cur)] -= 1
        if not self.count[(prev, cur)]:
            del self.next[(prev, cur)], self.count[(prev, cur)]
        for sets, key in ((self.succ, cur), (self.succ2, prev)):
            sets[key][nxt] -= 1
            if not sets[key][nxt]:
                del sets[key][nxt]


def _spell(text: str, head: tuple[int, int], end: int, pieces: dict[str, int], machine: _Machine,
           budget: int = 100_000) -> list[int] | None:
    """Tokens spelling `text` whose transitions, after the two `head` tokens and before `end`,
    fit `machine` (which keeps them). Depth-first, longest tokens first; None if there are none."""
    longest = max(map(len, pieces))
    seq = list(head)
    steps = 0

    def go(i: int) -> bool:
        nonlocal steps
        steps += 1
        if i == len(text):
            if machine.fits(seq[-2], seq[-1], end):
                machine.add(seq[-2], seq[-1], end)
                return True
            return False
        if steps > budget:
            return False
        for n in range(min(longest, len(text) - i), 0, -1):
            tid = pieces.get(text[i:i + n])
            if tid is None or not machine.fits(seq[-2], seq[-1], tid):
                continue
            machine.add(seq[-2], seq[-1], tid)
            seq.append(tid)
            if go(i + n):
                return True
            seq.pop()
            machine.remove(seq[-2], seq[-1], tid)
        return False

    return seq[2:] if go(0) else None


def _spell_both(plain, marked, pre, start, end, pieces):
    """Spell both texts into one machine, trying them in either order."""
    for first in (0, 1):
        machine, out = _Machine(), [None, None]
        for which in (first, 1 - first):
            text, prev = (plain, pre) if which == 0 else (marked, MARKED_START)
            out[which] = _spell(text, (prev, start), end, pieces, machine)
            if out[which] is None:
                break
        else:
            return out
    raise ValueError(f"cannot spell {plain!r} and {marked!r} so that a one-layer machine tells "
                     "every step apart (too many repeated tokens after the same tokens)")


def build_scripted_model(dest: Path, tokenizer_dir: Path, plain: str, marked: str,
                         marker: str) -> Path:
    """Write the model to `dest` (replacing it) and return `dest`. Raises ValueError if `marker` is
    not a single token or the texts cannot be scripted."""
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from clawrl.chat.format import render_prompt

    dest, tokenizer_dir = Path(dest), Path(tokenizer_dir)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    end = tok.eos_token_id
    header = render_prompt(tok, [{"role": "user", "content": "hi"}], None)
    pre, start = header[-2], header[-1]
    special = set(tok.added_tokens_decoder) | {end}

    mark = tok.encode(marker, add_special_tokens=False)
    if len(mark) != 1 or mark[0] in special | {pre, start}:
        raise ValueError(f"marker {marker!r} must be one ordinary token, not {mark}")
    (mark,) = mark
    if mark not in tok.encode(f"The word{marker} is here.", add_special_tokens=False):
        raise ValueError(f"marker {marker!r} is not its own token inside a sentence")

    pieces: dict[str, int] = {}
    for i in range(len(tok)):
        s = tok.decode([i], clean_up_tokenization_spaces=False)
        if i not in special and i != pre and s and "\ufffd" not in s:
            pieces.setdefault(s, i)
    chains = _spell_both(plain, marked, pre, start, end, pieces)

    # Every step: (prev, cur, flag on) -> next. The flag is on all through `marked` (the prompt
    # has a marker) and in `plain` from a marker it writes itself.
    steps = []
    for flag, chain in enumerate(chains):
        seq = [pre, start, *chain, end]
        for k in range(1, len(seq) - 1):
            steps.append((seq[k - 1], seq[k], int(flag or mark in seq[2:k + 1]), seq[k + 1]))
    listed = sorted({pre, start, mark} | {c for _, c, _, _ in steps})
    prevs = sorted({p for p, _, _, _ in steps})
    if len(prevs) > HEAD_DIM:
        raise ValueError(f"texts too long: {len(prevs)} distinct tokens, at most {HEAD_DIM}")
    ident = {t: 3 + i for i, t in enumerate(listed)}
    prev_dim = {p: 3 + len(listed) + i for i, p in enumerate(prevs)}
    d = -(-(3 + len(listed) + len(prevs)) // 8) * 8

    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=d, intermediate_size=1, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        bos_token_id=tok.bos_token_id, eos_token_id=end, pad_token_id=end)
    model = LlamaForCausalLM(cfg).float().eval()
    sd = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    for n in ("model.norm", "model.layers.0.input_layernorm",
              "model.layers.0.post_attention_layernorm"):
        sd[f"{n}.weight"].fill_(1.0)

    emb = sd["model.embed_tokens.weight"]
    emb[:, BIAS] = emb[:, OTHER] = 1.0
    for t, dim in ident.items():
        emb[t, OTHER], emb[t, dim] = 0.0, 1.0
    u = math.sqrt(d / 2)                       # every nonzero entry after the input norm
    half = HEAD_DIM // 2
    freq = ROPE_THETA ** (-torch.arange(half, dtype=torch.float64) / half)
    q, k, v, o = (sd[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkvo")
    # Head 0: FLAG <- "a marker is somewhere before".
    q[half - 1, BIAS] = k[half - 1, ident[mark]] = math.sqrt(MARKER_SCORE * HEAD_DIM ** 0.5) / u
    v[0, ident[mark]] = 1 / u
    o[FLAG, 0] = 1.0
    # Head 1: PREV dims <- the identity of the token one position back.
    h, scale = HEAD_DIM, PREV_SCORE * HEAD_DIM ** 0.5 / u
    for i in range(half - 1):
        k[h + i, BIAS] = 1 / u
        q[h + i, BIAS] = scale * math.cos(freq[i])
        q[h + half + i, BIAS] = -scale * math.sin(freq[i])
    for j, p in enumerate(prevs):
        v[h + j, ident[p]] = 1 / u
        o[prev_dim[p], h + j] = 1.0

    # lm_head: the state machine.
    lm = sd["lm_head.weight"]
    D = MARGIN / math.sqrt(d / 4)
    for prev, cur, _, nxt in set((p, c, 0, n) for p, c, _, n in steps):
        lm[nxt, ident[cur]] = lm[nxt, prev_dim[prev]] = 2 * D
    plain0, marked0 = (chain[0] if chain else end for chain in chains)
    lm[plain0, FLAG] -= D
    lm[marked0, FLAG] += 2 * D
    lm[marked0, BIAS] -= D
    _check(lm, steps, ident, prev_dim, d)

    model.load_state_dict(sd)
    if dest.exists():
        shutil.rmtree(dest)
    model.save_pretrained(dest)
    GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=end,
                     pad_token_id=end).save_pretrained(dest)
    for f in tokenizer_dir.iterdir():
        if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "chat_template",
                                              "vocab", "merges", "added_tokens")):
            shutil.copy(f, dest / f.name)
    return dest


def _check(lm: torch.Tensor, steps, ident, prev_dim, d) -> None:
    """Every step's token wins by >= MARGIN at ideal features (what the search guarantees)."""
    for prev, cur, flag, nxt in steps:
        x = torch.zeros(d)
        x[[BIAS, ident[cur], prev_dim[prev]]] = 1.0
        x[FLAG] = flag
        top = (lm @ (x / x.pow(2).mean().sqrt())).topk(2)
        if top.indices[0] != nxt or top.values[0] - top.values[1] < MARGIN * 0.999:
            raise ValueError(f"step ({prev}, {cur}, flag {flag}) -> {nxt} does not win clearly")
