"""terminal: file and text tasks in a shell, verified from the filesystem they leave behind.

Each task writes a few files into the sandbox (generated from word lists by a seeded rng) and asks
for one change: create a file, count, find, sort, transform, delete, copy, rename. The model has a
`bash` tool. The verdict compares the resulting files with what the task implies; the final answer
is not read. Paths the agent turned into symlinks out of the sandbox count as missing.
"""
from __future__ import annotations

import random

from ..env import BASH, Env, Task, ToolOutcome, Verdict, refusal, run_bash, task_id
from ..sandbox import Sandbox

WORDS = ("alpha", "bravo", "cedar", "delta", "ember", "fjord", "glade", "heron", "iris", "juniper",
         "kelp", "lotus", "mango", "nectar", "olive", "prism", "quartz", "raven", "sage", "tulip",
         "umber", "vale", "willow", "xenon", "yarrow", "zephyr")
MARKS = ("error", "warning", "timeout", "retry")
DIRS = ("docs", "notes", "logs", "data", "src", "archive")


def _line(rng: random.Random, k: int = 4) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(k))


def _lines(rng: random.Random, n: int) -> list[str]:
    return [_line(rng, rng.randint(2, 5)) for _ in range(n)]


def _text(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def _same_lines(got: str | None, want: list[str]) -> bool:
    return got is not None and got.rstrip("\n").split("\n") == want


def _task(rng: random.Random) -> tuple[str, str, dict]:
    """(kind, prompt, data); data["files"] is what setup writes."""
    kind = rng.choice(("create", "count-lines", "find-file", "sort", "upper", "delete-ext",
                       "copy-ext", "replace", "count-files", "head", "rename", "unique"))
    name = rng.choice(WORDS)
    if kind == "create":
        path, line = f"{rng.choice(DIRS)}/{name}.txt", _line(rng, 3)
        return kind, f"Create a file {path} containing exactly this one line: {line}", {
            "files": {}, "path": path, "lines": [line]}
    if kind == "count-lines":
        mark = rng.choice(MARKS)
        lines = [f"{_line(rng, 2)} {mark if rng.random() < 0.35 else rng.choice(WORDS)} {_line(rng, 1)}"
                 for _ in range(rng.randint(12, 40))]
        return kind, (f"Count the lines of log.txt that contain the word {mark} and write just the "
                      f"number to count.txt."), {
            "files": {"log.txt": _text(lines)}, "path": "count.txt",
            "lines": [str(sum(mark in line.split() for line in lines))]}
    if kind == "find-file":
        d = rng.choice(DIRS)
        names = rng.sample(WORDS, 5)
        target = f"{d}/{rng.choice(('a', 'b', 'c'))}/{names[0]}.txt"
        files = {f"{d}/{rng.choice(('a', 'b', 'c'))}/{n}.txt": _text(_lines(rng, 3)) for n in names[1:]}
        files[target] = _text(_lines(rng, 2) + [f"the key is {name}-7"] + _lines(rng, 1))
        return kind, (f"One file under {d}/ contains the text 'the key is {name}-7'. Write its path "
                      f"(relative to the current folder) to found.txt."), {
            "files": files, "path": "found.txt", "lines": [target]}
    if kind in ("sort", "upper", "head", "unique"):
        lines = _lines(rng, rng.randint(6, 14))
        if kind == "unique":
            lines += rng.sample(lines, 3)
            rng.shuffle(lines)
        k = rng.randint(2, 5)
        prompt, want = {
            "sort": ("Write the lines of words.txt sorted alphabetically to sorted.txt.", sorted(lines)),
            "upper": ("Write the contents of words.txt in upper case to upper.txt.",
                      [line.upper() for line in lines]),
            "head": (f"Write the first {k} lines of words.txt to top.txt.", lines[:k]),
            "unique": ("Write the distinct lines of words.txt, sorted alphabetically, to unique.txt.",
                       sorted(set(lines))),
        }[kind]
        out = {"sort": "sorted.txt", "upper": "upper.txt", "head": "top.txt", "unique": "unique.txt"}[kind]
        return kind, prompt, {"files": {"words.txt": _text(lines)}, "path": out, "lines": want}
    if kind in ("delete-ext", "copy-ext"):
        d = rng.choice(DIRS)
        ext = ".tmp" if kind == "delete-ext" else ".csv"
        files = {f"{d}/{n}{rng.choice((ext, '.txt', '.md'))}": _text(_lines(rng, 2))
                 for n in rng.sample(WORDS, 7)}
        files[f"{d}/{name}-x{ext}"] = _text(_lines(rng, 2))
        if kind == "delete-ext":
            return kind, f"Delete every {ext} file under {d}/ and keep all the other files.", {
                "files": files}
        return kind, (f"Make a folder named backup and copy every {ext} file from {d}/ into it "
                      f"(keep the originals)."), {"files": files, "dir": d, "ext": ext}
    if kind == "replace":
        old, new = rng.sample(WORDS, 2)
        lines = [f"{k} = {rng.choice((old, rng.choice(WORDS)))}" for k in rng.sample(WORDS, 8)]
        lines[0] = f"{lines[0].split(' = ')[0]} = {old}"
        return kind, f"In config.ini, replace every occurrence of '{old}' with '{new}', in place.", {
            "files": {"config.ini": _text(lines)}, "path": "config.ini",
            "lines": [line.replace(old, new) for line in lines]}
    if kind == "count-files":
        d = rng.choice(DIRS)
        files = {f"{d}/{rng.choice(('', 'x/', 'y/z/'))}{n}{rng.choice(('.txt', '.txt', '.log'))}": "x\n"
                 for n in rng.sample(WORDS, rng.randint(5, 12))}
        return kind, (f"Count the .txt files under {d}/ (at any depth) and write just the number "
                      f"to total.txt."), {
            "files": files, "path": "total.txt",
            "lines": [str(sum(p.endswith(".txt") for p in files))]}
    lines = _lines(rng, 4)
    new = f"{name}-final.txt"
    return "rename", f"Rename report.txt to {new}.", {
        "files": {"report.txt": _text(lines)}, "path": new, "lines": lines, "gone": "report.txt"}


class TerminalEnv(Env):
    name = "terminal"
    system = ("You work in a Linux shell through the bash tool, in the task's folder. Do the task "
              "with shell commands, check the result, then reply 'done' without calling a tool.")
    tools = [BASH]

    def generate(self, rng: random.Random) -> Task:
        kind, prompt, data = _task(rng)
        return Task(self.name, task_id(kind, prompt, data["files"]), kind, prompt, data)

    def setup(self, task: Task, box: Sandbox) -> None:
        for path, text in task.data["files"].items():
            box.write(path, text)

    async def call(self, task: Task, box: Sandbox, name: str | None, raw_args) -> ToolOutcome:
        if name != "bash":
            return refusal(f"unknown tool {name!r}; the only tool is bash")
        return await run_bash(box, raw_args)

    async def verify(self, task: Task, box: Sandbox, final: str | None) -> Verdict:
        data = task.data
        if task.kind in ("delete-ext", "copy-ext"):
            return self._verify_files(task, box)
        got = box.read(data["path"])
        if got is None:
            return Verdict(False, f"{data['path']} is missing")
        if data.get("gone") and box.read(data["gone"]) is not None:
            return Verdict(False, f"{data['gone']} is still there")
        if len(data["lines"]) == 1:   # a one-line answer: surrounding blanks and ./ do not matter
            got = got.strip().removeprefix("./")
        if not _same_lines(got, data["lines"]):
            return Verdict(False, f"{data['path']} does not hold what the task asks for")
        return Verdict(True, f"{data['path']} is right")

    def _verify_files(self, task: Task, box: Sandbox) -> Verdict:
        files = task.data["files"]
        if task.kind == "delete-ext":
            left = [p for p in files if p.endswith(".tmp") and box.read(p) is not None]
            lost = [p for p, text in files.items() if not p.endswith(".tmp") and box.read(p) != text]
            if left or lost:
                return Verdict(False, f"still there: {left}; lost or changed: {lost}")
            return Verdict(True, "every .tmp file deleted, the others kept")
        ext = task.data["ext"]
        wanted = {p.rsplit("/", 1)[1]: text for p, text in files.items() if p.endswith(ext)}
        missing = [n for n, text in wanted.items() if box.read(f"backup/{n}") != text]
        lost = [p for p, text in files.items() if box.read(p) != text]
        if missing or lost:
            return Verdict(False, f"not copied: {missing}; originals lost or changed: {lost}")
        return Verdict(True, f"every {ext} file copied into backup/")

    def hint(self, task: Task, verdict: Verdict) -> str | None:
        how = {
            "create": "mkdir -p the folder, then echo the line into the file",
            "count-lines": "grep -cw the word log.txt > count.txt",
            "find-file": "grep -rl the text in the folder, and write the path into found.txt",
            "sort": "sort words.txt > sorted.txt", "upper": "tr a-z A-Z < words.txt > upper.txt",
            "head": "head -n the number words.txt > top.txt",
            "unique": "sort -u words.txt > unique.txt",
            "delete-ext": "find the folder -name '*.tmp' -delete",
            "copy-ext": "mkdir -p backup && cp the folder's *.csv files into backup/",
            "replace": "sed -i 's/old/new/g' config.ini",
            "count-files": "find the folder -name '*.txt' | wc -l > total.txt",
            "rename": "mv report.txt to the new name",
        }[task.kind]
        return f"Do it with the bash tool in one command ({how}), then reply done."
