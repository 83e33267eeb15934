"""GET /metrics against a real daemon: counters move by what was served, judged, trained, swapped."""
from __future__ import annotations

import json
import math
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from clawrl.metrics import Metrics
from conftest import Daemon, make_home

pytestmark = pytest.mark.model
CHAT = "/v1/chat/completions"


def scrape(url: str, headers: dict | None = None) -> dict:
    """Every sample as {(name, sorted labels): value}."""
    r = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_each_app_has_its_own_registry():
    a, b = Metrics(), Metrics()
    a.completion_tokens.inc(3)
    assert a.registry.get_sample_value("clawrl_completion_tokens_total") == 3
    assert b.registry.get_sample_value("clawrl_completion_tokens_total") == 0


def test_serving_moves_request_token_latency_and_turn_metrics(daemon):
    before = scrape(daemon.url)
    body = {"model": "m", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}]}
    r = httpx.post(f"{daemon.url}{CHAT}", json=body, timeout=120,
                   headers={"X-Turn-Type": "side", "X-Turn-Kind": "heartbeat"})
    assert r.status_code == 200, r.text
    usages = [r.json()["usage"]]

    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{daemon.url}{CHAT}", json=stream, timeout=120) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    usages.append(chunks[-1]["usage"])

    r = httpx.post(f"{daemon.url}{CHAT}", content=b'{"messages": [', timeout=30)
    assert r.status_code == 400
    after = scrape(daemon.url)

    def moved(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("clawrl_http_requests_total", endpoint=CHAT, status="200") == 2
    assert moved("clawrl_http_requests_total", endpoint=CHAT, status="400") == 1
    assert moved("clawrl_completion_tokens_total") == sum(u["completion_tokens"] for u in usages) > 0
    assert moved("clawrl_prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert moved("clawrl_time_to_first_token_seconds_count") == 2
    assert moved("clawrl_chat_completion_duration_seconds_count") == 2
    assert moved("clawrl_chat_completion_duration_seconds_sum") >= moved("clawrl_time_to_first_token_seconds_sum") > 0
    assert moved("clawrl_turns_total", turn_type="side", kind="heartbeat", status="complete") == 1
    assert moved("clawrl_turns_total", turn_type="main", kind="main", status="complete") == 1
    # The first scrape was answered before the second one counted it.
    assert moved("clawrl_http_requests_total", endpoint="/metrics", status="200") == 1
    assert value(after, "clawrl_adapter_active_version") == 0
    assert ("clawrl_samples_waiting", (("stage", "judge"),)) in after


def test_judge_training_and_swap_metrics_once_an_adapter_goes_live(tmp_path):
    key = {"Authorization": "Bearer sekret"}
    d = Daemon(make_home(tmp_path / "home"), env={
        "CLAWRL_SERVER_API_KEY": "sekret", "CLAWRL_TRAIN_ENABLED": "true",
        "CLAWRL_TRAIN_BATCH_SIZE": "1", "CLAWRL_TRAIN_POLL_S": "0.2"}).start()
    try:
        assert httpx.get(f"{d.url}/metrics", timeout=30).status_code == 401   # the key is required

        def chat(messages):
            r = httpx.post(f"{d.url}{CHAT}", headers={**key, "X-Session-Id": "metrics"}, timeout=120,
                           json={"model": "m", "max_tokens": 12, "temperature": 0, "messages": messages})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"]

        msgs = [{"role": "user", "content": "What is the capital of Italy?"}]
        text = chat(msgs)
        chat(msgs + [{"role": "assistant", "content": text},
                     {"role": "user", "content": "Thanks, that's great!"}])   # turn 1's next state: +1

        deadline = time.time() + 240
        while time.time() < deadline:
            m = scrape(d.url, key)
            if value(m, "clawrl_adapter_active_version") >= 1:
                break
            time.sleep(0.5)
        assert value(m, "clawrl_adapter_active_version") == 1, m
        assert value(m, "clawrl_judge_scores_total", score="1") == 1
        assert value(m, "clawrl_training_steps_total") == 1
        assert ("clawrl_training_last_loss", ()) in m
        assert math.isfinite(value(m, "clawrl_training_last_loss"))
        assert value(m, "clawrl_adapter_swap_latency_seconds_count") == 1
        assert value(m, "clawrl_adapter_swaps_total") == 1
        assert value(m, "clawrl_samples_waiting", stage="train") == 0
        assert value(m, "clawrl_http_requests_total", endpoint="/metrics", status="401") == 1
    finally:
        d.stop()
