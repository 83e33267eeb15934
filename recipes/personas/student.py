"""Persona `student`: a student who wants homework answers in plain prose, with the working shown.

Prompts are arithmetic word problems built from templates with a fixed seed (the lists are the same
on every import); the module knows each problem's operands, intermediate results and answer.

Score = fraction of these six criteria met (an empty or whitespace response scores 0):
  1. no_bold      no `**` or `__` anywhere.
  2. no_heading   no markdown heading: no line starting with `#`..`######`, no `===`/`---` line.
  3. no_list      no bullet or numbered list: no line starting with `-`, `*`, `+`, `•` or
                  `1.` / `1)` followed by a space.
  4. no_label     no answer label: neither "final answer" anywhere nor "answer:" / "answer =".
  5. working      the steps are shown in prose: at least two sentences (runs of 3+ words with a
                  letter, ending in . ! ? or a line end; list items and headings don't count) and
                  at least one number from the computation (an operand, an intermediate result or
                  the result) written in digits.
  6. correct      the correct result appears as a number in digits (e.g. "42" or "1,250").
Five of the six criteria are style; correctness is one sixth, so a perfectly styled wrong answer
scores 0.83. One bold, heading or label slip costs 1/6 (0.83); a list costs 2/6 (0.67), as its
steps are not prose; the usual markdown answer (bold step labels, bullets, "Final answer:") scores
0.5 or less whether or not it is right. The criteria were fixed from the preference alone, never
tuned to what a model happens to produce.

For a prompt that is not in this module's lists, `working` accepts any number from the prompt and
`correct` is skipped (the score is the fraction of the other five).
"""
from __future__ import annotations

import random
import re

NAME = "student"
PREFERENCE = ("Explain homework answers in plain sentences that show the working: no bold, no "
              "headings, no lists and no 'Final answer' label.")
SYSTEM = None
MAX_TOKENS = 200
HAPPY = 0.9          # reply with thanks at or above this score, with a correction below it

# ------------------------------------------------------------------------------------- prompts

_NAMES = ["Maya", "Leo", "Priya", "Sam", "Aiden", "Chloe", "Omar", "Zoe", "Ravi", "Emma", "Lucas",
          "Nina", "Jonah", "Aisha", "Ben", "Sofia", "Mateo", "Hana"]
_ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "books", "stamps", "seashells",
          "crayons", "trading cards"]
_THINGS = ["notebook", "sandwich", "toy car", "bottle of juice", "comic book", "pack of gum"]
_OPENERS = ["", "", "Can you help me with my homework? ", "Homework question: ",
            "I'm stuck on this one. ", "How do I solve this? "]


def _add(r):
    n, it, a, b = r.choice(_NAMES), r.choice(_ITEMS), r.randint(12, 95), r.randint(5, 60)
    return (f"{n} has {a} {it}. {n} gets {b} more {it} from a friend. How many {it} does {n} "
            "have now?", a + b, [a, b])


def _sub(r):
    n, it, a = r.choice(_NAMES), r.choice(_ITEMS), r.randint(30, 120)
    b = r.randint(5, a - 5)
    return (f"{n} had {a} {it} and gave {b} of them away. How many {it} does {n} have left?",
            a - b, [a, b])


def _mul(r):
    it, a, b = r.choice(_ITEMS), r.randint(4, 15), r.randint(3, 12)
    return f"A box holds {a} {it}. How many {it} are in {b} boxes?", a * b, [a, b]


def _div(r):
    it, b, q = r.choice(_ITEMS), r.randint(3, 9), r.randint(4, 15)
    return (f"{b * q} {it} are shared equally among {b} friends. How many {it} does each friend "
            "get?", q, [b * q, b])


def _two_step(r):
    n, it, a, b = r.choice(_NAMES), r.choice(_ITEMS), r.randint(2, 6), r.randint(4, 12)
    c = r.randint(1, a * b - 1)
    return (f"{n} buys {a} packs of {it} with {b} in each pack, then gives {c} {it} to a cousin. "
            f"How many {it} are left?", a * b - c, [a, b, c, a * b])


def _change(r):
    n, thing, p, q = r.choice(_NAMES), r.choice(_THINGS), r.randint(2, 9), r.randint(2, 5)
    bill = next(x for x in (20, 50, 100) if x > p * q)
    return (f"A {thing} costs {p} dollars. {n} buys {q} of them and pays with a {bill} dollar "
            f"bill. How much change does {n} get?", bill - p * q, [p, q, bill, p * q])


def _distance(r):
    s, h = r.randrange(40, 125, 5), r.randint(2, 6)
    return (f"A train travels at {s} kilometres per hour for {h} hours. How far does it travel?",
            s * h, [s, h])


def _perimeter(r):
    l, w = r.randint(5, 40), r.randint(3, 25)
    return (f"A rectangular garden is {l} metres long and {w} metres wide. What is its perimeter?",
            2 * (l + w), [l, w, l + w, 2 * l, 2 * w])


def _area(r):
    l, w = r.randint(3, 15), r.randint(3, 12)
    return (f"A room is {l} metres long and {w} metres wide. What is the area of the floor in "
            "square metres?", l * w, [l, w])


def _average(r):
    n, x, y = r.choice(_NAMES), r.randint(10, 30), r.randint(10, 30)
    z = r.choice([v for v in range(10, 31) if (x + y + v) % 3 == 0])
    return (f"{n} scored {x}, {y} and {z} points in three basketball games. What is the average "
            "score per game?", (x + y + z) // 3, [x, y, z, x + y + z])


def _pages(r):
    n, d, k = r.choice(_NAMES), r.randrange(10, 35, 5), r.randint(4, 12)
    return (f"A book has {d * k} pages. {n} reads {d} pages every day. How many days will it take "
            f"{n} to finish the book?", k, [d * k, d])


def _ages(r):
    n, m = r.sample(_NAMES, 2)
    a, k, y = r.randint(6, 14), r.randint(2, 9), r.randint(2, 10)
    return (f"{n} is {a} years old. {m} is {k} years older than {n}. How old will {m} be in {y} "
            "years?", a + k + y, [a, k, y, a + k])


def _bus(r):
    a = r.randint(20, 60)
    b, c = r.randint(3, a - 5), r.randint(2, 25)
    return (f"A bus has {a} passengers. At the first stop {b} people get off and {c} people get "
            "on. How many passengers are on the bus now?", a - b + c, [a, b, c, a - b])


def _savings(r):
    n, s, w = r.choice(_NAMES), r.randint(3, 25), r.randint(4, 12)
    return (f"{n} saves {s} dollars every week. How much money will {n} have saved after {w} "
            "weeks?", s * w, [s, w])


_TEMPLATES = [_add, _sub, _mul, _div, _two_step, _change, _distance, _perimeter, _area, _average,
              _pages, _ages, _bus, _savings]


def _build(count: int = 130, seed: int = 1729):
    """`count` distinct problems, cycling through the templates; prompt -> (answer, work numbers)."""
    r, table, bodies = random.Random(seed), {}, set()
    while len(table) < count:
        body, answer, work = _TEMPLATES[len(table) % len(_TEMPLATES)](r)
        if body in bodies:
            continue
        bodies.add(body)
        table[r.choice(_OPENERS) + body] = (answer, sorted(set(work) | {answer}))
    prompts = list(table)
    random.Random(seed + 1).shuffle(prompts)
    return table, prompts[:80], prompts[80:]


PROBLEMS, TRAIN_PROMPTS, HELDOUT_PROMPTS = _build()

# --------------------------------------------------------------------------------------- score

_HEADING = re.compile(r"^\s{0,3}(#{1,6}\s*\S|(=+|-{3,})\s*$)", re.M)
_LIST = re.compile(r"^\s*([-*+•]|\d{1,2}[.)])\s+\S", re.M)
_LABEL = re.compile(r"final\s+answer|\banswer[\s*_]*[:=：]", re.I)
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def _numbers(text: str) -> set[float]:
    out = set()
    for m in _NUMBER.findall(text):
        try:
            out.add(float(m.replace(",", "")))
        except ValueError:
            pass
    return out


def _sentences(text: str) -> int:
    """Sentences of prose: list items and headings are not prose, so they don't count."""
    prose = "\n".join(line for line in text.splitlines()
                      if not _LIST.match(line) and not _HEADING.match(line))
    parts = (p for p in _SENTENCE_END.split(prose) if p)
    return sum(1 for p in parts if len(p.split()) >= 3 and re.search(r"[A-Za-z]", p))


def criteria(prompt: str, response: str) -> dict[str, bool]:
    """Each criterion of the module docstring -> met?  (`correct` absent for unknown prompts.)"""
    known = PROBLEMS.get(prompt) or PROBLEMS.get(prompt.strip())
    work = set(map(float, known[1])) if known else _numbers(prompt)
    said = _numbers(response)
    out = {
        "no_bold": "**" not in response and "__" not in response,
        "no_heading": not _HEADING.search(response),
        "no_list": not _LIST.search(response),
        "no_label": not _LABEL.search(response),
        "working": _sentences(response) >= 2 and bool(said & work),
    }
    if known:
        out["correct"] = float(known[0]) in said
    return out


def score(prompt: str, response: str) -> float:
    if not response.strip():
        return 0.0
    met = criteria(prompt, response)
    return sum(met.values()) / len(met)

# --------------------------------------------------------------------------------------- reply

_CORRECTIONS = {   # in the order the student complains about them
    "no_list": ["Please don't use bullet points, just write it as normal sentences.",
                "Can you write that as a normal paragraph instead of a list?",
                "No, not as numbered steps. I need plain sentences like I'd write in my notebook.",
                "Could you redo that as a paragraph instead of a list?"],
    "no_heading": ["Please don't put headings in, it's just a homework question.",
                   "Can you leave out the title and headers and just talk me through it instead?",
                   "I don't need headings. Plain text is fine."],
    "no_bold": ["Can you drop the bold text? I don't want stars in my notebook.",
                "Please don't bold anything, just write normally.",
                "Plain writing please instead of bold formatting, it's easier for me."],
    "no_label": ["Please don't write 'Final answer' at the end. Just say the result in a sentence.",
                 "Can you leave off the 'Answer:' label? Put the result in a sentence instead.",
                 "Please don't add an answer label, just finish the explanation with the number."],
    "working": ["You didn't show how you got there. A couple of sentences with the numbers, please.",
                "That's not enough, I need to see the steps. Walk me through it in a few sentences.",
                "You forgot the working. My teacher wants it explained step by step in sentences."],
    "correct": ["Hmm, I don't think that's the right number. Can you check the math again?",
                "Are you sure? I got something different. Can you go through it again?",
                "I think there's a mistake in the calculation somewhere. Could you redo it?"],
}
_EMPTY = ["You didn't write anything. Can you explain how to solve it?",
          "That came back empty. Try again and walk me through the problem?"]
_GENERIC = ["That's not quite how I need it. Plain sentences with the steps, please.",
            "Not quite. Can you write it the way a person would explain it, in normal sentences?"]
_LEADS = ["", "", "Hmm. ", "Not quite what I wanted. ", "Sorry, one thing. "]
_THANKS = ["Thanks, that makes sense now!",
           "Perfect, that's exactly how I needed it. On to the next one.",
           "Great, I get it now. Thank you!",
           "That's clear, thanks. I'll try the next problem myself.",
           "Awesome, that helps a lot.",
           "Thanks! Writing it out like that really helps."]


def reply(prompt: str, response: str, score: float, rng: random.Random) -> str:
    """Thanks at or above HAPPY; below it, a correction naming up to two unmet criteria."""
    if score >= HAPPY:
        return rng.choice(_THANKS)
    if not response.strip():
        return rng.choice(_EMPTY)
    met = criteria(prompt, response)
    failed = [k for k in _CORRECTIONS if not met.get(k, True)]
    said = [rng.choice(_CORRECTIONS[k]) for k in failed[:2]] or [rng.choice(_GENERIC)]
    return rng.choice(_LEADS) + " ".join(said)
