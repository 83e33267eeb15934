"""What an environment is: tasks, tools, how a tool call runs, and a verifier's verdict.

An environment generates its own tasks from a seed (nothing is downloaded) and splits them into
two disjoint pools by a hash of each task's id: `train` and `heldout`. For an episode it writes the
task's files into a fresh sandbox, runs each tool call there, and at the end gives a verdict from
what it can check itself (the final answer, the files, the test suite), never from the model's
say-so. Tool results go back as JSON with an `exit_code`, which is also what the daemon's rules
judge reads when it judges steps.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field

from .sandbox import STOPS, Result, Sandbox

SPLITS = ("train", "heldout")
HELDOUT_SHARE = 4   # one task id in this many belongs to the held-out pool


@dataclass(frozen=True)
class Task:
    env: str
    id: str                    # stable across runs: kind + a hash of what the task is
    kind: str
    prompt: str                # the user's message
    data: dict = field(default_factory=dict, hash=False, compare=False)   # for setup and verify

    @property
    def split(self) -> str:
        return split_of(self.id)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str


@dataclass(frozen=True)
class ToolOutcome:
    content: str               # the tool message sent back
    stopped: str | None = None # a sandbox limit stopped the command: the episode fails


def split_of(task_id: str) -> str:
    return "heldout" if hashlib.sha256(task_id.encode()).digest()[0] % HELDOUT_SHARE == 0 else "train"


def task_id(kind: str, *parts) -> str:
    digest = hashlib.sha256(json.dumps([kind, *parts], sort_keys=True).encode()).hexdigest()
    return f"{kind}-{digest[:10]}"


def tool(name: str, description: str, **params: str) -> dict:
    """An OpenAI tool spec whose parameters are all required strings."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "required": list(params),
                       "properties": {k: {"type": "string", "description": v}
                                      for k, v in params.items()}}}}


def outcome(r: Result) -> ToolOutcome:
    body: dict = {"exit_code": r.exit_code, "output": r.output}
    if r.stopped:
        body["error"] = f"stopped by the sandbox: the command {STOPS[r.stopped]}"
    return ToolOutcome(json.dumps(body, ensure_ascii=False), r.stopped)


def refusal(message: str) -> ToolOutcome:
    """A call the environment cannot run (unknown tool, bad arguments): an error result, not a stop."""
    return ToolOutcome(json.dumps({"exit_code": 2, "error": message}))


def arguments(raw, required: tuple[str, ...]) -> dict | str:
    """A call's arguments as a dict, or a message saying what is wrong with them."""
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return f"the arguments are not valid JSON: {str(raw)[:200]}"
    if not isinstance(args, dict):
        return "the arguments must be a JSON object"
    missing = [k for k in required if not isinstance(args.get(k), str)]
    if missing:
        return f"missing string argument(s): {', '.join(missing)}"
    return args


class Env:
    """The base every environment extends: `generate` one candidate task from an rng, `setup` its
    files, `call` a tool, `verify` the end state, optionally `hint` how it should have gone."""
    name = ""
    system = ""
    tools: list[dict] = []
    max_attempts = 10_000

    def generate(self, rng: random.Random) -> Task:
        raise NotImplementedError

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        """`n` distinct tasks of `split`, the same for the same seed; the two splits never share
        a task whatever the seeds."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        rng, seen = random.Random(f"{self.name}:{split}:{seed}"), set()
        out: list[Task] = []
        for _ in range(self.max_attempts):
            if len(out) == n:
                break
            t = self.generate(rng)
            if t.split == split and t.id not in seen:
                seen.add(t.id)
                out.append(t)
        if len(out) < n:
            raise ValueError(f"{self.name}: only {len(out)} distinct {split} tasks, {n} asked for")
        return out

    def messages(self, task: Task) -> list[dict]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": task.prompt}]

    def setup(self, task: Task, box: Sandbox) -> None:
        """Write the task's files into box.work (the runner hands them to the sandbox after)."""

    async def call(self, task: Task, box: Sandbox, name: str | None, raw_args) -> ToolOutcome:
        """`name`: the tool the model called, None when its call named none (refuse it)."""
        raise NotImplementedError

    async def verify(self, task: Task, box: Sandbox, final: str | None) -> Verdict:
        """`final`: the model's last answer, None when it never gave one (steps ran out)."""
        raise NotImplementedError

    def hint(self, task: Task, verdict: Verdict) -> str | None:
        """What a failed episode should have done, sent as the feedback's comment (the trainer's
        hint); None for no hint."""
        return None


async def run_bash(box: Sandbox, raw_args) -> ToolOutcome:
    args = arguments(raw_args, ("command",))
    if isinstance(args, str):
        return refusal(args)
    return outcome(await box.run(["bash", "-c", args["command"]]))


BASH = tool("bash", "Run a bash command in the current folder; returns its exit code and output.",
            command="the command line")
