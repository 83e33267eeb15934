"""Persona `teacher`: a teacher who wants short, specific, kind grading comments on student essays.

Prompts are short essays built from templates with a fixed seed: a topic, a vivid example (the
essay's strength, which carries the essay's *detail keywords*, e.g. "a dog named Biscuit at a piano
recital") and a weakness written into the text (no conclusion, a run-on sentence, repetition, an
unsupported claim, informal language or spelling mistakes).

Score = fraction of these four criteria met (an empty or whitespace response scores 0):
  1. specific     names something the student did: at least one detail keyword of this essay's
                  example (a word or phrase; plural/-ed/-ing forms count), case-insensitive.
  2. improvement  gives a concrete next step: at least one improvement cue ("next time", "try",
                  "could", "consider", "you might", "suggest", "work on", "focus on",
                  "make sure", "remember to", "would be stronger/better", "would help/strengthen/
                  improve", "I'd like to see").
  3. friendly     at least one positive word (great, good, nice, well done, strong, vivid, clear,
                  love, enjoyed, ...) and no harsh word (terrible, awful, bad, poor, lazy, sloppy,
                  careless, boring, messy, disappointing, fail..., ...; see _HARSH).
  4. length       10 to 80 words: fits in the margin, says more than "Good job".
So a generic "Great essay! Next time proofread." scores at most 0.75 and never passes, and
pure praise naming nothing scores at most 0.5. The criteria come from the preference alone and
were not tuned to any model's output.

For a prompt that is not in this module's lists, the detail keywords are every catalogue keyword
that occurs in the prompt.
"""
from __future__ import annotations

import random
import re

NAME = "teacher"
PREFERENCE = ("Grading comments that name something specific the student did, give one concrete "
              "improvement, stay kind, and fit in 10 to 80 words.")
SYSTEM = "You are an assistant that helps a school teacher with grading."
MAX_TOKENS = 160
HAPPY = 0.9
MIN_WORDS, MAX_WORDS = 10, 80

# ------------------------------------------------------------------------------------- essays
# topic: (title, opening sentence, middle sentence, closing sentence, [(example, keywords), ...])
_TOPICS = [
    ("Why libraries matter",
     "Libraries are one of the most important places in a town.",
     "They give everyone free books, computers and a quiet place to study.",
     "That is why every town should protect its library.",
     [("When the power went out last winter, our library stayed open and the librarian read "
       "stories by candlelight to a room full of kids.", ["candlelight", "power", "librarian"]),
      ("My little brother learned to read with a stack of dinosaur books that the library lent us "
       "every Saturday.", ["dinosaur", "little brother"]),
      ("My neighbour Mr. Alvarez used the library computers to apply for the job he has now.",
       ["Alvarez", "neighbour"]),
      ("Every summer the library runs a reading challenge where you earn a paper star for each "
       "book, and I once covered a whole wall with my stars.",
       ["reading challenge", "star", "wall"])]),
    ("Letting students choose their clothes",
     "Students should be allowed to choose what they wear to school.",
     "Clothes are a way for young people to show who they are.",
     "Schools should trust students to make this choice.",
     [("My friend Jada sews patches of old band shirts onto her jacket, and you can tell exactly "
       "what music she loves.", ["Jada", "patch", "band shirt", "jacket"]),
      ("On our school's free dress day, the hallway looked like a rainbow and everyone was "
       "smiling.", ["rainbow", "free dress day", "hallway"]),
      ("My cousin's school has uniforms, and he says everyone spends money on expensive shoes "
       "instead to stand out.", ["cousin", "shoe"]),
      ("I wore my grandfather's old green scarf to school and three people asked me about its "
       "story.", ["grandfather", "scarf"])]),
    ("Every family should recycle",
     "Every family should recycle more.",
     "Recycling saves energy and keeps plastic out of the ocean.",
     "If every family does a little, the planet will be much cleaner.",
     [("Last spring my class pulled forty plastic bottles out of the creek behind our school in "
       "one afternoon.", ["creek", "forty", "bottle"]),
      ("My grandmother turns old jam jars into lanterns and flower pots instead of throwing them "
       "away.", ["jam jar", "lantern", "flower pot", "grandmother"]),
      ("Our apartment building started a compost bin, and now our trash bag lasts a whole week "
       "instead of two days.", ["compost", "trash bag", "apartment"]),
      ("I once saw a sea turtle at the aquarium that had been rescued after swallowing a plastic "
       "bag.", ["turtle", "aquarium"])]),
    ("Everyone should learn to cook",
     "Everyone should learn how to cook at least a few meals.",
     "Cooking at home is healthier and cheaper than eating fast food.",
     "Learning to cook is a skill that lasts a lifetime.",
     [("The first time I made my dad's lentil soup by myself, I burned the onions but it still "
       "tasted like home.", ["lentil", "onion", "soup"]),
      ("My aunt taught me to fold dumplings, and we made two hundred of them for the Lunar New "
       "Year.", ["dumpling", "aunt", "Lunar New Year"]),
      ("When my mom had surgery, I cooked scrambled eggs and toast for my family for a whole "
       "week.", ["surgery", "scrambled egg", "toast"]),
      ("At summer camp we baked bread in a clay oven, and I learned that dough needs patience.",
       ["clay oven", "dough", "bread", "camp"])]),
    ("What team sports teach",
     "Playing on a team teaches lessons you cannot learn in a classroom.",
     "Teammates learn to trust each other and to keep going after a loss.",
     "Every student should try a team sport at least once.",
     [("In the last minute of our championship game, our goalie, Marcus, blocked a penalty kick "
       "with his fingertips.", ["Marcus", "goalie", "penalty", "championship"]),
      ("Our volleyball team lost eleven games in a row, but we still laughed together on the long "
       "bus rides home.", ["volleyball", "eleven", "bus ride"]),
      ("I was the slowest runner on the relay team until my coach showed me how to pass the baton "
       "without looking back.", ["relay", "baton", "coach"]),
      ("When our pitcher broke her wrist, the whole softball team signed her cast and visited her "
       "every day.", ["softball", "pitcher", "wrist", "cast"])]),
    ("Should homework be banned?",
     "Homework should be limited, not banned.",
     "A little practice at home helps students remember what they learned.",
     "Schools should give less homework, but not none.",
     [("My sister once stayed up until midnight on a poster about volcanoes and fell asleep in "
       "math class the next day.", ["volcano", "poster", "midnight", "sister"]),
      ("Ten minutes of multiplication flashcards every night finally helped me learn my seven "
       "times table.", ["flashcard", "times table", "multiplication"]),
      ("My friend Theo has to take care of his baby brother after school, so he has almost no "
       "time for worksheets.", ["Theo", "baby brother"]),
      ("Our teacher tried a month with no homework, and half the class forgot how to do long "
       "division.", ["long division", "month with no homework"])]),
    ("Protecting our parks",
     "Our town needs to take better care of its parks.",
     "Parks give people a free place to exercise, relax and meet neighbours.",
     "If we want a healthy town, we have to protect our parks.",
     [("The old oak tree in Riverside Park has a tire swing that three generations of my family "
       "have used.", ["oak", "tire swing", "Riverside", "three generations"]),
      ("Every Sunday my grandpa plays chess with strangers at the stone tables near the "
       "fountain.", ["chess", "fountain", "grandpa", "stone table"]),
      ("Last year someone spray-painted the slide, and it took volunteers a whole weekend to "
       "clean it.", ["spray-paint", "slide", "volunteer"]),
      ("At dusk you can hear frogs in the pond by the playground, and my little cousin counts "
       "them every night.", ["frog", "pond", "cousin"])]),
    ("Teenagers and social media",
     "Social media can be good for teenagers if they use it carefully.",
     "It helps friends stay in touch, but it can also waste hours every day.",
     "Teenagers should set limits so that social media stays helpful.",
     [("My friend Lina started a video channel about fixing old bicycles and now she gets "
       "messages from kids in other countries.", ["Lina", "bicycle", "channel"]),
      ("When my family moved to a new city, group chats were the only way I kept in touch with my "
       "old soccer team.", ["group chat", "soccer", "new city"]),
      ("I once scrolled for three hours before a science test and forgot everything about "
       "photosynthesis.", ["photosynthesis", "three hours", "science test"]),
      ("My older brother deleted every app for a month and said he read four novels.",
       ["novel", "deleted", "older brother"])]),
    ("Why families should keep pets",
     "Having a pet makes a family happier.",
     "Pets teach children to be responsible and give comfort on hard days.",
     "Every family that can care for a pet should think about adopting one.",
     [("When I was nervous before my first piano recital, our old dog Biscuit sat on my feet "
       "until I calmed down.", ["Biscuit", "piano", "recital"]),
      ("My brother feeds our goldfish every morning, and it taught him to remember things "
       "without being told.", ["goldfish"]),
      ("We adopted a three-legged cat named Pepper from the shelter, and she now runs the whole "
       "house.", ["Pepper", "three-legged", "shelter"]),
      ("Walking our neighbour's beagle every afternoon got my grandmother out of the house after "
       "she retired.", ["beagle", "retired", "grandmother"])]),
    ("Why history matters",
     "Learning history helps us understand the world today.",
     "When we know what happened before, we can avoid repeating old mistakes.",
     "That is why history should stay a required subject.",
     [("My great-grandfather's letters from the war describe eating cold beans in the rain for a "
       "week.", ["great-grandfather", "letter", "beans"]),
      ("On our field trip to the old mill, a guide showed us how children my age worked "
       "twelve-hour shifts there.", ["mill", "twelve-hour", "field trip", "shift"]),
      ("Our town's museum has a map from 1850 that shows our school was once a cornfield.",
       ["1850", "cornfield", "map", "museum"]),
      ("I interviewed my grandmother about the day the first television arrived on her street.",
       ["television", "interview"])]),
]

_SPELLING = {"really": "realy", "believe": "beleive", "important": "importent",
             "because": "becuase", "their": "thier"}


def _essay(topic, example: str, weakness: str) -> str:
    _, opening, middle, closing, _ = topic
    s = [opening, example, middle]
    if weakness == "run_on":
        lead = example if example.startswith("I ") else example[0].lower() + example[1:]
        s[2] = (middle.rstrip(".") + " and " + lead.rstrip(".")
                + " and that is why it matters so much to me and to everyone else too.")
        s[1] = ""
    elif weakness == "repetition":
        s.append("Like I said, " + opening[0].lower() + opening[1:])
        s.append("This is why " + opening[0].lower() + opening[1:])
    elif weakness == "unsupported":
        s.append("Everyone knows this is true, so there is no need to explain it.")
    elif weakness == "informal":
        s.append("Honestly it's like, super important and stuff lol.")
    elif weakness == "spelling":
        line = "I really believe this is important because it changes their lives."
        s.append(" ".join(_SPELLING.get(w, w) for w in line.split()))
    if weakness != "no_conclusion":
        s.append(closing)
    return " ".join(x for x in s if x)


_WEAKNESSES = ["no_conclusion", "run_on", "repetition", "unsupported", "informal", "spelling"]
_STUDENTS = ["Ava", "Noah", "Mia", "Elijah", "Isla", "Mateo", "Layla", "Kai", "Amara", "Finn",
             "Zara", "Diego", "Ruby", "Yusuf", "Lily", "Tariq", "Grace", "Arjun", "Nora", "Felix"]
_ASKS = ["Please write a short grading comment for {name}'s essay (grade {grade}).",
         "I'm grading essays. Can you write a brief comment for {name}, grade {grade}?",
         "Could you draft a feedback comment for this essay by {name} (grade {grade})?",
         "Write a comment I can put at the top of {name}'s essay. {name} is in grade {grade}."]


def _build(count: int = 110, seed: int = 31337):
    """`count` essays with distinct (topic, example, weakness); prompt -> (student, keywords)."""
    r = random.Random(seed)
    combos = [(t, e, w) for t in range(len(_TOPICS)) for e in range(4) for w in _WEAKNESSES]
    table = {}
    for t, e, w in r.sample(combos, count):
        topic = _TOPICS[t]
        example, keywords = topic[4][e]
        name, grade = r.choice(_STUDENTS), r.randint(6, 10)
        prompt = (r.choice(_ASKS).format(name=name, grade=grade)
                  + f"\n\nTitle: {topic[0]}\n\n{_essay(topic, example, w)}")
        table[prompt] = (name, keywords)
    prompts = list(table)
    return table, prompts[:66], prompts[66:]


ESSAYS, TRAIN_PROMPTS, HELDOUT_PROMPTS = _build()
_ALL_KEYWORDS = sorted({k for t in _TOPICS for _, kws in t[4] for k in kws})

# --------------------------------------------------------------------------------------- score

def _words(*phrases: str) -> re.Pattern:
    return re.compile(r"\b(" + "|".join(phrases) + r")\b", re.I)


_IMPROVE = _words(r"next time", r"try", r"trying", r"could", r"consider", r"you might",
                  r"suggest", r"work on", r"focus on", r"make sure", r"remember to",
                  r"would be (even )?(stronger|better|clearer)", r"would (help|strengthen|improve)",
                  r"i'?d like to see", r"i would like to see")
_POSITIVE = _words(r"great", r"good", r"nice", r"well done", r"strong", r"excellent", r"love",
                   r"loved", r"enjoyed", r"impressive", r"wonderful", r"vivid", r"clear",
                   r"thoughtful", r"creative", r"fantastic", r"lovely", r"awesome", r"brilliant",
                   r"effective", r"engaging", r"memorable", r"compelling", r"powerful",
                   r"beautiful", r"proud", r"terrific", r"liked?", r"appreciate[ds]?",
                   r"wonderfully", r"nicely", r"strengths?")
_HARSH = _words(r"terrible", r"awful", r"horrible", r"bad", r"badly", r"poor", r"poorly", r"lazy",
                r"sloppy", r"careless", r"stupid", r"dumb", r"worst", r"pathetic", r"useless",
                r"disappointing", r"disappointed", r"unacceptable", r"mediocre", r"boring",
                r"messy", r"fail", r"failed", r"failing", r"failure", r"garbage", r"ridiculous",
                r"embarrassing", r"hate", r"no effort", r"lacks effort", r"waste of time")


def _keyword_pattern(kw: str) -> re.Pattern:
    body = r"[\s-]+".join(re.escape(w) for w in re.split(r"[\s-]+", kw))
    return re.compile(r"\b" + body + r"(s|es|ed|ing)?\b", re.I)


def _details(prompt: str) -> tuple[str | None, list[str]]:
    known = ESSAYS.get(prompt) or ESSAYS.get(prompt.strip())
    if known:
        return known
    return None, [k for k in _ALL_KEYWORDS if _keyword_pattern(k).search(prompt)]


def _count_words(text: str) -> int:
    return len(re.findall(r"\w+(?:['’-]\w+)*", text))


def criteria(prompt: str, response: str) -> dict[str, bool]:
    """Each criterion of the module docstring -> met?"""
    _, keywords = _details(prompt)
    n = _count_words(response)
    return {
        "specific": any(_keyword_pattern(k).search(response) for k in keywords),
        "improvement": bool(_IMPROVE.search(response)),
        "friendly": bool(_POSITIVE.search(response)) and not _HARSH.search(response),
        "length": MIN_WORDS <= n <= MAX_WORDS,
    }


def score(prompt: str, response: str) -> float:
    if not response.strip():
        return 0.0
    met = criteria(prompt, response)
    return sum(met.values()) / len(met)

# --------------------------------------------------------------------------------------- reply

_CORRECTIONS = {
    "specific": ["It's too generic. I wanted something {name} actually wrote, like the part "
                 "that mentions {detail}.",
                 "You didn't point to anything in the essay. Name a specific detail so {name} "
                 "knows I read it.",
                 "Could you name something specific instead? The part with {detail} was the "
                 "best bit."],
    "harsh": ["No, that's too harsh for a student. Can you say it more kindly?",
              "Please soften the tone. I don't want to discourage {name}.",
              "I can't hand that back to a kid. Redo it more kindly, please."],
    "praise": ["You didn't say what {name} did well. Please start with that.",
               "Don't forget the encouragement. Say what went well first.",
               "You forgot the praise. What did {name} do well?"],
    "improvement": ["You didn't give {name} a next step. Add one concrete thing to do better "
                    "next time.",
                    "Not quite, it needs a next step. What's one thing to try in the next draft?",
                    "You missed the suggestion for improvement. Please include one."],
    "long": ["That's too long for the margin. Keep it under 80 words.",
             "Shorter please. Two or three sentences is plenty for a comment.",
             "That won't fit on the rubric sheet. Make it shorter."],
    "short": ["That's too short. Two or three sentences, please.",
              "A bit longer, please. A couple of sentences would be right."],
}
_EMPTY = ["You didn't write a comment. Can you write one for this essay?",
          "That came back blank. Try again, please."]
_GENERIC = ["Not quite. Name one thing they did well, one thing to improve, and keep it kind."]
_THANKS = ["Thanks, that's perfect for {name}.",
           "Great, I'll use that one. Thank you!",
           "Lovely, that's exactly the tone I want.",
           "Perfect, on to the next essay.",
           "Thanks! Specific and kind, just right.",
           "That works well. Thank you, I'll copy it over."]


def reply(prompt: str, response: str, score: float, rng: random.Random) -> str:
    """Thanks at or above HAPPY; below it, a correction naming up to two problems."""
    name, keywords = _details(prompt)
    fill = {"name": name or "the student", "detail": rng.choice(keywords) if keywords else "its example"}
    if score >= HAPPY:
        return rng.choice(_THANKS).format(**fill)
    if not response.strip():
        return rng.choice(_EMPTY)
    met = criteria(prompt, response)
    n = _count_words(response)
    problems = [p for p, bad in (("specific", not met["specific"]),
                                 ("harsh", bool(_HARSH.search(response))),
                                 ("praise", not _POSITIVE.search(response)),
                                 ("improvement", not met["improvement"]),
                                 ("long", n > MAX_WORDS), ("short", n < MIN_WORDS)) if bad]
    said = [rng.choice(_CORRECTIONS[p]) for p in problems[:2]] or _GENERIC
    return " ".join(said).format(**fill)
