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

_A_BIT_LONG = [   # a little over budget (26-50 words): mild, mostly polite
    "A bit shorter next time, please. One sentence is enough.",
    "Close, but still too long. I just need the short version.",
    "Good, but shorter please, under 25 words.",
    "thanks, but could you trim it a bit?",
    "Almost, just a little wordy. One sentence would do.",
    "slightly shorter pls",
    "Could you maybe cut that down a bit? Half of it would be fine.",
    "Fine, but next time just the first sentence is plenty.",
    "That's a touch long for such a simple question.",
    "ok but a bit long. trim it?",
    "Nearly there. Drop the extra detail and it would be perfect.",
    "Can you say that in one sentence instead of a few?",
    "Right answer I think, just more words than I need.",
    "you could've stopped after the first sentence tbh",
    "A little long-winded. Keep it to one line next time, please.",
    "Good info, but I only wanted the gist.",
    "Hmm, shorter would be better. Just the key point.",
    "Slightly too much. I skim, so one short sentence works best for me.",
    "Could you tighten that up? It's a bit much.",
    "thx, but shorter next time, one sentence max",
    "That's a little more than I needed. Can you condense it?",
    "Pretty good, but cut the extras please.",
    "a tad long, can u shorten it",
    "Next time skip the extra explanation and just give me the answer.",
    "Not bad, but I asked for short. Could you trim the second half?",
    "Bit wordy 😅 one sentence please.",
]
_TOO_LONG = [     # far over budget (more than 50 words): blunter
    "Shorter please, one sentence is enough.",
    "That's way more than I asked for. Just the answer in one sentence.",
    "Too long! Give me the one-line version.",
    "Too long, didn't read. I only need the key fact.",
    "Can you answer in one short sentence? I don't need the whole explanation.",
    "shorter pls",
    "I asked for one fact, not an essay.",
    "ugh, too much text",
    "Whoa, that's a wall of text. One sentence, please.",
    "tl;dr? I just wanted a quick answer.",
    "That's a lot of words for a simple question.",
    "Could you please cut that way down? A single sentence is all I want.",
    "Way too long. Just tell me the answer.",
    "I don't have time to read all that. Short version?",
    "Next time just the answer, please. No lecture.",
    "thanks, but way too long",
    "Did I ask for a whole article? One line would do.",
    "much too long, i just want the fact",
    "Please, shorter. I stopped reading halfway through.",
    "That's a paragraph or three. Can you boil it down to one sentence?",
    "Way more detail than I wanted 🙄 just the short answer.",
    "You lost me after the first few lines. Give me the one-sentence version.",
    "Could you maybe trim it a lot? Like, down to one sentence?",
    "I wanted a quick fact, not a textbook page. Try again, shorter.",
    "Too wordy. Skip the background and just answer.",
    "why so long?? one sentence pls",
    "Honestly that's way too much. Keep it under 25 words.",
]
_EMPTY = [
    "You didn't say anything. Can you answer in one sentence?",
    "That's an empty reply. Try again: what's the answer?",
    "hello? there's nothing there",
    "You sent a blank message.",
    "Um, I didn't get an answer.",
    "Nothing came through. Can you try again?",
    "empty reply?",
    "Did you forget to type the answer?",
    "I got nothing back. What's the answer?",
    "There's no answer in that. Just one sentence, please.",
    "That's blank. Could you actually answer the question?",
    "??? no answer",
    "Your reply is empty. Try again?",
    "I can't see any words in that. What's the answer?",
    "Looks like your answer got lost. Can you resend?",
    "nothing there, try again pls",
    "Short is good, but not that short 😅 You didn't answer.",
    "Huh, that's empty. I still need the answer.",
    "You didn't actually answer. One short sentence is fine.",
    "Blank response. Can I get the answer, please?",
    "uh, where's the answer?",
    "That came through empty on my end. Could you answer again?",
    "I asked a question and got nothing. Try again.",
    "No text at all? Please just give me the answer.",
    "Nothing there. A one-line answer would be great.",
    "Did something break? Your reply has no answer in it.",
]
_THANKS = [
    "Thanks, that's all I needed.",
    "Perfect, short and clear.",
    "Got it, thanks!",
    "Great, thanks. Next question.",
    "Nice and quick, thank you.",
    "ty",
    "👍",
    "Perfect, exactly the length I wanted, thanks!",
    "great, thx",
    "Short and to the point. Thank you.",
    "That's the kind of answer I like, cheers.",
    "perfect 👌",
    "Thanks! Moving on.",
    "Exactly what I was after, thanks.",
    "cool, thanks",
    "Spot on, thank you.",
    "Appreciate the short answer, thanks.",
    "Brilliant, thanks a lot.",
    "ok thanks, next one",
    "Yep, that's what I needed. Cheers!",
    "Lovely, nice and brief. Thanks!",
    "thank you, that's perfect",
    "Much appreciated, straight to the point.",
    "Nice one, thanks 🙂",
    "Ah ok, thanks! That's all.",
    "Perfect. Short answers like that are all I want.",
    "thx, that helps",
]


def reply(prompt: str, response: str, score: float, rng: random.Random) -> str:
    """Thanks at or above HAPPY; a correction below it, blunter the further over budget."""
    if score >= HAPPY:
        return rng.choice(_THANKS)
    if words(response) == 0:
        return rng.choice(_EMPTY)
    return rng.choice(_A_BIT_LONG if score >= 0.5 else _TOO_LONG)
