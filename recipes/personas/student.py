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
    "no_list": [
        "Please don't use bullet points, just write it as normal sentences.",
        "Can you write that as a normal paragraph instead of a list?",
        "No, not as numbered steps. I need plain sentences like I'd write in my notebook.",
        "Could you redo that as a paragraph instead of a list?",
        "no lists pls, just sentences",
        "My teacher doesn't let us write the steps as a list. Can you put it in sentences?",
        "Why is it all bullet points? I need to copy it out as normal writing.",
        "Can you explain it like you're talking to me instead of making a list?",
        "The numbered steps are confusing, can you just write it out in a paragraph?",
        "I can't hand in a list. Please write the steps as sentences.",
        "Next time no bullets please, just explain it in sentences.",
        "Could you turn the list into proper sentences?",
        "please just write it out normally without the 1, 2, 3 steps",
        "It looks like a shopping list lol. Can you write it as a paragraph?",
        "We're supposed to explain in full sentences, not bullet points.",
        "Can you join the steps up into sentences instead of listing them?",
        "not a list!! sentences please",
        "I'd rather have it as one paragraph, not a bunch of bullet points.",
        "The list thing doesn't work for my homework. Plain sentences please.",
        "Could you write the steps one after another in sentences, like 'first... then...'?",
        "Please lose the bullet points. I need it written like a normal explanation.",
        "Lists again? Just sentences please 🙏",
        "Can you say it in a paragraph? The numbered list isn't how we do it in class.",
        "no bullet points or numbers at the start of lines please, just normal writing",
        "That's a list, but I need plain sentences. Can you rewrite it?",
        "I have to write it in sentences in my own words, so a list doesn't really help.",
    ],
    "no_heading": [
        "Please don't put headings in, it's just a homework question.",
        "Can you leave out the title and headers and just talk me through it instead?",
        "I don't need headings. Plain text is fine.",
        "no headings pls",
        "Why are there section titles? It's one maths problem.",
        "Could you take out the headers? It looks like a report, not homework.",
        "Skip the headings next time, just explain it.",
        "It doesn't need a title, just write the explanation.",
        "Can you get rid of the big heading lines? I just want normal text.",
        "The headings make it look weird in my notes. Can you leave them out?",
        "Please just write it, no 'Step 1' titles or headers.",
        "It's a short question, it doesn't need sections with headings.",
        "Can you write it without the title at the top?",
        "no headers, just sentences please",
        "I don't want it split up under headings. Just one explanation.",
        "Too many headings 😅 can you just write it normally?",
        "Could you drop the headings? My teacher wants plain writing.",
        "Why does it have headers like an essay? Just explain it normally please.",
        "Headings aren't needed for this. Just talk me through it.",
        "Please remove the titles and write it as plain text.",
        "I can't copy the headings into my homework, can you leave them out?",
        "Just the explanation please, no headings above it.",
        "Can you not format it with section headings? Plain is better.",
        "it's homework not a document, no headings pls",
        "The headers are too much for one question. Just write it out.",
        "Could you do it again without the heading lines?",
    ],
    "no_bold": [
        "Can you drop the bold text? I don't want stars in my notebook.",
        "Please don't bold anything, just write normally.",
        "Plain writing please instead of bold formatting, it's easier for me.",
        "no bold pls",
        "Why are there stars around some words? Can you write it without bold?",
        "The bold bits show up as little stars for me. Can you leave them out?",
        "Could you not make things bold? Plain text is fine.",
        "Please take out the bold, I'm copying it by hand.",
        "Next time no bold words please.",
        "I don't need anything highlighted in bold, just normal sentences.",
        "Can you get rid of the double asterisks?",
        "The bold makes it look messy. Can you just write it plainly?",
        "Please write it without any bold, my teacher wants it plain.",
        "bold text isnt needed, just normal writing",
        "Can you stop bolding the numbers? Just write them normally.",
        "Skip the bold formatting please, it's just homework.",
        "There's a lot of bold in there 😅 can you write it plain?",
        "Could you redo it without the bold parts?",
        "Please no bold. It just looks like random asterisks in my notes.",
        "Please just use normal text, nothing in bold.",
        "Can you write it without making anything bold? It doesn't need emphasis.",
        "no stars/bold please, it's hard to read",
        "Can you leave out the bold? I only need plain sentences.",
        "I don't like the bold words, can you take them out?",
        "Bold isn't necessary, just explain it normally.",
        "Why is half of it in bold? Plain writing please.",
    ],
    "no_label": [
        "Please don't write 'Final answer' at the end. Just say the result in a sentence.",
        "Can you leave off the 'Answer:' label? Put the result in a sentence instead.",
        "Please don't add an answer label, just finish the explanation with the number.",
        "no 'final answer' bit pls, just say it in the sentence",
        "Can you end with a normal sentence instead of 'Final answer:'?",
        "My teacher marks us down for writing 'Answer:'. Can you just say the result in the last sentence?",
        "Please drop the answer label at the end.",
        "I don't need 'Final answer' written out, just tell me the result as part of the explanation.",
        "Can you not use an 'Answer =' line? A sentence is better.",
        "Skip the 'Final answer' label next time please.",
        "Why does it say 'Final answer'? Just finish the sentence with the number.",
        "Could you take out the answer label and just say it normally?",
        "no answer label please",
        "Please write the result in a full sentence, not after 'Answer:'.",
        "The 'Final answer' thing isn't how we write it. Can you leave it off?",
        "Can you just say what it comes to, without labelling it as the answer?",
        "Please don't put 'Answer:' in front of the number.",
        "Leave out the 'Final answer' part, just end with a normal sentence.",
        "i dont want a label at the end, just say the number in the explanation",
        "It looks like a worksheet with 'Final answer' there. Can you just say it naturally?",
        "Can you get rid of the 'Answer:' bit? I want it to read like normal writing.",
        "Please finish with a sentence like you're telling me, not a label.",
        "The label at the end isn't needed. Just put the result in the last sentence.",
        "Could you say the result without writing 'final answer'? 🙏",
        "We're not allowed to write 'Answer =' in our homework. Can you change that?",
        "Not a fan of the 'Final answer:' line. Say it in a sentence please.",
    ],
    "working": [
        "You didn't show how you got there. A couple of sentences with the numbers, please.",
        "That's not enough, I need to see the steps. Walk me through it in a few sentences.",
        "You forgot the working. My teacher wants it explained step by step in sentences.",
        "but how did you get that? i need the working",
        "I need to show my work, so can you explain the steps with the numbers?",
        "Can you explain how you worked it out? Just the result isn't enough.",
        "My teacher will ask where that came from. Can you show the working in sentences?",
        "That's too short, I don't get how you got it. Can you go through it step by step?",
        "Where's the working? I need to write the steps down.",
        "Can you walk me through it with the actual numbers from the question?",
        "I have to show the calculation, not just the result. Could you explain it?",
        "Please explain it properly, like what you do first and what you do next.",
        "show the steps pls",
        "I still don't understand how to get there. Can you explain each step in a sentence?",
        "Could you write out the working? A few sentences with the sums would help.",
        "That skips all the steps. I need to see what numbers you used.",
        "It's too short to copy into my homework. Can you explain how you did it?",
        "Hang on, how? Can you write out the calculation in sentences?",
        "I'll lose marks without the working. Can you show it?",
        "Can you explain the method too, not just give me the end? Use the numbers please.",
        "need the working too, not just the answer 😕",
        "Please show me how to solve it, with the numbers, in a couple of sentences.",
        "You didn't explain anything. Can you go through it step by step?",
        "I don't see any working. What did you add or multiply to get that?",
        "Can you say what you did with the numbers? I need to understand the steps.",
        "Explain it more please. I need at least a couple of sentences showing the maths.",
    ],
    "correct": [
        "Hmm, I don't think that's the right number. Can you check the math again?",
        "Are you sure? I got something different. Can you go through it again?",
        "I think there's a mistake in the calculation somewhere. Could you redo it?",
        "that doesnt look right to me",
        "I worked it out and got a different number. Can you check yours?",
        "Hold on, that can't be right. Can you double-check?",
        "My calculator says something else. Which one is right?",
        "I think you made a mistake somewhere. Can you check each step?",
        "That's not what the back of the book says. Can you try again?",
        "The numbers don't add up. Could you redo the maths?",
        "Is that right? It doesn't match what I got.",
        "I'm pretty sure that's wrong. Can you check it again?",
        "wrong answer i think, can u check",
        "Can you check your working? I think the result is off.",
        "I don't think that's correct. Could you go over the calculation again?",
        "That doesn't seem right. Can you re-read the question and try again?",
        "The number at the end looks wrong to me. Can you recheck it?",
        "Something's off in the maths there 🤔 can you look again?",
        "My friend got a different answer too. Can you check it?",
        "I checked it and it doesn't work out. Where did that number come from?",
        "That's not what I get when I do it. Can you redo it carefully?",
        "I think you mixed up a step. Could you go through the numbers again?",
        "That answer seems off. Can you do the calculation again, slowly?",
        "I don't think that's it. Could you check the numbers from the question?",
        "Pretty sure there's a mistake. Please check the sums again.",
        "That can't be the answer, it doesn't make sense. Can you check?",
    ],
}
_EMPTY = [
    "You didn't write anything. Can you explain how to solve it?",
    "That came back empty. Try again and walk me through the problem?",
    "hello? theres nothing there",
    "Your answer is blank. Can you help me with the question?",
    "Um, I didn't get anything. Can you try again?",
    "It's empty! I still need help with this one.",
    "Nothing showed up. Can you explain the problem again?",
    "Did you forget to write something? There's no answer.",
    "blank reply?? i still need help",
    "I can't see any explanation. Could you try again?",
    "You sent an empty message. Can you show me how to do it?",
    "There's nothing there 😕 can you explain it?",
    "That's blank. Could you go through the problem with me?",
    "I didn't get any reply. Can you help me work it out?",
    "Huh, nothing came through. Please try again.",
    "Your message was empty. Can you walk me through it?",
    "Wait, where's the explanation?",
    "No answer came up. Can you try one more time?",
    "I got an empty reply. I really need help with this.",
    "There's no text. Can you explain how to do the problem?",
    "empty?? can you actually help with the question",
    "Nothing there. Could you explain it in a few sentences?",
    "It looks like your reply didn't send. Can you try again?",
    "I can't copy nothing into my homework 😅 can you explain it?",
    "You left it blank. How do I solve this?",
    "Did it break? I got nothing back.",
]
_GENERIC = [
    "That's not quite how I need it. Plain sentences with the steps, please.",
    "Not quite. Can you write it the way a person would explain it, in normal sentences?",
    "eh, that's not really what i need",
    "Can you try again? I need it explained in plain sentences.",
    "That's not how my teacher wants it. Just normal writing that shows the steps.",
    "It's not quite right for my homework. Could you redo it?",
    "Could you explain it more simply, like you'd tell a friend?",
    "I can't really use that. Can you write it out in normal sentences with the working?",
    "Not what I was looking for. Just explain it plainly, step by step.",
    "Can you write it differently? Plain sentences, showing how you got there.",
    "That doesn't work for me. Please just talk me through it in sentences.",
    "Nearly, but it's not how I need it. Can you redo it?",
    "no, not like that. just explain it normally pls",
    "That's not the style I need. Plain text that shows the working, please.",
    "Could you do that again, but just as plain writing I can copy into my notebook?",
    "I need it more like a normal explanation. Can you try again?",
    "Something's off with how it's written. Plain sentences please.",
    "This isn't how we write it in class. Can you just explain it in sentences?",
    "Try again please, simpler and in normal sentences.",
    "That's not really it 😕 can you explain it in plain words with the steps?",
    "It needs to read like normal sentences. Can you rewrite it?",
    "Can you redo it so it's just sentences showing what you did?",
    "Not the way I need it. Just write it out like a person would.",
    "I don't think I can hand that in. Can you explain it plainly with the working?",
    "Could you change how that's written? Just a simple explanation in sentences.",
    "That's not quite it. Write it out properly in sentences please.",
]
_LEADS = ["", "", "", "Hmm. ", "Not quite what I wanted. ", "Sorry, one thing. ", "Wait. ",
          "Um. ", "Not quite. ", "Almost. ", "Sorry to be picky. ", "Nope. ", "Quick thing. ",
          "Ugh. ", "Hmm, not yet. ", "Close, but not quite. "]
_THANKS = [
    "Thanks, that makes sense now!",
    "Perfect, that's exactly how I needed it. On to the next one.",
    "Great, I get it now. Thank you!",
    "That's clear, thanks. I'll try the next problem myself.",
    "Awesome, that helps a lot.",
    "Thanks! Writing it out like that really helps.",
    "ty!!",
    "👍",
    "oh that makes sense, thanks",
    "Perfect, I can copy that into my notebook. Thanks!",
    "Yay, I understand it now 😊",
    "That's exactly how my teacher wants it, thank you!",
    "ok got it, thx",
    "Thanks so much, that was really easy to follow.",
    "Ohh I see where I went wrong now. Thanks!",
    "Cool, thanks! Moving on to the next one.",
    "That's so much clearer, thank you.",
    "Great explanation, thanks!",
    "Nice, the steps make sense. Thank you!",
    "thank youu, that helped",
    "Got it! Thanks for showing the working.",
    "Perfect, that's just what I needed 🙌",
    "Makes sense now, thanks a lot.",
    "Ahh okay, I get it. Thank you!",
    "Thanks, that's really helpful. I think I can do the rest now.",
    "Brilliant, that's the way I needed it explained.",
]


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
