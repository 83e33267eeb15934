"""The environments' tasks and verifiers, with hand-made outcomes: the right end state passes,
the wrong one fails. Terminal tasks are solved by their textbook shell command and swe tasks by
the correct function, both through the environment's own tools in a real sandbox."""
from __future__ import annotations

import asyncio
import json
import re

import pytest

from clawrl.agents import envs
from clawrl.agents.env import Task
from clawrl.agents.envs.swe import FAMILIES, _source
from clawrl.agents.sandbox import Limits, Sandbox

LIMITS = Limits(timeout_s=20)


def play(env, task: Task, calls: list[tuple[str, dict]], final: str | None = "done"):
    """Set the task up, run `calls` through the env's tools, verify. (verdict, tool outputs)"""
    async def go():
        with Sandbox(LIMITS) as box:
            env.setup(task, box)
            box.seal()
            outs = [json.loads((await env.call(task, box, name, json.dumps(args))).content)
                    for name, args in calls]
            return await env.verify(task, box, final), outs
    return asyncio.run(go())


@pytest.mark.parametrize("name", envs.NAMES)
def test_tasks_are_seeded_and_the_pools_are_disjoint(name):
    env = envs.get(name)
    train, held = env.tasks("train", 60, seed=0), env.tasks("heldout", 20, seed=0)
    assert [t.id for t in train] == [t.id for t in env.tasks("train", 60, seed=0)]
    assert [t.id for t in train] != [t.id for t in env.tasks("train", 60, seed=1)]
    other = env.tasks("heldout", 20, seed=7)
    assert not {t.id for t in train} & {t.id for t in held + other}
    assert {t.split for t in train} == {"train"} and {t.split for t in held} == {"heldout"}
    assert len({t.id for t in train}) == 60 and len({t.kind for t in train}) >= 8


# -- toolcall ---------------------------------------------------------------------------------------

def test_toolcall_reads_the_last_number_of_the_final_answer():
    env = envs.get("toolcall")
    task = next(t for t in env.tasks("train", 200) if t.kind == "mul")
    answer = task.data["answer"]
    verify = lambda final: asyncio.run(env.verify(task, None, final))
    assert verify(f"The answer is {answer}.").ok
    assert verify(f"{task.prompt[8:-1]} = {int(answer):,}").ok          # thousands separators
    assert not verify(f"The answer is {int(answer) + 1}.").ok
    assert not verify(f"It is {answer}, or maybe 12.").ok               # the last number counts
    assert not verify("I cannot compute that.").ok
    assert not verify("").ok and not verify(None).ok


def test_toolcall_named_answers_must_name_only_the_right_one():
    env = envs.get("toolcall")
    task = next(t for t in env.tasks("train", 200) if t.kind == "top-product")
    answer = task.data["answer"]
    wrong = next(c for c in task.data["candidates"] if c != answer)
    verify = lambda final: asyncio.run(env.verify(task, None, final))
    assert verify(f"{answer.title()} sold the most.").ok
    assert not verify(f"{wrong} sold the most.").ok
    assert not verify(f"Either {answer} or {wrong}.").ok


def test_toolcall_python_tool_runs_the_program_and_its_output_verifies():
    env = envs.get("toolcall")
    for task in [t for t in env.tasks("heldout", 40) if t.kind in ("mul", "range-sum", "gcd")][:3]:
        expr = {"mul": lambda p: re.search(r"What is (.+)\?", p)[1],
                "range-sum": lambda p: "sum(range({}, {} + 1))".format(*re.findall(r"\d+", p)),
                "gcd": lambda p: "__import__('math').gcd({}, {})".format(*re.findall(r"\d+", p))
                }[task.kind](task.prompt)
        verdict, (out,) = play(env, task, [("python", {"code": f"print({expr})"})])
        assert out["exit_code"] == 0
        assert asyncio.run(env.verify(task, None, f"The answer is {out['output'].strip()}.")).ok


def test_toolcall_refuses_unknown_tools_and_bad_arguments():
    env = envs.get("toolcall")
    task = env.tasks("train", 1)[0]
    _, outs = play(env, task, [("bash", {"command": "ls"}), ("python", {"program": "x"})])
    assert [o["exit_code"] for o in outs] == [2, 2]
    assert "unknown tool" in outs[0]["error"] and "code" in outs[1]["error"]


# -- terminal ---------------------------------------------------------------------------------------

def textbook(task: Task) -> str:
    """The shell command a person would type for the task, read from the prompt."""
    p, d = task.prompt, task.data
    q = lambda s: "'" + s.replace("'", "'\\''") + "'"
    if task.kind == "create":
        return f"mkdir -p $(dirname {d['path']}) && echo {q(d['lines'][0])} > {d['path']}"
    if task.kind == "count-lines":
        word = re.search(r"contain the word (\w+)", p)[1]
        return f"grep -cw {word} log.txt > count.txt"
    if task.kind == "find-file":
        folder, text = re.search(r"under (\w+)/ contains the text '(.+?)'", p).groups()
        return f"grep -rl {q(text)} {folder} > found.txt"
    if task.kind == "count-files":
        folder = re.search(r"files under (\w+)/", p)[1]
        return f"find {folder} -name '*.txt' | wc -l > total.txt"
    if task.kind == "delete-ext":
        folder = re.search(r"under (\w+)/", p)[1]
        return f"find {folder} -name '*.tmp' -delete"
    if task.kind == "copy-ext":
        folder = re.search(r"from (\w+)/", p)[1]
        return f"mkdir backup && cp {folder}/*.csv backup/"
    if task.kind == "replace":
        old, new = re.search(r"occurrence of '(\w+)' with '(\w+)'", p).groups()
        return f"sed -i 's/{old}/{new}/g' config.ini"
    if task.kind == "rename":
        return "mv report.txt " + re.search(r"to (\S+)\.$", p)[1]
    if task.kind == "head":
        return "head -n " + re.search(r"first (\d+) lines", p)[1] + " words.txt > top.txt"
    return {"sort": "sort words.txt > sorted.txt", "upper": "tr a-z A-Z < words.txt > upper.txt",
            "unique": "sort -u words.txt > unique.txt"}[task.kind]


def terminal_tasks() -> list[Task]:
    env, seen, out = envs.get("terminal"), set(), []
    for t in env.tasks("train", 80) + env.tasks("heldout", 30):
        if t.kind not in seen:
            seen.add(t.kind)
            out.append(t)
    assert len(out) == 12, sorted(seen)
    return out


@pytest.mark.parametrize("task", terminal_tasks(), ids=lambda t: t.kind)
def test_terminal_task_passes_with_its_textbook_command_and_fails_untouched(task):
    env = envs.get("terminal")
    verdict, _ = play(env, task, [])
    assert not verdict.ok, verdict
    verdict, (out,) = play(env, task, [("bash", {"command": textbook(task)})])
    assert out["exit_code"] == 0, out
    assert verdict.ok, (verdict, textbook(task))


def test_terminal_verifier_rejects_near_misses():
    env = envs.get("terminal")
    tasks = {t.kind: t for t in terminal_tasks()}
    near = {
        "sort": "sort -r words.txt > sorted.txt",
        "count-lines": "grep -c . log.txt > count.txt",
        "delete-ext": "rm -r " + re.search(r"under (\w+)/", tasks["delete-ext"].prompt)[1],
        "rename": "cp report.txt " + re.search(r"to (\S+)\.$", tasks["rename"].prompt)[1],
        "count-lines-link": "ln -s /etc/hostname count.txt",
    }
    for kind, command in near.items():
        task = tasks[kind.removesuffix("-link")]
        verdict, _ = play(env, task, [("bash", {"command": command})])
        assert not verdict.ok, (kind, verdict)


# -- swe --------------------------------------------------------------------------------------------

def test_every_bug_family_fails_its_tests_and_the_correct_code_passes():
    env = envs.get("swe")
    tasks = {}
    for t in env.tasks("train", 200) + env.tasks("heldout", 60):
        tasks.setdefault(t.data["buggy"], t)
    assert set(tasks) == set(FAMILIES)
    for name, task in tasks.items():
        module = task.data["module"]
        verdict, _ = play(env, task, [])
        assert not verdict.ok, (name, verdict)
        fixed = task.data["files"][f"{module}.py"].replace(_source(name, True), _source(name, False))
        verdict, (out,) = play(env, task, [("write_file", {"path": f"{module}.py", "content": fixed})])
        assert out["exit_code"] == 0, out
        assert verdict.ok, (name, verdict)


def test_swe_tools_read_write_and_run_tests_in_the_sandbox():
    env = envs.get("swe")
    task = env.tasks("heldout", 1)[0]
    module = task.data["module"]
    verdict, (read, tests, wrote) = play(env, task, [
        ("read_file", {"path": f"{module}.py"}),
        ("bash", {"command": "python -m unittest"}),
        ("write_file", {"path": "sub/dir/x.txt", "content": "hi"}),
    ])
    assert read["exit_code"] == 0 and read["output"] == task.data["files"][f"{module}.py"]
    assert tests["exit_code"] == 1 and "FAILED" in tests["output"]
    assert wrote["exit_code"] == 0 and "wrote 2 bytes" in wrote["output"]
    assert not verdict.ok


def test_swe_editing_the_tests_is_no_fix():
    env = envs.get("swe")
    task = env.tasks("train", 1)[0]
    test_file = task.data["tests"][0]
    cheat = "import unittest\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n"
    verdict, _ = play(env, task, [("write_file", {"path": test_file, "content": cheat})])
    assert not verdict.ok
    # Nor is replacing the test file by a link to a passing one elsewhere.
    verdict, _ = play(env, task, [("bash", {"command": f"rm {test_file} && ln -s /dev/null {test_file}"})])
    assert not verdict.ok
