"""Learning-loop benchmark: how fast feedback becomes served behaviour, and what training costs serving.

Each scenario runs a real `clawrl serve` (training on, CLAWRL_TRAIN_POLL_S=0.2) in a fresh
CLAWRL_HOME whose models/ links to the converted model cache. While it runs, a background probe
thread sends small requests continuously (max_tokens 2-4, X-Turn-Type: side so they are never
trained on; two non-streaming, then one streaming) so that "the first request served by an
adapter" is well defined (to within one probe interval). Scenarios:

  rules-b1   rules judge, train.batch_size 1
  rules-b4   rules judge, train.batch_size 4 (and part (d))
  engine-b1  engine judge (the served base model; judge.votes 1 by default), batch_size 1; a
             135M judge often gives a turn no signal (score 0, no hint: never trained), so this
             one goes on until 3 samples have been served (at most 8 conversations)

In each, a few two-turn conversations: turn 1 a short question (max_tokens 16); turn 2 the next
state, alternately "Thanks, that's great!" (+1) and "No, that's wrong. Answer in one short
sentence." (-1, with a hint); then wait (up to --timeout s) until the adapter trained on turn 1
serves a request, before the next conversation.

(a) Feedback-to-served latency per sample: from the arrival of the request that carries turn 1's
    next state (turns.next_state_at of turn 1) to the first request served by an adapter trained
    on turn 1 (the earliest created_at of a complete turn with adapter_version == v, where v is the
    first version whose meta.json "samples" holds turn 1's id). Broken down into judge
    (judged_at - next_state_at), train (adapter created_at - judged_at; with batch 4 this includes
    waiting for the batch to fill) and swap (first served - created_at). Median and max.
      rules judge, batch 1                                     target median <= 5 s
      rules judge, batch 4: the last sample of each batch, and all samples (no target)
      engine judge, batch 1                                    target median <= 15 s
(b) Swap latency for every version made in the run: meta created_at -> first request served on it
    (median, max), and the daemon's part of it: the swapper's "activated" event time - created_at
    (noticing the folder, the weight/loss check, loading it into the engine, and the canary where
    it runs before activation), from GET /v1/adapters events (polled, as it keeps the last 20).
(c) Requests failed during swaps: probe requests that did not get HTTP 200 (or whose stream did
    not end with [DONE]) out of all probe requests (>= 100 needed, spanning several swaps).
                                                               target 0 failed
(d) Decode tokens/s of one 48-token stream (temperature 0.7, fixed seed, probe paused) with the
    trainer idle, and again right after a 4-sample training step has started (rules-b4 scenario;
    both on the active adapter; the base model's rate before any adapter is shown for reference);
    the trainer's CPU time (/proc/<pid>/stat utime+stime) must grow during a "busy" measurement,
    and the cores it used then are reported. Rates and the ratio busy/idle.

The table goes to stdout, followed by one JSON line with every number; `--out FILE` also writes
that JSON to a file. Progress goes to stderr. The machine may be shared (a test run): the load
average and the CPU used by other processes during each scenario are reported. A full run takes
about 6-7 minutes on 2 cores (--quick about 2.5), most of it the engine judge's 256-token calls.

    .venv/bin/python bench/learn.py [--quick] [--out FILE] [--scenarios rules-b1,rules-b4,engine-b1]
                                    [--engine-votes N] [--probe-gap S] [--timeout S] [--keep]
"""
from __future__ import annotations

import os

# Keep OpenMP's spin-wait out of any torch this process might import (it imports none itself).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from clawrl.evals.child import DaemonChild

from common import emit  # noqa: E402  (bench/ is on sys.path)

REPO = Path(__file__).resolve().parents[1]
TARGETS = {"rules_b1_median_s": 5.0, "engine_b1_median_s": 15.0, "failed_requests": 0,
           "min_probe_requests": 100}
QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What color is the sky on a clear day?",
    "Name a fruit that is yellow.",
    "What is two plus three?",
    "Which planet is closest to the sun?",
    "What do bees make?",
    "How many days are in a week?",
    "What is frozen water called?",
    "Which animal says moo?",
    "What is the opposite of hot?",
    "How many wheels does a bicycle have?",
]
POSITIVE = "Thanks, that's great!"
NEGATIVE = "No, that's wrong. Answer in one short sentence."
PROBE_PROMPT = "Say hi."
DECODE_PROMPT = "Write a long story about a robot who learns to paint."
DECODE_TOKENS, DECODE_SEED = 48, 1234
T_START = time.perf_counter()


def say(msg: str) -> None:
    print(f"[learn {time.perf_counter() - T_START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def maximum(xs):
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def model_cache() -> Path:
    repo_cache = REPO / ".cache" / "models"
    return repo_cache if repo_cache.exists() else Path("~/.cache/clawrl-bench/models").expanduser()


# -- CPU accounting ------------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int | None) -> float | None:
    """utime + stime of one process in seconds; None if it is gone (or no /proc)."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / TICK
    except (OSError, ValueError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """pid and every process below it (the daemon and its trainer)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            rest = (p / "stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(rest[1]), []).append(int(p.name))
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        todo += children.get(q, [])
    return out


def machine_busy() -> float | None:
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / TICK   # all but idle and iowait
    except (OSError, ValueError):
        return None


class CpuWindow:
    """CPU used by the machine, this process and the daemon tree over a window; the rest is
    what other processes (e.g. a test run) took: the contention."""

    def __init__(self, daemon_pid: int):
        self.daemon_pid = daemon_pid
        self.t0 = time.time()
        self.busy0 = machine_busy()
        self.self0 = time.process_time()
        self.tree0 = {p: proc_cpu(p) or 0.0 for p in descendants(daemon_pid)}

    def close(self) -> dict:
        wall = time.time() - self.t0
        busy1 = machine_busy()
        tree1 = {p: proc_cpu(p) or 0.0 for p in descendants(self.daemon_pid)}
        tree = sum(v - self.tree0.get(p, 0.0) for p, v in tree1.items())
        own = time.process_time() - self.self0
        other = None
        if self.busy0 is not None and busy1 is not None and wall > 0:
            other = max(0.0, (busy1 - self.busy0 - own - tree) / wall)
        return {"wall_s": wall, "daemon_tree_cores": tree / wall if wall else None,
                "bench_cores": own / wall if wall else None, "other_cores": other}


# -- the daemon ----------------------------------------------------------------------------------

def make_home(path: Path, models: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    models.mkdir(parents=True, exist_ok=True)
    if not (path / "models").exists():
        (path / "models").symlink_to(models, target_is_directory=True)
    return path


class Daemon(DaemonChild):
    """A real `clawrl serve` process with training on; `db` is its turn log."""

    def __init__(self, home: Path, env: dict[str, str]):
        super().__init__(home, {"OMP_WAIT_POLICY": "PASSIVE", "CLAWRL_TRAIN_ENABLED": "true",
                                "CLAWRL_TRAIN_POLL_S": "0.2", **env})
        self.env.pop("CLAWRL_STORE_PATH", None)     # the turn log lives in the home

    @property
    def adapters(self) -> Path:
        return self.home / "adapters"

    def wait_trainer(self, timeout: float = 180) -> int:
        """Wait until the trainer child has loaded its model and watches the turn log."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            self._check_alive()
            if "clawrl-trainer: watching" in self.log_text():
                return httpx.get(f"{self.url}/v1/adapters", timeout=10).json()["trainer"]["pid"]
            time.sleep(0.3)
        raise RuntimeError(f"trainer not watching after {timeout:.0f} s")

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"daemon exited with status {self.proc.returncode}")

    def log_text(self, offset: int = 0) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_size(self) -> int:
        try:
            return self.log.stat().st_size
        except OSError:
            return 0

    def turn(self, turn_id: int) -> dict:
        return self.rows("SELECT * FROM turns WHERE id=?", turn_id)[0]

    def metas(self) -> dict[int, dict]:
        out = {}
        if self.adapters.exists():
            for p in self.adapters.iterdir():
                if p.name.isdigit() and (p / "meta.json").exists():
                    try:
                        out[int(p.name)] = json.loads((p / "meta.json").read_text())
                    except (OSError, ValueError):
                        pass   # being written: next time
        return out

    def rejection(self, version: int) -> str | None:
        p = self.adapters / f"{version:04d}" / "REJECTED"
        return p.read_text().strip() if p.exists() else None


# -- background threads ----------------------------------------------------------------------------

class Probe(threading.Thread):
    """Small side requests back to back (a short gap between), two plain then one streaming."""

    def __init__(self, url: str, tag: str, gap: float):
        super().__init__(name=f"probe-{tag}", daemon=True)
        self.url, self.tag, self.gap = url, tag, gap
        self.results: list[dict] = []
        self.halt = threading.Event()
        self.running = threading.Event()
        self.running.set()
        self.busy = threading.Lock()
        self.paused: list[list[float]] = []      # [from, to] wall-clock windows

    def pause(self) -> None:
        self.running.clear()
        with self.busy:          # the request in flight (if any) finishes first
            pass
        self.paused.append([time.time(), float("inf")])

    def resume(self) -> None:
        if self.paused and self.paused[-1][1] == float("inf"):
            self.paused[-1][1] = time.time()
        self.running.set()

    def stop(self) -> None:
        self.halt.set()
        self.running.set()
        self.join(timeout=70)

    def run(self) -> None:
        i = 0
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.halt.is_set():
                if not self.running.wait(0.1):
                    continue
                with self.busy:
                    if not self.running.is_set() or self.halt.is_set():
                        continue
                    self.results.append(self.one(client, i))
                i += 1
                self.halt.wait(self.gap)

    def one(self, client: httpx.Client, i: int) -> dict:
        stream = i % 3 == 2
        body = {"model": "clawrl", "messages": [{"role": "user", "content": PROBE_PROMPT}],
                "max_tokens": 2 + i % 3, "temperature": 0, "stream": stream}
        headers = {"X-Turn-Type": "side", "X-Session-Id": f"probe-{self.tag}"}
        rec = {"i": i, "stream": stream, "start": time.time(), "status": None, "turn_id": None,
               "ok": False, "error": None}
        try:
            if stream:
                with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                    rec["status"] = r.status_code
                    rec["turn_id"] = int(r.headers.get("x-clawrl-turn-id") or 0) or None
                    done = False
                    for line in r.iter_lines():
                        if line == "data: [DONE]":
                            done = True
                        elif line.startswith("data: ") and '"error"' in line[:20]:
                            rec["error"] = line[6:300]
                    if r.status_code != 200:
                        rec["error"] = rec["error"] or f"HTTP {r.status_code}"
                    elif not done and rec["error"] is None:
                        rec["error"] = "stream ended without [DONE]"
                    rec["ok"] = r.status_code == 200 and done and rec["error"] is None
            else:
                r = client.post("/v1/chat/completions", json=body, headers=headers)
                rec["status"] = r.status_code
                rec["turn_id"] = int(r.headers.get("x-clawrl-turn-id") or 0) or None
                rec["ok"] = r.status_code == 200 and bool(r.json().get("choices"))
                if not rec["ok"]:
                    rec["error"] = r.text[:300]
        except (httpx.HTTPError, ValueError) as e:
            rec["error"] = repr(e)[:300]
        rec["end"] = time.time()
        return rec


class Monitor(threading.Thread):
    """Polls GET /v1/adapters: keeps every swapper event (the endpoint shows the last 20) and the
    trainer's pid and state."""

    def __init__(self, url: str, period: float = 0.25):
        super().__init__(name="monitor", daemon=True)
        self.url, self.period = url, period
        self.events: dict[tuple, dict] = {}
        self.trainer: dict = {}
        self.errors = 0
        self.halt = threading.Event()

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=15)
        self.poll_once()

    def poll_once(self) -> None:
        try:
            info = httpx.get(f"{self.url}/v1/adapters", timeout=10).json()
        except (httpx.HTTPError, ValueError):
            self.errors += 1
            return
        for e in info.get("events", []):
            self.events[(e["version"], e["event"], e["at"])] = e
        self.trainer = info.get("trainer") or {}

    def run(self) -> None:
        while not self.halt.is_set():
            self.poll_once()
            self.halt.wait(self.period)

    def activated_at(self, version: int) -> float | None:
        ts = [e["at"] for (v, ev, _), e in self.events.items() if v == version and ev == "activated"]
        return min(ts) if ts else None


# -- client side of the conversations ---------------------------------------------------------------

def chat(client: httpx.Client, session: str, messages: list[dict], max_tokens: int,
         seed: int | None = None) -> tuple[int, str]:
    body = {"model": "clawrl", "messages": messages, "max_tokens": max_tokens, "temperature": 0.7}
    if seed is not None:
        body["seed"] = seed
    r = client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": session})
    if r.status_code != 200:
        raise RuntimeError(f"chat answered {r.status_code}: {r.text[:300]}")
    return int(r.headers["x-clawrl-turn-id"]), r.json()["choices"][0]["message"]["content"] or ""


def conversation(client: httpx.Client, tag: str, i: int) -> dict:
    """Turn 1 (a short question), then the next state (+1 thanks or -1 correction)."""
    session = f"learn-{tag}-{i}-{uuid.uuid4().hex[:8]}"
    question = QUESTIONS[i % len(QUESTIONS)]
    positive = i % 2 == 0
    msgs = [{"role": "user", "content": question}]
    turn1, reply = chat(client, session, msgs, 16, seed=100 + i)
    feedback = POSITIVE if positive else NEGATIVE
    sent = time.time()
    msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": feedback}]
    turn2, _ = chat(client, session, msgs, 8, seed=200 + i)
    return {"i": i, "session": session, "turn1": turn1, "turn2": turn2, "positive": positive,
            "question": question, "reply": reply, "feedback": feedback, "sent_at": sent}


def version_of(d: Daemon, turn_id: int) -> int | None:
    """The first version whose meta.json lists the turn among its samples."""
    found = [v for v, m in d.metas().items() if turn_id in m.get("samples", [])]
    return min(found) if found else None


def first_served(d: Daemon, version: int) -> dict | None:
    rows = d.rows("SELECT id, created_at, turn_type FROM turns WHERE adapter_version=?"
                  " AND status='complete' ORDER BY created_at LIMIT 1", version)
    return rows[0] if rows else None


def wait_judged(d: Daemon, turn_id: int, timeout: float) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        row = d.turn(turn_id)
        if row["judge_status"] is not None:
            return row["judge_status"]
        time.sleep(0.05)
    return "timeout"


def wait_served(d: Daemon, turn_id: int, timeout: float) -> dict:
    """Until a request has been served by the adapter trained on `turn_id`, or a reason why
    none will be (no signal to learn from, judge failed, adapter rejected), or the timeout."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        row = d.turn(turn_id)
        if row["train_status"] == "skipped":
            return {"status": "no_signal", "version": None}
        if row["judge_status"] == "failed":
            return {"status": "judge_failed", "version": None}
        v = version_of(d, turn_id)
        if v is not None:
            reason = d.rejection(v)
            if reason:
                return {"status": "rejected", "version": v, "reason": reason}
            if first_served(d, v):
                return {"status": "served", "version": v}
        time.sleep(0.1)
    return {"status": "timeout", "version": version_of(d, turn_id)}


# -- (d) decode while the trainer is busy -----------------------------------------------------------

def decode_stream(client: httpx.Client) -> dict:
    body = {"model": "clawrl", "messages": [{"role": "user", "content": DECODE_PROMPT}],
            "max_tokens": DECODE_TOKENS, "temperature": 0.7, "seed": DECODE_SEED, "stream": True,
            "stream_options": {"include_usage": True}}
    headers = {"X-Turn-Type": "side", "X-Session-Id": f"decode-{uuid.uuid4().hex[:8]}"}
    start, stamps, parts, usage = time.time(), [], [], {}
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"decode stream answered {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"decode stream error: {chunk['error']}")
            for ch in chunk.get("choices", []):
                piece = ch.get("delta", {}).get("content") or ""
                if piece:
                    stamps.append(time.time())
                    parts.append(piece)
            usage = chunk.get("usage") or usage
    end = time.time()
    tokens = usage.get("completion_tokens", len(stamps))
    decode = (tokens - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else None
    return {"tokens": tokens, "wall_s": end - start, "tok_s": tokens / (end - start),
            "decode_tok_s": decode, "ttft_s": stamps[0] - start if stamps else None,
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "text": "".join(parts)}


def measured_stream(client: httpx.Client, trainer_pid: int) -> dict:
    c0, t0 = proc_cpu(trainer_pid), time.time()
    s = decode_stream(client)
    c1, t1 = proc_cpu(trainer_pid), time.time()
    s["trainer_cpu_s"] = (c1 - c0) if c0 is not None and c1 is not None else None
    s["trainer_cores"] = s["trainer_cpu_s"] / (t1 - t0) if s["trainer_cpu_s"] is not None else None
    return s


def step_finished(text: str) -> bool:
    return bool(re.search(r"clawrl-trainer: (version \d+:|step abandoned)", text))


def measure_base(client: httpx.Client, trainer_pid: int, reps: int) -> list[dict]:
    """The same stream before any adapter exists (base model, trainer idle): what serving an
    unmerged LoRA costs, next to the idle/busy numbers below (which run on an adapter)."""
    decode_stream(client)   # untimed warm-up (prefix cache)
    return [measured_stream(client, trainer_pid) for _ in range(reps)]


def measure_decode(d: Daemon, client: httpx.Client, probe: Probe, monitor: Monitor,
                   reps: int, timeout: float) -> tuple[dict, list[dict]]:
    """Idle then busy decode rates (probe paused); returns the numbers and the trigger samples."""
    probe.pause()
    trainer_pid = monitor.trainer.get("pid")
    try:
        say(f"(d) idle: {reps} x {DECODE_TOKENS}-token stream (trainer pid {trainer_pid})")
        decode_stream(client)   # untimed: warms the prefix cache for this prompt on both sides
        idle = [measured_stream(client, trainer_pid) for _ in range(reps)]
        say("(d) idle " + ", ".join(f"{s['decode_tok_s']:.1f}" for s in idle) + " tok/s; "
            "triggering a 4-sample training step")
        offset = d.log_size()
        triggers = [conversation(client, "busy", 20 + k) for k in range(4)]
        deadline, started = time.time() + timeout, False
        while time.time() < deadline:
            if "clawrl-trainer: training step on" in d.log_text(offset):
                started = True
                break
            time.sleep(0.02)
        busy = []
        if started:
            t_step = time.time()
            for _ in range(reps):
                busy.append(measured_stream(client, trainer_pid))
                busy[-1]["after_step_start_s"] = time.time() - t_step
                busy[-1]["step_done_at_end"] = step_finished(d.log_text(offset))
                if busy[-1]["step_done_at_end"]:
                    break
        say("(d) busy " + ", ".join(f"{s['decode_tok_s']:.1f} tok/s (trainer {s['trainer_cores']:.2f}"
                                     " cores)" for s in busy))
    finally:
        probe.resume()
    # Busy: the trainer's CPU time grew during the stream and its step was still running at the
    # end of it; failing any such run, those where the CPU time grew at all.
    grew = [s for s in busy if (s["trainer_cpu_s"] or 0) > 0.05]
    valid = [s for s in grew if not s["step_done_at_end"]] or grew
    idle_rate = median([s["decode_tok_s"] for s in idle])
    busy_rate = median([s["decode_tok_s"] for s in valid])
    out = {"reps": reps, "tokens": DECODE_TOKENS, "seed": DECODE_SEED, "trainer_pid": trainer_pid,
           "step_started": started, "step_seconds": None,   # from the version's meta, later
           "idle": idle, "busy": busy, "busy_valid": len(valid),
           "idle_tok_s": idle_rate, "busy_tok_s": busy_rate,
           "ratio_busy_over_idle": busy_rate / idle_rate if busy_rate and idle_rate else None,
           "idle_trainer_cores": median([s["trainer_cores"] for s in idle]),
           "busy_trainer_cores": median([s["trainer_cores"] for s in valid]),
           "same_text": bool(idle and valid) and all(s["text"] == idle[0]["text"]
                                                      for s in idle + valid)}
    return out, triggers


# -- one scenario ---------------------------------------------------------------------------------

def run_scenario(name: str, env: dict[str, str], n_conv: int, batch: int, args, work: Path,
                 decode: bool, max_conv: int | None = None) -> dict:
    """n_conv conversations; with max_conv, go on (up to max_conv) until n_conv samples have been
    served: a model judge may give a turn no signal (score 0, no hint), so it is never trained."""
    home = make_home(work / name, model_cache())
    d = Daemon(home, {**env, "CLAWRL_TRAIN_BATCH_SIZE": str(batch)})
    probe = monitor = None
    convs, waits, triggers, decode_res, cpu = [], {}, [], None, None
    try:
        say(f"[{name}] starting clawrl serve on port {d.port} (home {home})")
        d.start()
        pid = d.wait_trainer()
        say(f"[{name}] ready; trainer pid {pid} watching")
        window = CpuWindow(d.proc.pid)
        base = None
        if decode:
            say(f"[{name}] (d) base model, trainer idle: {args.decode_reps} x {DECODE_TOKENS}-token"
                " stream")
            with httpx.Client(base_url=d.url, timeout=180) as client:
                base = measure_base(client, pid, args.decode_reps)
            say(f"[{name}] (d) base " + ", ".join(f"{s['decode_tok_s']:.1f}" for s in base) + " tok/s")
        monitor = Monitor(d.url)
        monitor.start()
        probe = Probe(d.url, name, args.probe_gap)
        probe.start()
        time.sleep(1.0)
        with httpx.Client(base_url=d.url, timeout=180) as client:
            i = served = 0
            of = f"/{n_conv}" if max_conv is None else f" (until {n_conv} served, at most {max_conv})"
            while (i < n_conv) if max_conv is None else (served < n_conv and i < max_conv):
                i += 1
                c = conversation(client, name, i - 1)
                convs.append(c)
                if i % batch:
                    st = wait_judged(d, c["turn1"], args.timeout)
                    say(f"[{name}] conversation {i}{of} ({'+' if c['positive'] else '-'}):"
                        f" turn {c['turn1']} judged ({st}); batch not full yet")
                    continue
                w = wait_served(d, c["turn1"], args.timeout)
                waits[c["turn1"]] = w
                served += w["status"] == "served"
                say(f"[{name}] conversation {i}{of} ({'+' if c['positive'] else '-'}):"
                    f" turn {c['turn1']} -> {w['status']}"
                    + (f" (version {w['version']})" if w.get("version") else ""))
            if decode:
                decode_res, triggers = measure_decode(d, client, probe, monitor, args.decode_reps,
                                                      args.timeout)
                decode_res["base_idle"] = base
                decode_res["base_idle_tok_s"] = median([s["decode_tok_s"] for s in base])
                w = wait_served(d, triggers[-1]["turn1"], args.timeout)
                waits[triggers[-1]["turn1"]] = w
                if w.get("version"):
                    decode_res["step_seconds"] = d.metas().get(w["version"], {}).get("seconds")
                say(f"[{name}] (d) trigger batch -> {w['status']}")
        time.sleep(0.5)
        probe.stop()
        monitor.stop()
        cpu = window.close()
    except BaseException:
        print(f"--- {name}: daemon log (tail) ---\n" + "\n".join(d.log_text().splitlines()[-40:]),
              file=sys.stderr)
        raise
    finally:
        if probe is not None and probe.is_alive():
            probe.stop()
        if monitor is not None and monitor.is_alive():
            monitor.stop()
        d.stop()
    return analyse(name, d, env, batch, convs, triggers, waits, probe, monitor, decode_res, cpu)


def analyse(name, d: Daemon, env, batch, convs, triggers, waits, probe: Probe, monitor: Monitor,
            decode_res, cpu) -> dict:
    metas = d.metas()
    # (a) per sample
    samples = []
    for phase, group in (("main", convs), ("decode-trigger", triggers)):
        for k, c in enumerate(group):
            row = d.turn(c["turn1"])
            v = version_of(d, c["turn1"])
            meta = metas.get(v, {}) if v else {}
            served = first_served(d, v) if v and not d.rejection(v) else None
            ns, ja = row["next_state_at"], row["judged_at"]
            created = meta.get("created_at")
            fs = served["created_at"] if served else None
            last = (k + 1) % batch == 0
            status = "served" if fs else waits.get(c["turn1"], {}).get("status") or (
                "rejected" if v and d.rejection(v) else row["train_status"] or "pending")
            samples.append({
                "phase": phase, "i": c["i"], "turn": c["turn1"], "positive": c["positive"],
                "judge_score": row["judge_score"], "judge_votes": row["judge_votes"],
                "hint": row["judge_hint"], "judge_status": row["judge_status"],
                "train_status": row["train_status"], "version": v, "status": status,
                "last_of_batch": last, "sent_at": c["sent_at"], "next_state_at": ns,
                "judged_at": ja, "adapter_created_at": created, "first_served_at": fs,
                "first_served_turn": served["id"] if served else None,
                "first_served_type": served["turn_type"] if served else None,
                "latency_s": fs - ns if fs and ns else None,
                "judge_s": ja - ns if ja and ns else None,
                "train_s": created - ja if created and ja else None,
                "swap_s": fs - created if fs and created else None,
                "step_seconds": meta.get("seconds"),
            })
    main = [s for s in samples if s["phase"] == "main"]
    lat_all = [s["latency_s"] for s in main]
    lat_last = [s["latency_s"] for s in main if s["last_of_batch"]]
    # (b) per version
    paused = probe.paused if probe else []
    versions = []
    for v in sorted(metas):
        created = metas[v].get("created_at")
        served = first_served(d, v) if not d.rejection(v) else None
        act = monitor.activated_at(v) if monitor else None
        in_pause = any(a <= (created or 0) <= b for a, b in paused)
        versions.append({
            "version": v, "samples": metas[v].get("samples"), "created_at": created,
            "step_seconds": metas[v].get("seconds"), "loss": metas[v].get("loss"),
            "rejected": d.rejection(v), "activated_at": act,
            "first_served_at": served["created_at"] if served else None,
            "swap_s": served["created_at"] - created if served and created else None,
            "daemon_s": act - created if act and created else None,
            "probe_paused": in_pause})
    # (c) probes
    res = probe.results if probe else []
    activations = sorted(e["at"] for e in (monitor.events.values() if monitor else [])
                         if e["event"] == "activated")
    p_start = res[0]["start"] if res else 0
    p_end = res[-1]["end"] if res else 0
    swaps_in = [a for a in activations if p_start <= a <= p_end]
    across = sum(1 for r in res if any(r["start"] <= a <= r["end"] for a in activations))
    near = sum(1 for r in res if any(r["start"] - 1.0 <= a <= r["end"] + 1.0 for a in activations))
    probe_ids = {r["turn_id"] for r in res if r["turn_id"]}
    trained_ids = {i for m in metas.values() for i in m.get("samples", [])}
    return {
        "name": name, "env": env, "batch_size": batch, "samples": samples,
        "latency_median_s": median(lat_all), "latency_max_s": maximum(lat_all),
        "latency_last_median_s": median(lat_last), "latency_last_max_s": maximum(lat_last),
        "judge_median_s": median([s["judge_s"] for s in main]),
        "train_median_s": median([s["train_s"] for s in main]),
        "swap_median_s": median([s["swap_s"] for s in main]),
        "n_samples": len(main), "n_served": sum(s["status"] == "served" for s in main),
        "judge_agrees": sum(s["judge_score"] == (1 if s["positive"] else -1) for s in main),
        "judge_no_vote": sum(all(v is None for v in json.loads(s["judge_votes"] or "[null]"))
                             for s in main),
        "statuses": {st: sum(s["status"] == st for s in main) for st in {s["status"] for s in main}},
        "versions": versions,
        "probe": {
            "total": len(res), "non_200": sum(r["status"] != 200 for r in res),
            "failed": sum(not r["ok"] for r in res), "streaming": sum(r["stream"] for r in res),
            "errors": [f"{r['status']}: {r['error']}" for r in res if not r["ok"]][:10],
            "swaps_during": len(swaps_in), "in_flight_at_a_swap": across,
            "within_1s_of_a_swap": near,
            "duration_ms_median": median([(r["end"] - r["start"]) * 1e3 for r in res]),
            "duty_cycle": (sum(r["end"] - r["start"] for r in res) / (p_end - p_start)
                           if p_end > p_start else None),
            "probe_turns_trained": len(probe_ids & trained_ids),
            "duration_ms_p90": (statistics.quantiles([(r["end"] - r["start"]) * 1e3 for r in res],
                                                     n=10)[-1] if len(res) > 1 else None),
            "duration_ms_max": maximum([(r["end"] - r["start"]) * 1e3 for r in res]),
            "paused": [[a, b] for a, b in paused],
            "status_counts": {str(k): sum(r["status"] == k for r in res)
                              for k in {r["status"] for r in res}},
            "turn_ids": [r["turn_id"] for r in res],
            "failures": [{"i": r["i"], "stream": r["stream"], "status": r["status"],
                          "turn_id": r["turn_id"], "at": r["start"], "error": r["error"]}
                         for r in res if not r["ok"]]},
        "decode": decode_res, "cpu": cpu,
        "trainer": monitor.trainer if monitor else None,
        "swap_events": sorted(monitor.events.values(), key=lambda e: e["at"]) if monitor else [],
    }


# -- report -----------------------------------------------------------------------------------------

def fmt(x, spec=".2f", none="-") -> str:
    return none if x is None else format(x, spec)


def verdict(value, target) -> str:
    if value is None:
        return "n/a"
    return "PASS" if value <= target else "FAIL"


def print_table(res: dict) -> None:
    m = res["meta"]
    g = m.get("git") or {}
    print(f"clawrl learning-loop bench — {m['cpus']} CPUs, {m['wall_s']:.0f} s"
          + (" (--quick)" if m["quick"] else "") + f"; daemon at {g.get('head')}"
          + (f" + uncommitted {', '.join(g['dirty'])}" if g.get("dirty") else ""))
    print(f"  load avg {m['loadavg_start']:.2f} at start, {m['loadavg_end']:.2f} at end; other "
          "processes used " + ", ".join(f"{s['name']} {fmt(s['cpu'] and s['cpu']['other_cores'])}"
                                       for s in res["scenarios"]) + " cores on average")
    others = [(s["cpu"] or {}).get("other_cores") for s in res["scenarios"]]
    if any(o is not None and o > 0.25 for o in others) or (
            any(o is None for o in others) and m["loadavg_start"] > 0.5):
        print("  note: the machine was busy with other work: numbers are contended")
    print(f"  probe: side requests, max_tokens 2-4, {m['probe_gap_s']} s gap; judge votes of the "
          f"engine scenario: {m['engine_votes']}; train poll 0.2 s; timeout {m['timeout_s']:.0f} s")
    print()
    print("(a) feedback-to-served latency (next state arrives -> first request served by an adapter "
          "trained on it)")
    hdr = (f"    {'scenario':<11}{'#':>3} {'turn':>5} {'fb':>3} {'score':>6} {'ver':>4} "
           f"{'judge s':>8}{'train s':>8}{'swap s':>8}{'total s':>9}  status")
    print(hdr)
    for s in res["scenarios"]:
        for x in s["samples"]:
            tag = s["name"] + ("*" if x["phase"] != "main" else "")
            last = "L" if s["batch_size"] > 1 and x["last_of_batch"] else " "
            print(f"    {tag:<11}{x['i']:>3} {x['turn']:>5} {'+1' if x['positive'] else '-1':>3} "
                  f"{fmt(x['judge_score'], '+.0f'):>6} {fmt(x['version'], 'd'):>4} "
                  f"{fmt(x['judge_s']):>8}{fmt(x['train_s']):>8}{fmt(x['swap_s']):>8}"
                  f"{fmt(x['latency_s']):>9}{last} {x['status']}")
    print("    (* = the (d) trigger batch, probe paused while it trained: not in the statistics;"
          " L = last sample of its batch)")
    print()
    print(f"    {'scenario':<34}{'median s':>9}{'max s':>8}  {'served':>7}  target")
    for s in res["scenarios"]:
        n = f"{s['n_served']}/{s['n_samples']}"
        if s["name"] == "rules-b4":
            print(f"    {'rules judge, batch 4, last of batch':<34}{fmt(s['latency_last_median_s']):>9}"
                  f"{fmt(s['latency_last_max_s']):>8}  {'':>7}")
            print(f"    {'rules judge, batch 4, all samples':<34}{fmt(s['latency_median_s']):>9}"
                  f"{fmt(s['latency_max_s']):>8}  {n:>7}")
            continue
        label, target = {"rules-b1": ("rules judge, batch 1", TARGETS["rules_b1_median_s"]),
                         "engine-b1": (f"engine judge ({m['engine_votes']} vote), batch 1",
                                       TARGETS["engine_b1_median_s"])}[s["name"]]
        if s["latency_median_s"] is None and (s["judge_median_s"] or 0) > target:
            ok = "FAIL: the judge alone takes longer (median)"
        else:
            ok = (f"{verdict(s['latency_median_s'], target)} (max "
                  f"{verdict(s['latency_max_s'], target)})")
        print(f"    {label:<34}{fmt(s['latency_median_s']):>9}{fmt(s['latency_max_s']):>8}  {n:>7}"
              f"  median <= {target:.0f} s {ok}")
        print(f"    {'':<34}parts (median): judge {fmt(s['judge_median_s'])}, train "
              f"{fmt(s['train_median_s'])}, swap {fmt(s['swap_median_s'])} s")
        if s["statuses"].get("no_signal"):
            print(f"    {'':<34}{s['statuses']['no_signal']} sample(s) had no signal (judge score 0,"
                  " no hint): never trained, by design")
        if s["name"] == "engine-b1":
            print(f"    {'':<34}the judge's score matched the feedback's sign in {s['judge_agrees']}/"
                  f"{s['n_samples']}; no valid vote in {s['judge_no_vote']}/{s['n_samples']}")
    print()
    b = res["swap"]
    print(f"(b) swap latency over {b['n']} versions (meta created_at -> first request served on it)")
    print(f"    {'created -> first served (s)':<34}{fmt(b['median_s'], '.3f'):>9}{fmt(b['max_s'], '.3f'):>8}"
          "   median, max")
    print(f"    {'daemon part: created -> activated':<34}{fmt(b['daemon_median_s'], '.3f'):>9}"
          f"{fmt(b['daemon_max_s'], '.3f'):>8}   (notice + check + load, before it serves)")
    print(f"    {'training step (meta seconds)':<34}{fmt(b['step_median_s'], '.2f'):>9}"
          f"{fmt(b['step_max_s'], '.2f'):>8}")
    if b["excluded"]:
        print(f"    {b['excluded']} version(s) made while the probe was paused are left out")
    if b["rejected"]:
        print(f"    rejected versions: {b['rejected']}")
    print()
    c = res["probes"]
    print(f"(c) probe requests during swaps: {c['failed']} failed (non-200: {c['non_200']}) of "
          f"{c['total']} ({c['streaming']} streaming), {c['swaps']} swaps while probing, "
          f"{c['in_flight']} probes in flight at a swap instant")
    print(f"    target 0 failed with >= {TARGETS['min_probe_requests']} requests: "
          f"{'PASS' if c['failed'] == 0 and c['total'] >= TARGETS['min_probe_requests'] else 'FAIL'}"
          f"; median probe {fmt(c['duration_ms_median'], '.0f')} ms, a probe in flight "
          f"{fmt(c['duty_cycle'] and c['duty_cycle'] * 100, '.0f')}% of the time; probe turns "
          f"trained: {c['probe_turns_trained']}")
    for e in c["errors"]:
        print(f"    error: {e}")
    print()
    dd = res.get("decode")
    if dd:
        print(f"(d) decode of a {dd['tokens']}-token stream (temperature 0.7, seed {dd['seed']}, probe "
              f"paused), tokens/s from first to last token")
        if dd.get("base_idle"):
            print(f"    {'base model (no adapter yet), idle':<34}{fmt(dd['base_idle_tok_s'], '.1f'):>9}"
                  f"   ({', '.join(fmt(s['decode_tok_s'], '.1f') for s in dd['base_idle'])}; before"
                  " the probe starts)")
        print(f"    {'adapter active, trainer idle':<34}{fmt(dd['idle_tok_s'], '.1f'):>9}   trainer used "
              f"{fmt(dd['idle_trainer_cores'], '.2f')} cores "
              f"({', '.join(fmt(s['decode_tok_s'], '.1f') for s in dd['idle'])})")
        print(f"    {'adapter active, trainer busy':<34}{fmt(dd['busy_tok_s'], '.1f'):>9}   trainer used "
              f"{fmt(dd['busy_trainer_cores'], '.2f')} cores "
              f"({', '.join(fmt(s['decode_tok_s'], '.1f') + ' @' + fmt(s['trainer_cores'], '.2f') + (' step over' if s['step_done_at_end'] else '') for s in dd['busy'])})")  # noqa: E501
        print(f"    {'ratio busy / idle':<34}{fmt(dd['ratio_busy_over_idle'], '.2f'):>9}   "
              f"step took {fmt(dd['step_seconds'], '.1f')} s; {dd['busy_valid']}/{len(dd['busy'])} busy "
              f"run(s) counted (trainer CPU time grew, step still running at the end)")
        print(f"    same text idle/busy: {dd['same_text']} (cached prompt tokens idle "
              f"{[s['cached_tokens'] for s in dd['idle']]}, busy {[s['cached_tokens'] for s in dd['busy']]})")
    print()


def summarise(scenarios: list[dict]) -> tuple[dict, dict]:
    versions = [v for s in scenarios for v in s["versions"]]
    good = [v for v in versions if not v["probe_paused"]]
    swap = {"n": len(good), "excluded": len(versions) - len(good),
            "median_s": median([v["swap_s"] for v in good]), "max_s": maximum([v["swap_s"] for v in good]),
            "daemon_median_s": median([v["daemon_s"] for v in good]),
            "daemon_max_s": maximum([v["daemon_s"] for v in good]),
            "step_median_s": median([v["step_seconds"] for v in versions]),
            "step_max_s": maximum([v["step_seconds"] for v in versions]),
            "rejected": [f"{s['name']}:{v['version']} ({v['rejected']})" for s in scenarios
                         for v in s["versions"] if v["rejected"]]}
    ps = [s["probe"] for s in scenarios]
    probes = {"total": sum(p["total"] for p in ps), "non_200": sum(p["non_200"] for p in ps),
              "failed": sum(p["failed"] for p in ps), "streaming": sum(p["streaming"] for p in ps),
              "swaps": sum(p["swaps_during"] for p in ps),
              "in_flight": sum(p["in_flight_at_a_swap"] for p in ps),
              "within_1s": sum(p["within_1s_of_a_swap"] for p in ps),
              "duration_ms_median": median([p["duration_ms_median"] for p in ps]),
              "duty_cycle": median([p["duty_cycle"] for p in ps]),
              "probe_turns_trained": sum(p["probe_turns_trained"] for p in ps),
              "errors": [e for p in ps for e in p["errors"]][:10]}
    return swap, probes


# -- main -----------------------------------------------------------------------------------------

def git_state() -> dict:
    """The commit measured, and the daemon files changed on top of it (numbers depend on them)."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout
    try:
        dirty = [line[3:] for line in git("status", "--porcelain", "--", "daemon").splitlines()]
        return {"head": git("rev-parse", "--short", "HEAD").strip(), "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"head": None, "dirty": []}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="fewer conversations (2 / 4 / until 1 served, at most 3) and one (d) "
                        "repetition")
    p.add_argument("--scenarios", default="rules-b1,rules-b4,engine-b1",
                   help="comma list of rules-b1, rules-b4, engine-b1 (default: all)")
    p.add_argument("--engine-votes", type=int, default=1,
                   help="judge.votes of the engine-judge scenario (default 1)")
    p.add_argument("--probe-gap", type=float, default=0.25,
                   help="seconds between probe requests (default 0.25)")
    p.add_argument("--timeout", type=float, default=120,
                   help="seconds to wait for an adapter to serve (default 120)")
    p.add_argument("--keep", action="store_true", help="keep the scenario homes (logs, DBs)")
    p.add_argument("--out", help="also write the JSON results to this file")
    args = p.parse_args(argv)
    args.decode_reps = 1 if args.quick else 2
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # SIGTERM -> SystemExit, so the finally blocks still stop the daemons.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    plan = {
        "rules-b1": ({"CLAWRL_JUDGE_BACKEND": "rules"}, 2 if args.quick else 5, 1, False, None),
        "rules-b4": ({"CLAWRL_JUDGE_BACKEND": "rules"}, 4 if args.quick else 8, 4, True, None),
        # Until 1 (quick) or 3 samples are served, at most 3 or 8 conversations.
        "engine-b1": ({"CLAWRL_JUDGE_BACKEND": "engine",
                       "CLAWRL_JUDGE_VOTES": str(args.engine_votes)},
                      1 if args.quick else 3, 1, False, 3 if args.quick else 8),
    }
    unknown = [n for n in names if n not in plan]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; choose from {', '.join(plan)}")
    work = Path(tempfile.mkdtemp(prefix="clawrl-learn-"))
    load_start = os.getloadavg()[0]
    git = git_state()
    say(f"scenarios {names}; homes under {work}; model cache {model_cache()}")
    scenarios = []
    try:
        for name in names:
            env, n, batch, decode, max_conv = plan[name]
            scenarios.append(run_scenario(name, env, n, batch, args, work, decode, max_conv))
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    swap, probes = summarise(scenarios)
    decode = next((s["decode"] for s in scenarios if s["decode"]), None)
    results = {
        "scenarios": scenarios, "swap": swap, "probes": probes, "decode": decode,
        "meta": {"cpus": os.cpu_count(), "loadavg_start": load_start,
                 "loadavg_end": os.getloadavg()[0], "quick": args.quick,
                 "probe_gap_s": args.probe_gap, "engine_votes": args.engine_votes,
                 "timeout_s": args.timeout, "targets": TARGETS, "model_cache": str(model_cache()),
                 "git": git,
                 "inherited_env": {k: v for k, v in os.environ.items() if k.startswith("CLAWRL_")},
                 "wall_s": time.perf_counter() - T_START}}
    print_table(results)
    emit(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
