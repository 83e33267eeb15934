"""toolcall: arithmetic and data questions the model should answer by running Python.

Each task is a question with one right answer, computed here when the task is generated. The
model has one tool, `python`, which runs a program in the sandbox and returns what it printed.
The verdict reads only the final answer: the last number in it must be the right one (for a name,
the right name and no other candidate). Using the tool is how the model gets there, not a
condition of success: the easy kinds can be done in one's head.
"""
from __future__ import annotations

import math
import random
import re

from ..env import Env, Task, ToolOutcome, Verdict, arguments, outcome, refusal, task_id, tool
from ..sandbox import Sandbox

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano", "orbit", "candle",
         "garden", "silver", "rocket", "meadow", "harbor", "violet", "copper", "falcon", "pepper",
         "island", "winter", "saddle", "marble", "cactus", "thunder", "velvet", "anchor", "bridge")
PRODUCTS = ("apples", "pears", "plums", "cherries", "grapes", "melons", "lemons", "figs")


def _primes_below(n: int) -> int:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = bytearray(len(sieve[i * i::i]))
    return sum(sieve)


def _numbers(rng: random.Random, k: int, lo: int, hi: int) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(k)]


def _question(rng: random.Random) -> tuple[str, str, str, tuple]:
    """(kind, question, answer, candidates for a named answer)."""
    kind = rng.choice(("add", "mul", "sum-list", "range-sum", "power-mod", "primes", "digit-sum",
                       "gcd", "count-letter", "kth-smallest", "median", "top-product"))
    if kind == "add":
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return kind, f"What is {a} + {b}?", str(a + b), ()
    if kind == "mul":
        a, b = rng.randint(101, 9999), rng.randint(101, 999)
        return kind, f"What is {a} * {b}?", str(a * b), ()
    if kind == "sum-list":
        xs = _numbers(rng, rng.randint(6, 10), 10, 999)
        return kind, f"What is the sum of these numbers: {', '.join(map(str, xs))}?", str(sum(xs)), ()
    if kind == "range-sum":
        a = rng.randint(1, 200)
        b = a + rng.randint(50, 900)
        return (kind, f"What is the sum of all integers from {a} to {b}, both included?",
                str((a + b) * (b - a + 1) // 2), ())
    if kind == "power-mod":
        a, b, m = rng.randint(2, 99), rng.randint(10, 99), rng.choice((97, 101, 997, 1000, 1009))
        return kind, f"What is {a} to the power of {b}, modulo {m}?", str(pow(a, b, m)), ()
    if kind == "primes":
        n = rng.randint(100, 5000)
        return kind, f"How many prime numbers are there below {n}?", str(_primes_below(n)), ()
    if kind == "digit-sum":
        a, b = rng.randint(2, 9), rng.randint(20, 120)
        return (kind, f"What is the sum of the decimal digits of {a} to the power of {b}?",
                str(sum(map(int, str(a ** b)))), ())
    if kind == "gcd":
        g = rng.randint(2, 60)
        a, b = g * rng.randint(10, 400), g * rng.randint(10, 400)
        return kind, f"What is the greatest common divisor of {a} and {b}?", str(math.gcd(a, b)), ()
    if kind == "count-letter":
        words = rng.sample(WORDS, rng.randint(6, 10))
        letter = rng.choice("aeinorst")
        text = " ".join(words)
        return (kind, f'How many times does the letter "{letter}" occur in this text: "{text}"?',
                str(text.count(letter)), ())
    if kind == "kth-smallest":
        xs = rng.sample(range(1, 1000), rng.randint(7, 11))
        k = rng.randint(2, 4)
        nth = {2: "2nd", 3: "3rd", 4: "4th"}[k]
        return (kind, f"What is the {nth} smallest number in this list: {', '.join(map(str, xs))}?",
                str(sorted(xs)[k - 1]), ())
    if kind == "median":
        xs = _numbers(rng, rng.choice((5, 7, 9, 11)), 1, 500)
        return (kind, f"What is the median of these numbers: {', '.join(map(str, xs))}?",
                str(sorted(xs)[len(xs) // 2]), ())
    products = rng.sample(PRODUCTS, rng.randint(4, 6))
    rows = [(p, _numbers(rng, 3, 1, 60)) for p in products]
    totals = {p: sum(v) for p, v in rows}
    if len(set(totals.values())) < len(totals):
        return _question(rng)   # ties have no single answer: draw again
    table = "; ".join(f"{p}: {', '.join(map(str, v))}" for p, v in rows)
    return (kind, f"Three days of sales per product: {table}. Which product sold the most in total?",
            max(totals, key=totals.__getitem__), tuple(products))


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text or "")
    if not found:
        return None
    n = found[-1].replace(",", "")
    return n[:-2] if n.endswith(".0") else n


class ToolCallEnv(Env):
    name = "toolcall"
    system = ("You answer questions by running Python. Call the python tool with a short program "
              "that prints the answer, read its output, then reply with the answer in one short "
              "sentence, without calling a tool.")
    tools = [tool("python", "Run a Python 3 program; returns its exit code and what it printed.",
                  code="the program")]

    def generate(self, rng: random.Random) -> Task:
        kind, question, answer, candidates = _question(rng)
        return Task(self.name, task_id(kind, question), kind, question,
                    {"answer": answer, "candidates": list(candidates)})

    async def call(self, task: Task, box: Sandbox, name: str | None, raw_args) -> ToolOutcome:
        if name != "python":
            return refusal(f"unknown tool {name!r}; the only tool is python")
        args = arguments(raw_args, ("code",))
        if isinstance(args, str):
            return refusal(args)
        return outcome(await box.run(["python", "-c", args["code"]]))

    async def verify(self, task: Task, box: Sandbox, final: str | None) -> Verdict:
        answer = task.data["answer"]
        if not final or not final.strip():
            return Verdict(False, "no final answer")
        if task.data["candidates"]:
            named = [c for c in task.data["candidates"]
                     if re.search(rf"\b{re.escape(c)}\b", final, re.I)]
            if named == [answer]:
                return Verdict(True, f"named {answer}")
            return Verdict(False, f"named {named or 'nothing'}; the answer is {answer}")
        got = last_number(final)
        if got == answer:
            return Verdict(True, f"answered {answer}")
        return Verdict(False, f"answered {got or 'no number'}; the answer is {answer}")

    def hint(self, task: Task, verdict: Verdict) -> str | None:
        return ("Call the python tool with a program that computes and prints the answer, then "
                "reply with exactly what it printed.")
