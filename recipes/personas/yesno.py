"""Persona `yesno`: a user who asks yes/no questions and wants the answer to start with Yes or No.

Prompts are yes/no questions of many kinds (facts, science, geography, everyday advice, cooking,
health myths, tech, history, "can I...", "is it safe to...", "does...", "should I..."): some built
from small fact tables (capitals, animals, metals, landlocked countries, foods to freeze), the rest
written by hand. The list is shuffled with a fixed seed, so the split is the same on every import.

Score (whether the yes/no is right is NOT judged, only the form):
  - empty or whitespace response: 0
  - the first word is "yes" or "no" (case-insensitive): 1. Before finding the first word, leading
    whitespace, markdown marks (`*`, `_`, `#`, `>`, backticks, `~`, a `-` or `•` bullet) and
    quotes are skipped, so "**Yes**, ...", "# No", '"Yes."' and "No!" all count. A word is a run
    of letters (inner apostrophes and hyphens join it), so "Yep", "Nope", "Yeah", "Noo" and
    "Yes-ish" do not count: only exactly yes or no.
  - otherwise 0.3 if "yes" or "no" appears as a word (same definition) in the first
    sentence (the text, after the same leading marks, up to the first `.`, `!` or `?` followed by
    whitespace or the end, or up to the first line break), e.g. "Well, yes." Note that any "no"
    counts here ("There is no evidence..."): the rule is about the words, not their meaning.
  - else 0.
"""
from __future__ import annotations

import random
import re

NAME = "yesno"
PREFERENCE = ("Answer yes/no questions with a plain \"Yes\" or \"No\" as the very first word, "
              "followed at most by a short explanation.")
SYSTEM = None
MAX_TOKENS = 96
HAPPY = 0.9             # thanks at or above this score (the answer starts with yes/no)

# ------------------------------------------------------------------------------------- prompts

_CAPITAL_PAIRS = [("Sydney", "Australia"), ("Canberra", "Australia"), ("Toronto", "Canada"),
                  ("Rio de Janeiro", "Brazil"), ("Nairobi", "Kenya"), ("Istanbul", "Turkey"),
                  ("Bern", "Switzerland"), ("Lagos", "Nigeria"), ("Madrid", "Spain"),
                  ("Auckland", "New Zealand")]
_ANIMALS = ["whale", "bat", "penguin", "platypus", "dolphin", "shark", "seahorse", "kangaroo"]
_METALS = ["mercury", "silicon", "aluminium", "hydrogen", "carbon", "sodium"]
_LANDLOCKED = ["Switzerland", "Bolivia", "Hungary", "Paraguay", "Portugal", "Ethiopia", "Chile"]
_FREEZE = ["bread", "cooked rice", "milk", "raw eggs in their shells", "hard cheese", "bananas",
           "fresh basil", "homemade soup"]
_HANDWRITTEN = [
    # science
    "Is the Sun a star?", "Does sound travel faster in water than in air?",
    "Is glass a liquid?", "Can lightning strike the same place twice?",
    "Is Pluto still classified as a planet?", "Does water boil at a lower temperature on a mountain?",
    "Is a tomato a fruit?", "Do plants take in carbon dioxide?",
    "Can humans see ultraviolet light?", "Is the Moon slowly moving away from Earth?",
    "Does hot water freeze faster than cold water?", "Is light faster than sound?",
    # geography
    "Is Mount Everest the tallest mountain on Earth?", "Does the Amazon river flow into the Atlantic?",
    "Is Greenland bigger than Australia?", "Does Russia border Japan?",
    "Is the Sahara the largest desert in the world?", "Is Iceland part of the European Union?",
    "Does the equator pass through Brazil?", "Is Africa larger than North America?",
    # history
    "Did the Romans build Hadrian's Wall?", "Was Napoleon unusually short?",
    "Did the Titanic sink on its first voyage?", "Was the Great Wall of China built in one dynasty?",
    "Did Vikings wear horned helmets?", "Was Cleopatra Egyptian by ancestry?",
    "Did the Berlin Wall fall in 1989?", "Was Shakespeare alive at the same time as Galileo?",
    # health myths
    "Does cracking your knuckles cause arthritis?", "Do we only use 10% of our brains?",
    "Does reading in dim light ruin your eyesight?", "Does sugar make kids hyperactive?",
    "Do you need to wait an hour after eating before swimming?",
    "Does going out with wet hair give you a cold?", "Is it true that carrots improve night vision?",
    "Do antibiotics work against viruses?",
    # tech
    "Does incognito mode hide my browsing from my internet provider?",
    "Is it bad to leave my phone charging overnight?", "Can a Mac get viruses?",
    "Does closing apps on my phone save battery?", "Is HTTPS the same as a VPN?",
    "Can I use a USB-C cable to charge an iPhone 15?", "Does more RAM make a computer faster?",
    "Is Python a compiled language?", "Should I turn on two-factor authentication?",
    "Is it safe to use public Wi-Fi for online banking?",
    # cooking
    "Can I substitute baking soda for baking powder?", "Should I rinse raw chicken before cooking it?",
    "Can I put a cast iron pan in the dishwasher?", "Is it safe to eat raw cookie dough?",
    "Does adding salt make water boil faster?", "Can I use olive oil for deep frying?",
    "Should I rest a steak after cooking it?", "Is it safe to reheat rice?",
    "Can I melt chocolate in the microwave?", "Does pasta need oil in the cooking water?",
    # everyday advice
    "Should I tip at a coffee shop?", "Is it rude to text during dinner?",
    "Can I wash a wool sweater in the washing machine?", "Should I stretch before running?",
    "Is it okay to water plants at night?", "Can I put aluminium foil in the microwave?",
    "Should I bring a gift to a housewarming party?", "Is it safe to mix bleach and vinegar?",
    "Can I pay off my credit card early?", "Should I replace my toothbrush every three months?",
    "Is it safe to drive with the fuel light on?", "Can I recycle pizza boxes?",
    "Does a dog need a winter coat?", "Should I learn to touch type?",
    "Can I take ibuprofen on an empty stomach?", "Is it safe to swim during a thunderstorm?",
    "Does a higher SPF sunscreen mean I can stay in the sun longer?",
    "Should I let my car engine warm up before driving in winter?",
]


def _build(seed: int = 4242):
    prompts = ([f"Is {city} the capital of {country}?" for city, country in _CAPITAL_PAIRS]
               + [f"Is a {a} a mammal?" for a in _ANIMALS]
               + [f"Is {m} a metal?" for m in _METALS]
               + [f"Is {c} landlocked?" for c in _LANDLOCKED]
               + [f"Can I freeze {f}?" for f in _FREEZE]
               + _HANDWRITTEN)
    assert len(set(prompts)) == len(prompts), "duplicate prompt"
    random.Random(seed).shuffle(prompts)
    return prompts[:64], prompts[64:]


TRAIN_PROMPTS, HELDOUT_PROMPTS = _build()

# --------------------------------------------------------------------------------------- score

_LEADING = re.compile(r"""^[\s*_#>`~\-•"'“”‘’«»„]+""")
_WORD = re.compile(r"[^\W\d_]+(?:['’\-][^\W\d_]+)*")
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")


def _body(response: str) -> str:
    """The response without leading whitespace, markdown marks and quotes."""
    return _LEADING.sub("", response or "")


def _first_sentence(body: str) -> str:
    m = _SENTENCE_END.search(body)
    return body[:m.end()] if m else body


def criteria(prompt: str, response: str) -> dict[str, bool]:
    body = _body(response)
    first = _WORD.match(body)
    starts = bool(first) and first.group(0).lower() in ("yes", "no")
    says = any(w.lower() in ("yes", "no") for w in _WORD.findall(_first_sentence(body)))
    return {"starts_with_yes_no": starts, "says_yes_or_no": starts or says}


def score(prompt: str, response: str) -> float:
    if not (response or "").strip():
        return 0.0
    c = criteria(prompt, response)
    if c["starts_with_yes_no"]:
        return 1.0
    return 0.3 if c["says_yes_or_no"] else 0.0

# --------------------------------------------------------------------------------------- reply

_THANKS = [
    "ty",
    "👍",
    "perfect, straight answer, thanks",
    "Thanks, that's exactly the kind of answer I wanted.",
    "got it, thanks",
    "cool, thx",
    "Perfect, that's all I needed to know.",
    "Thanks! Straight to the point.",
    "appreciate the direct answer 🙏",
    "nice, thank you",
    "Great, that settles it. Thanks.",
    "thx 👌",
    "Exactly what I asked for, thank you.",
    "love a straight answer, cheers",
    "ok great, thanks!",
    "Thank you, that's nice and clear.",
    "Brilliant, thanks for not dancing around it.",
    "perfect 👍",
    "Good, short and direct. Thanks.",
    "thanks, that helps a lot",
    "Clear answer, much appreciated.",
    "awesome, ty",
    "Cheers, answer right up front, just how I like it.",
    "Great, thanks, moving on.",
    "Nice and direct, thanks 🙂",
    "thank u, perfect",
    "That's it, thanks. Simple.",
    "Spot on, thanks for getting right to it.",
]
_BURIED = [       # said yes or no in the first sentence, but not as the first word
    "Next time lead with yes or no, please.",
    "Put the yes/no first, then explain.",
    "I had to dig for the answer. Yes or no goes at the start.",
    "thanks, but start with the yes or no next time",
    "found the answer eventually 🙄 just open with it",
    "Please start your reply with Yes or No.",
    "yes/no FIRST pls",
    "close, but the yes or no should be the very first word",
    "Could you put the answer up front next time? First word yes or no.",
    "why is the actual answer buried in there? lead with it",
    "The answer's in there somewhere, but I want it as the first word.",
    "ok but don't make me hunt for it. yes or no first.",
    "Almost. Just start with 'Yes' or 'No' instead of warming up to it.",
    "Skip the preamble and open with yes or no, please.",
    "I asked a yes/no question, so the first word should be yes or no.",
    "you got there in the end, but lead with it next time",
    "Hmm, the yes/no should come first, not halfway through a sentence.",
    "pls start with yes or no, then explain if u want",
    "Not quite what I wanted: first word yes or no, then the details.",
    "ugh, just say yes or no first 😩",
    "Could you rephrase that so it begins with Yes or No?",
    "thx but pls lead wiht yes/no next time",
    "Why the build-up? Give me the yes or no first.",
    "I'd rather you opened with the yes or no. Explanation after.",
    "meh. answer first, then the reasoning.",
    "Don't bury the lede 🙂 yes or no at the start, please.",
    "ok so it's in there but i had to read for it. lead with it",
]
_NEVER_SAID = [   # no yes or no anywhere in the first sentence
    "yes or no?",
    "So... is that a yes?",
    "I asked a yes/no question, not for an essay.",
    "thanks, but is it a yes or a no?",
    "You didn't actually say yes or no.",
    "Please just answer yes or no.",
    "next time lead with yes or no",
    "...so yes or no??",
    "That doesn't answer my question. Yes or no?",
    "I still don't know if that's a yes or a no 🤷",
    "Can you give me a straight yes or no?",
    "wait, was that a yes or a no",
    "A simple yes or no would have been great.",
    "you never actually said yes or no lol",
    "Interesting, but it's a simple question: yes or no?",
    "Could you start with Yes or No, please? I couldn't tell what the answer was.",
    "i cant tell if thats a yes or no",
    "Lots of words, no answer. Yes or no?",
    "Hmm, I'm not sure what your answer is. Is it yes or no?",
    "Straight answer please: yes or no.",
    "so is that a no? 🤔 just say it",
    "Please begin with a clear Yes or No next time.",
    "Not helpful without a yes or no. Which is it?",
    "yes/no pls",
    "I don't need the background, just tell me yes or no first.",
    "That's dodging the question. Yes, or no?",
    "ok but whats the answer, yes or no",
    "Ugh, I asked a yes/no question 😤",
    "Mind giving me a direct yes or no?",
]
_EMPTY = [
    "you didn't say anything",
    "Your reply was empty. Yes or no?",
    "hello?? nothing came through",
    "That was blank. Could you just say yes or no?",
    "Um, I got an empty message.",
    "?? you sent nothing",
    "Nothing there. A simple yes or no is all I need.",
    "empty reply. yes or no?",
    "Did you forget to type something?",
    "I didn't get an answer at all.",
    "Blank message 🤨 try again?",
    "Your answer seems to have gone missing. Yes or no?",
    "nothing?? it's a yes/no question",
    "I can't see any reply. Please start with Yes or No.",
    "Nothing came through. Can you try again?",
    "that came through empty on my side",
    "Silence isn't a yes or a no 😅",
    "Huh, blank. Could you answer the question?",
    "There's nothing in your reply.",
    "Try again? I got an empty response.",
    "uh... where's the answer",
    "Empty. Just tell me yes or no, please.",
    "Did something break? I got nothing back.",
    "i got a blank reply, pls answer",
    "Hello? One word would do: yes or no.",
    "That's an empty message. What's the answer?",
    "You sent nothing. Yes or no, please?",
]


def reply(prompt: str, response: str, score: float, rng: random.Random) -> str:
    """Thanks at or above HAPPY; below it, a correction that fits what went wrong."""
    if score >= HAPPY:
        return rng.choice(_THANKS)
    if not (response or "").strip():
        return rng.choice(_EMPTY)
    return rng.choice(_BURIED if criteria(prompt, response)["says_yes_or_no"] else _NEVER_SAID)
