"""swe: small Python projects with a failing test; reward when the whole suite passes.

A project is one module of three functions and a unittest suite (stdlib only: the sandbox's
interpreter has no pytest). One function carries a bug from a family of classic slips (an
off-by-one, a missing case, a swapped bound). The model reads and edits files and runs the tests
through three tools: `bash`, `read_file`, `write_file`, all executed inside the sandbox as the
sandbox's user. The verdict puts the original test files back (editing the tests is no fix) and
runs the whole suite there: success is exit code 0.
"""
from __future__ import annotations

import random
import shutil

from ..env import BASH, Env, Task, ToolOutcome, Verdict, arguments, outcome, refusal, task_id, tool
from ..sandbox import Sandbox

# name: (correct body, buggy body, test lines). Bodies are indented once; `f` is the function.
FAMILIES: dict[str, tuple[str, str, str, list[str]]] = {
    "mean": ("xs", "return sum(xs) / len(xs)", "return sum(xs) / (len(xs) - 1)",
             ["f([1, 2, 3, 6]) == 3", "f([5]) == 5", "f([2, 4]) == 3"]),
    "clamp": ("x, lo, hi", "return max(lo, min(x, hi))", "return min(lo, max(x, hi))",
              ["f(5, 0, 10) == 5", "f(-3, 0, 10) == 0", "f(42, 0, 10) == 10"]),
    "is_leap": ("year", "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
                "return year % 4 == 0 and year % 100 != 0",
                ["f(2024) is True", "f(1900) is False", "f(2000) is True", "f(2023) is False"]),
    "factorial": ("n", "out = 1\n    for i in range(2, n + 1):\n        out *= i\n    return out",
                  "out = 1\n    for i in range(2, n):\n        out *= i\n    return out",
                  ["f(0) == 1", "f(1) == 1", "f(5) == 120", "f(6) == 720"]),
    "count_vowels": ("text", "return sum(c in 'aeiou' for c in text.lower())",
                     "return sum(c in 'aeiou' for c in text)",
                     ["f('banana') == 3", "f('ORANGE') == 3", "f('sky') == 0"]),
    "word_count": ("text", "return len(text.split())", "return len(text.split(' '))",
                   ["f('one two three') == 3", "f('  spaced   out  ') == 2", "f('') == 0"]),
    "reverse_words": ("text", "return ' '.join(reversed(text.split()))",
                      "return ' '.join(sorted(text.split(), reverse=True))",
                      ["f('a b c') == 'c b a'", "f('hello world') == 'world hello'",
                       "f('one two three four') == 'four three two one'"]),
    "is_palindrome": ("text", "s = ''.join(c for c in text.lower() if c.isalnum())\n    return s == s[::-1]",
                      "s = ''.join(c for c in text if c.isalnum())\n    return s == s[::-1]",
                      ["f('racecar') is True", "f('Never odd or even') is True",
                       "f('clawrl') is False"]),
    "median": ("xs", "s = sorted(xs)\n    return s[len(s) // 2]", "return xs[len(xs) // 2]",
               ["f([3, 1, 2]) == 2", "f([9, 7, 8, 1, 5]) == 7", "f([4]) == 4"]),
    "fizzbuzz": ("n", "if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n        return "
                 "'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)",
                 "if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n"
                 "    if n % 15 == 0:\n        return 'FizzBuzz'\n    return str(n)",
                 ["f(3) == 'Fizz'", "f(10) == 'Buzz'", "f(30) == 'FizzBuzz'", "f(7) == '7'"]),
    "dedupe": ("xs", "seen, out = set(), []\n    for x in xs:\n        if x not in seen:\n"
               "            seen.add(x)\n            out.append(x)\n    return out",
               "return sorted(set(xs))",
               ["f([3, 1, 3, 2, 1]) == [3, 1, 2]", "f([]) == []", "f(['b', 'a', 'b']) == ['b', 'a']"]),
    "celsius_to_f": ("c", "return c * 9 / 5 + 32", "return c * 5 / 9 + 32",
                     ["f(0) == 32", "f(100) == 212", "f(-40) == -40"]),
    "last_index": ("xs, x", "for i in range(len(xs) - 1, -1, -1):\n        if xs[i] == x:\n"
                   "            return i\n    return -1",
                   "for i in range(len(xs) - 1, 0, -1):\n        if xs[i] == x:\n"
                   "            return i\n    return -1",
                   ["f([1, 2, 1], 1) == 2", "f([5, 6], 5) == 0", "f([], 3) == -1"]),
    "chunk": ("xs, n", "return [xs[i:i + n] for i in range(0, len(xs), n)]",
              "return [xs[i:i + n] for i in range(0, len(xs) - n, n)]",
              ["f([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]", "f([1, 2, 3], 2) == [[1, 2], [3]]",
               "f([], 3) == []"]),
}
MODULES = ("utils", "helpers", "toolkit", "common", "core", "lib", "misc", "tools")


def _source(name: str, buggy: bool) -> str:
    args, good, bad, _ = FAMILIES[name]
    return f"def {name}({args}):\n    {bad if buggy else good}\n"


def _tests(module: str, names: list[str]) -> str:
    out = ["import unittest", "", f"from {module} import {', '.join(names)}", "", "",
           f"class Test{module.title()}(unittest.TestCase):"]
    for name in names:
        out.append(f"    def test_{name}(self):")
        out.extend(f"        self.assertTrue({case.replace('f(', name + '(')}, {case!r})"
                   for case in FAMILIES[name][3])
        out.append("")
    out += ["", "if __name__ == '__main__':", "    unittest.main()", ""]
    return "\n".join(out)


class SweEnv(Env):
    name = "swe"
    system = ("You fix bugs in a small Python project in the current folder. Tools: bash (run "
              "commands, e.g. `python -m unittest`), read_file and write_file. Find why the tests "
              "fail, fix the code (not the tests), run the tests again, and when they all pass "
              "reply 'done' without calling a tool.")
    tools = [BASH,
             tool("read_file", "Read a text file of the project.", path="the file's path"),
             tool("write_file", "Replace a file's whole content (creating it if needed).",
                  path="the file's path", content="the complete new content")]

    def generate(self, rng: random.Random) -> Task:
        module = rng.choice(MODULES)
        names = rng.sample(sorted(FAMILIES), 3)
        buggy = rng.choice(names)
        files = {f"{module}.py": "\n\n".join(_source(n, n == buggy) for n in names),
                 f"test_{module}.py": _tests(module, names)}
        prompt = (f"The tests of this project fail: `python -m unittest` reports a failure in "
                  f"test_{module}.py. Find the bug in {module}.py and fix it so that the whole "
                  f"suite passes.")
        return Task(self.name, task_id("fix-" + buggy, module, names), "fix-" + buggy, prompt,
                    {"files": files, "tests": [f"test_{module}.py"], "module": module,
                     "buggy": buggy})

    def setup(self, task: Task, box: Sandbox) -> None:
        for path, text in task.data["files"].items():
            box.write(path, text)

    async def call(self, task: Task, box: Sandbox, name: str | None, raw_args) -> ToolOutcome:
        if name == "bash":
            args = arguments(raw_args, ("command",))
            return refusal(args) if isinstance(args, str) else outcome(
                await box.run(["bash", "-c", args["command"]]))
        if name == "read_file":
            args = arguments(raw_args, ("path",))
            return refusal(args) if isinstance(args, str) else outcome(
                await box.run(["cat", "--", args["path"]]))
        if name == "write_file":
            args = arguments(raw_args, ("path", "content"))
            if isinstance(args, str):
                return refusal(args)
            # As the sandbox's user, like everything the agent does: a symlink it planted cannot
            # make us write outside the sandbox.
            script = ("import os, sys\np = sys.argv[1]\nos.makedirs(os.path.dirname(p) or '.', "
                      "exist_ok=True)\nopen(p, 'w').write(sys.stdin.read())\n"
                      "print(f'wrote {os.path.getsize(p)} bytes to {p}')")
            return outcome(await box.run(["python", "-c", script, args["path"]],
                                         stdin=args["content"]))
        return refusal(f"unknown tool {name!r}; the tools are bash, read_file and write_file")

    async def verify(self, task: Task, box: Sandbox, final: str | None) -> Verdict:
        for path in task.data["tests"]:
            p = box.work / path   # not resolved: a symlink the agent put here is replaced, not followed
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
            box.write(path, task.data["files"][path])
        box.seal()
        r = await box.run(["python", "-m", "unittest", "-q"])
        if r.stopped:
            return Verdict(False, f"the test run was stopped: {r.stopped}")
        if r.exit_code == 0 and "OK" in r.output:
            return Verdict(True, "the whole suite passes")
        tail = r.output.strip().splitlines()[-1:] or ["no output"]
        return Verdict(False, f"the suite fails ({tail[0][:120]})")

    def hint(self, task: Task, verdict: Verdict) -> str | None:
        m, fn = task.data["module"], task.data["buggy"]
        return (f"Run python -m unittest to see which test fails, read {m}.py, fix the function "
                f"{fn} with write_file, and run the tests again before answering.")

