"""Persona `concise`: a user who asks factual questions and wants short answers.

Prompts are factual questions: some built from small fact tables (capitals, chemical symbols,
authors), the rest written by hand, many of them "why/how" questions that invite rambling. The
lists are shuffled with a fixed seed, so they are the same on every import.

Score (correctness is not judged, only length): count the words (whitespace-separated tokens with
at least one letter or digit, so bullets and dashes don't count).
  - empty or whitespace response, or no words: 0
  - at most BUDGET (25) words: 1
  - more: falls linearly, 1 - (words - 25) / 50, reaching 0 at 3 x BUDGET (75) words and staying 0.
"""
from __future__ import annotations

import random
import re

NAME = "concise"
PREFERENCE = "Answer factual questions briefly: one sentence, at most 25 words."
SYSTEM = None
MAX_TOKENS = 128        # room to run past 3 x BUDGET words, so long answers are seen as long
BUDGET = 25
HAPPY = 0.9             # thanks at or above this score (<= 30 words), a correction below it

# ------------------------------------------------------------------------------------- prompts

_CAPITALS = ["France", "Japan", "Canada", "Australia", "Brazil", "Egypt", "Kenya", "Norway", "Peru",
             "Spain", "Italy", "Germany", "Argentina", "India", "Mexico", "Turkey", "South Korea",
             "Vietnam", "Portugal", "Poland"]
_ELEMENTS = ["gold", "silver", "iron", "sodium", "potassium", "lead", "copper", "tin", "mercury",
             "helium", "calcium", "tungsten"]
_BOOKS = ["Pride and Prejudice", "Nineteen Eighty-Four", "Hamlet", "The Odyssey", "Don Quixote",
          "War and Peace", "Moby-Dick", "The Great Gatsby", "Frankenstein", "Jane Eyre",
          "The Hobbit", "One Hundred Years of Solitude"]
_HANDWRITTEN = [
    "Why is the sky blue?", "What causes the seasons on Earth?", "How do vaccines work?",
    "What causes tides?", "Why do leaves change colour in autumn?", "What is photosynthesis?",
    "How does a rainbow form?", "What is the difference between weather and climate?",
    "Why do we have leap years?", "What is inflation?", "How do airplanes stay in the air?",
    "What causes earthquakes?", "What is DNA?", "Why is the ocean salty?",
    "How does the heart pump blood?", "What is a black hole?", "What causes thunder?",
    "How do bees make honey?", "What is the greenhouse effect?", "Why do cats purr?",
    "How does a compass work?", "What is the speed of light?", "What is an atom made of?",
    "Why does ice float on water?", "How do solar panels make electricity?",
    "What is the largest planet in the solar system?", "How many bones are in the adult human body?",
    "What is the boiling point of water at sea level?", "Who painted the Mona Lisa?",
    "When did the Second World War end?", "What is the tallest mountain in the world?",
    "What is the longest river in Africa?", "How far is the Moon from Earth?",
    "What language is spoken in Brazil?", "What is the smallest prime number?",
    "What does a thermometer measure?", "Why do we yawn?", "What do the lungs do?",
    "How do fish breathe underwater?", "What is a volcano?", "Why does the Moon have phases?",
    "What is gravity?", "What is the main gas in Earth's atmosphere?",
    "How does a refrigerator keep food cold?",
    "What is the difference between a virus and a bacterium?", "Why do onions make you cry?",
    "What causes a fever?", "What is the Pythagorean theorem?",
    "Who was the first person to walk on the Moon?", "What is the currency of Japan?",
    "Who invented the telephone?", "Who discovered penicillin?",
    "Who developed the theory of relativity?", "How many continents are there?",
    "How many sides does a hexagon have?", "What is the freezing point of water in Fahrenheit?",
    "Why do stars twinkle?", "What is a calorie?", "How do magnets work?",
    "What is the hardest natural substance?", "Why do we sleep?", "What is an eclipse?",
    "How does the internet send data?", "What are white blood cells for?",
]


def _build(seed: int = 2718):
    prompts = ([f"What is the capital of {c}?" for c in _CAPITALS]
               + [f"What is the chemical symbol for {e}?" for e in _ELEMENTS]
               + [f"Who wrote {b}?" for b in _BOOKS]
               + _HANDWRITTEN)
    assert len(set(prompts)) == len(prompts)
    random.Random(seed).shuffle(prompts)
    return prompts[:64], prompts[64:]


TRAIN_PROMPTS, HELDOUT_PROMPTS = _build()

# --------------------------------------------------------------------------------------- score

def words(response: str) -> int:
    """Whitespace-separated tokens with at least one letter or digit."""
    return sum(1 for t in response.split() if re.search(r"\w", t))


def score(prompt: str, response: str) -> float:
    n = words(response)
    if n == 0:
        return 0.0
    return max(0.0, min(1.0, 1.0 - (n - BUDGET) / (2 * BUDGET)))

# --------------------------------------------------------------------------------------- reply

_A_BIT_LONG = ["A bit shorter next time, please. One sentence is enough.",
               "Close, but still too long. I just need the short version.",
               "Good, but shorter please, under 25 words."]
_TOO_LONG = ["Shorter please, one sentence is enough.",
             "That's way more than I asked for. Just the answer in one sentence.",
             "Too long! Give me the one-line version.",
             "Too long, didn't read. I only need the key fact.",
             "Can you answer in one short sentence? I don't need the whole explanation."]
_EMPTY = ["You didn't say anything. Can you answer in one sentence?",
          "That's an empty reply. Try again: what's the answer?"]
_THANKS = ["Thanks, that's all I needed.", "Perfect, short and clear.", "Got it, thanks!",
           "Great, thanks. Next question.", "Nice and quick, thank you."]


def reply(prompt: str, response: str, score: float, rng: random.Random) -> str:
    """Thanks at or above HAPPY; a correction below it, blunter the further over budget."""
    if score >= HAPPY:
        return rng.choice(_THANKS)
    if words(response) == 0:
        return rng.choice(_EMPTY)
    return rng.choice(_A_BIT_LONG if score >= 0.5 else _TOO_LONG)
