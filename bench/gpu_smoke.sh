#!/usr/bin/env bash
# GPU smoke test of a server engine: the whole loop on a real SGLang or vLLM.
#
#   bench/gpu_smoke.sh [sglang|vllm] [MODEL_DIR]
#
# Starts `clawrl serve` with engine.kind = ENGINE (clawrl launches the server itself), has a short
# conversation, gives feedback with a correction, and checks that the trainer trained a new
# adapter on the GPU (with the server as the teacher), that the server loaded it and that the next
# request was served with it. The tests in tests/test_engine_*_double.py check the same client
# code against protocol doubles on machines without a GPU; this script is the real thing.
#
# MODEL_DIR: a local Hugging Face model folder the engine serves with LoRA (default
# $CLAWRL_SMOKE_MODEL, else ~/models/Qwen3-0.6B; fetch it with
# `huggingface-cli download Qwen/Qwen3-0.6B --local-dir ~/models/Qwen3-0.6B`).
# Environment: PYTHON (the interpreter with clawrl; default .venv/bin/python), SMOKE_GPU (the GPU
# to serve and train on, default 0), CLAWRL_ENGINE_COMMAND (a server command from another env).
# SMOKE_WITHOUT_GPU=1 skips the GPU checks: with CLAWRL_ENGINE_COMMAND pointing at a protocol
# double (tests/doubles/*_server.py) this rehearses the script's own steps on a CPU machine.
# Exit status: 0 passed, 1 failed, 77 cannot run here (no GPU, engine or model: says which).
set -euo pipefail

ENGINE=${1:-sglang}
MODEL=${2:-${CLAWRL_SMOKE_MODEL:-$HOME/models/Qwen3-0.6B}}
GPU=${SMOKE_GPU:-0}
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
[[ -x "$PY" ]] || PY=$(command -v python3)

say() { printf 'gpu_smoke: %s\n' "$*" >&2; }
skip() { say "SKIP: $*"; exit 77; }
fail() { say "FAIL: $*"; [[ -n "${LOG:-}" && -f "$LOG" ]] && tail -n 40 "$LOG" >&2; exit 1; }

case "$ENGINE" in
  sglang) MODULE=sglang; MEMORY_ARG="--mem-fraction-static 0.5" ;;
  vllm) MODULE=vllm; MEMORY_ARG="--gpu-memory-utilization 0.5" ;;
  *) say "usage: $0 [sglang|vllm] [MODEL_DIR]"; exit 2 ;;
esac

# -- can it run here? -------------------------------------------------------------------------------
"$PY" -c "import clawrl" 2>/dev/null || skip "clawrl is not importable with $PY (make setup, or set PYTHON)"
if [[ -z "${SMOKE_WITHOUT_GPU:-}" ]]; then
  command -v nvidia-smi >/dev/null || skip "no nvidia-smi: this machine has no NVIDIA GPU driver"
  nvidia-smi -L >/dev/null 2>&1 || skip "nvidia-smi sees no GPU"
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" ||
    skip "torch in $PY has no CUDA (a CPU build): the trainer could not use the GPU; install a CUDA torch"
fi
if [[ -z "${CLAWRL_ENGINE_COMMAND:-}" ]]; then
  "$PY" -c "import $MODULE" 2>/dev/null ||
    skip "$ENGINE is not installed for $PY (pip install $([[ $ENGINE == sglang ]] && echo "'sglang[all]'" || echo vllm)), or set CLAWRL_ENGINE_COMMAND to its server command"
fi
[[ -f "$MODEL/config.json" ]] ||
  skip "no model at $MODEL (give MODEL_DIR, or: huggingface-cli download Qwen/Qwen3-0.6B --local-dir $MODEL)"

# -- start the daemon -------------------------------------------------------------------------------
WORK=$(mktemp -d -t clawrl-gpu-smoke.XXXXXX)
LOG=$WORK/daemon.log
free_port() { "$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
PORT=$(free_port)
URL=http://127.0.0.1:$PORT
export CLAWRL_HOME=$WORK/home CLAWRL_SERVER_PORT=$PORT \
  CLAWRL_ENGINE_KIND=$ENGINE CLAWRL_ENGINE_PORT=$(free_port) \
  CLAWRL_ENGINE_SERVE_GPUS=$GPU CLAWRL_ENGINE_TRAIN_GPUS=$GPU \
  CLAWRL_ENGINE_EXTRA_ARGS=${CLAWRL_ENGINE_EXTRA_ARGS:-$MEMORY_ARG} \
  CLAWRL_ENGINE_MAX_LORA_RANK=16 CLAWRL_TRAIN_LORA_R=16 CLAWRL_TRAIN_LORA_ALPHA=32 \
  CLAWRL_ENGINE_STARTUP_TIMEOUT_S=900 CLAWRL_ENGINE_MAX_CONCURRENT=32 \
  CLAWRL_MODEL_SOURCE=$MODEL CLAWRL_MODEL_NAME=smoke CLAWRL_MODEL_CONTEXT_LENGTH=4096 \
  CLAWRL_MODEL_DEFAULT_MAX_TOKENS=64 \
  CLAWRL_TRAIN_ENABLED=true CLAWRL_TRAIN_BATCH_SIZE=1 CLAWRL_TRAIN_EPOCHS=2 CLAWRL_TRAIN_LR=1e-4 \
  CLAWRL_JUDGE_BACKEND=rules CLAWRL_SKILLS_ENABLED=false
say "$ENGINE on GPU $GPU with $MODEL; daemon log: $LOG"
"$PY" -m clawrl serve >"$LOG" 2>&1 &
DAEMON=$!
cleanup() {
  if kill -0 "$DAEMON" 2>/dev/null; then
    kill -TERM "$DAEMON"
    for _ in $(seq 60); do kill -0 "$DAEMON" 2>/dev/null || break; sleep 1; done
    kill -KILL "$DAEMON" 2>/dev/null || true
  fi
  say "logs kept in $WORK (daemon.log, home/logs/$ENGINE-server.log)"
}
trap cleanup EXIT

T0=$SECONDS
until "$PY" - "$URL" <<'EOF' 2>/dev/null
import sys, httpx
r = httpx.get(sys.argv[1] + "/readyz", timeout=5)
body = r.json()
if body.get("status") == "failed":
    print("the daemon could not start the engine: " + str(body.get("error")))
    sys.exit(3)
sys.exit(0 if r.status_code == 200 else 1)
EOF
do
  status=$?
  [[ $status == 3 ]] && fail "readyz reports the engine failed to start (see above)"
  kill -0 "$DAEMON" 2>/dev/null || fail "the daemon exited during start-up"
  (( SECONDS - T0 < 1000 )) || fail "not ready after 1000 s"
  sleep 3
done
say "ready after $((SECONDS - T0)) s: $ENGINE $("$PY" -c "import sys, httpx; print(httpx.get(sys.argv[1] + '/readyz', timeout=5).json()['engine'].get('server_version') or 'version unknown')" "$URL")"

# -- a short conversation with feedback, then the new adapter must serve ------------------------
"$PY" - "$URL" "$CLAWRL_HOME/clawrl.db" <<'EOF' || fail "the loop did not complete (see above)"
import json, sqlite3, sys, time
import httpx

url, db_path = sys.argv[1], sys.argv[2]
def chat(text, session):
    r = httpx.post(f"{url}/v1/chat/completions", timeout=300, headers={"X-Session-Id": session},
                   json={"model": "smoke", "max_tokens": 48, "temperature": 0.7,
                         "messages": [{"role": "user", "content": text}]})
    r.raise_for_status()
    return int(r.headers["x-clawrl-turn-id"]), r.json()["choices"][0]["message"]["content"]

def turn(turn_id):
    db = sqlite3.connect(db_path)
    db.row_factory = sqlite3.Row
    try:
        return dict(db.execute("SELECT * FROM turns WHERE id=?", (turn_id,)).fetchone())
    finally:
        db.close()

def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, file=sys.stderr)
    if not ok:
        sys.exit(1)

first, text = chat("What is the capital of France? Answer in one sentence.", "smoke")
time.sleep(1)
row = turn(first)
ids, lps = json.loads(row["response_ids"]), json.loads(row["response_logprobs"])
check(row["status"] == "complete" and ids and len(ids) == len(lps), f"served and recorded: {text!r}")
check(all(lp <= 0 for lp in lps), "served logprobs recorded for every token")
r = httpx.post(f"{url}/v1/feedback", timeout=30, json={
    "session_id": "smoke", "reward": -1,
    "comment": "Answer with the single word Paris, nothing else."})
check(r.status_code == 200, f"feedback accepted ({r.status_code})")

t0, info = time.time(), {}
while time.time() - t0 < 900:
    info = httpx.get(f"{url}/v1/adapters", timeout=10).json()
    if info["active"] and any(e["version"] == info["active"] and e["event"] == "canary passed"
                              for e in info["events"]):
        break
    if any(v["rejected"] for v in info["versions"]):
        check(False, f"an adapter was rejected: {info['versions']}")
    time.sleep(2)
check(bool(info.get("active")), f"adapter {info.get('active')} trained and live after {time.time() - t0:.0f} s")
row = turn(first)
check(row["train_status"] == "trained" and row["teacher_logprobs"] is not None,
      "the feedback turn was trained, with teacher logprobs from the server")
second, text = chat("And the capital of Italy?", "smoke-after")
time.sleep(1)
check(turn(second)["adapter_version"] == info["active"], f"served by the new adapter: {text!r}")
EOF
say "PASS: $ENGINE served, trained and hot-swapped a LoRA adapter on GPU $GPU"
