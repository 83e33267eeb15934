"""The teacher scored by the serving engine's own server (sglang, vllm).

With a server engine the trainer does not load the base model itself: the server scores the
served tokens in the hinted context (the wire calls are engines/sglang.py's and engines/vllm.py's
`score`). The context is cut from the left to fit what the servers accept.
"""
from __future__ import annotations

import httpx

from ..config import Config
from ..engines import sglang, vllm
from ..engines.remote import CONTROL_TIMEOUT, server_url
from ..errors import ClawrlError

# Both servers refuse a scoring request that fills the context: SGLang input >= context_len
# (tokenizer_manager.py, _validate_one_request), vLLM a prompt of max_model_len
# (v1/engine/input_processor.py, _validate_prompt_len). So a hinted context leaves one position
# free (tests/test_server_contracts.py checks it against both servers' code).
SCORING_MARGIN = 1


class TeacherUnavailable(ClawrlError):
    """The server could not score a sample now; the trainer tries again later."""


def remote_teacher(cfg: Config):
    """A function (context ids, response ids, k) -> (logprobs, top-k or None) that has the
    engine's server score the served response with the base model, the context cut from the
    left to fit; None for in-process engines."""
    wire = {"sglang": sglang, "vllm": vllm}.get(cfg.engine.kind)
    if wire is None:
        return None
    score = wire.score
    url, client = server_url(cfg), httpx.Client(timeout=CONTROL_TIMEOUT)

    def teacher(context: list[int], response: list[int], k: int):
        room = max(1, cfg.model.context_length - len(response) - SCORING_MARGIN)
        try:
            return score(client, url, cfg, context[-room:], response, k)
        except httpx.HTTPError as e:
            raise TeacherUnavailable(f"the {cfg.engine.kind} server at {url} could not score: "
                                     f"{type(e).__name__}: {e}") from None
    return teacher
