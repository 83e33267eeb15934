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

# Wordings of the teacher's next message. Each is a standalone sentence or two, so two corrections
# can be joined with a space. `_CORRECTIONS`, `_GENERIC` and `_THANKS` are filled with
# .format(name=..., detail=...); `_EMPTY` is used as is (no placeholders there).
_CORRECTIONS = {
    "specific": [
        "Too generic.",
        "This could be about any essay. Mention something {name} actually wrote, like the bit "
        "about {detail}.",
        "Which part are you praising? Name it.",
        "hmm, nothing here shows I read it. point to {detail} or something.",
        "Could you mention a real detail from the essay? The part with {detail} stood out to me.",
        "Every kid in the class could get this exact comment. Make it about {name}'s essay.",
        "Kids can spot a copy-paste comment a mile away. Mention something from the actual essay.",
        "The tone is fine, but it doesn't mention anything from the essay itself. What about "
        "{detail}?",
        "needs a specific. e.g. {detail}",
        "Well, that's a comment I could staple to any paper in the pile.",
        "Can you tie it to what they actually wrote? The bit that mentions {detail} was lovely.",
        "Not specific enough. Name a moment from the essay.",
        "It reads like a form letter. Could it mention {detail}?",
        "Next time pull one detail straight from the essay so {name} knows I read it.",
        "Too vague. Mention {detail}.",
        "Generic again 🙄 what did they actually write that worked?",
        "Could you make the praise less general? Something like the part about {detail} would "
        "be perfect.",
        "Parents read these too, and this doesn't show I looked at the essay. Add a specific "
        "detail.",
        "vague. which example?",
        "Hmm, this doesn't mention a single thing from the essay. Try the part about {detail}.",
        "It's kind, but it isn't about this essay. Refer to something {name} wrote.",
        "You could swap the name and give this to anyone. Make it specific to this essay.",
        "pls mention what they actualy wrote about (the {detail} bit?)",
        "The best part of the essay was {detail}, and the comment doesn't even mention it.",
        "Can you anchor the praise in the essay? Even one detail, like {detail}, would do.",
        "specific please. what did {name} write that was good?",
        "I'd rather it named something real from the essay than praise in general terms.",
    ],
    "harsh": [
        "Too harsh.",
        "Whoa, that's way too harsh for a kid.",
        "Well, that'll make them cry.",
        "Hmm, an actual child is going to read this, you know.",
        "Could you soften it a bit? I don't want {name} to feel crushed.",
        "I can't send that home. Please make it kinder.",
        "Yikes. Kinder, please.",
        "Ouch. Can we be gentler?",
        "That sounds like a letter from the principal's office. Warmer, please.",
        "I'd never write that on a student's paper. Rephrase it gently.",
        "The point is fair but the tone is too cold. Can you make it encouraging?",
        "Too blunt, {name} will just give up. Say it more kindly.",
        "Please take out the harsh wording, it'll hurt more than it helps.",
        "Nope, too mean 😬",
        "Could you make it a little warmer? That reads a bit cruel.",
        "Next time keep the criticism gentle. These are kids.",
        "That's how I get an angry parent email. Tone it down, please.",
        "Way too negative. Be kind about it.",
        "I want {name} to keep writing after reading this, and this won't do that. Gentler.",
        "harsh much? try again, nicer",
        "The feedback is valid but the wording stings. Can you rephrase it kindly?",
        "I'm not handing that back to a student. Softer pls.",
        "Tone is off, too critical. Please be gentler with {name}.",
        "Let's not be so hard on them. Rewrite it kindly, please.",
        "oof. gentler pls",
        "Words like that stick with kids for years. Please reword it.",
        "Could we lose the scolding tone? Encouraging, please.",
    ],
    "praise": [
        "What did they do well? Start there.",
        "You forgot to say anything nice.",
        "No praise at all? {name} worked hard on this.",
        "Open with something positive, please.",
        "It's all correction. Where's the encouragement?",
        "Please start with what went well before the fix.",
        "Could you add a line about what {name} did well?",
        "Next time lead with a strength.",
        "missing the positive",
        "Hmm, not one kind word in there. Kids need to hear what worked.",
        "Well, that's cheerful. Could you mention something they got right?",
        "Say something encouraging first, please.",
        "Where's the praise? Even one sentence.",
        "They need to know what's working too, not just what to fix.",
        "add a positive pls",
        "It reads like a to-do list. Can you mention something {name} did nicely?",
        "I always start with a strength. Can you add one?",
        "Could it sound a bit more encouraging? Point out what went right.",
        "Not a single compliment 😕",
        "Put in something they can be proud of, please.",
        "Feels cold with no praise. Name a strength.",
        "Remember the praise sandwich. There's no praise in it.",
        "Please recognise the effort and say what {name} did well.",
        "Needs a 'what went well' line.",
        "You skipped the encouraging part. What worked in this essay?",
        "Hmm, a kid reading this would think they did nothing right. Add what worked.",
        "Where's teh compliment? Start with what {name} got right.",
    ],
    "improvement": [
        "What's the next step?",
        "Nice, but it doesn't say what to fix.",
        "Good start, but {name} still needs one thing to work on.",
        "Add one concrete next step, please.",
        "It's all praise. What should they do differently next time?",
        "Lovely, but what do I want {name} to change in the next draft?",
        "no next step",
        "Where's the 'try this next time' part?",
        "Could you add one thing to improve? Keep it concrete.",
        "Praise is fine, but they also need something to aim for.",
        "Next time include one specific fix they can actually do.",
        "So... the essay is flawless? Give them something to work on.",
        "Missing the improvement bit.",
        "How will {name} get better from this? Add a next step.",
        "Please include a suggestion for the next draft.",
        "Sweet, but not useful yet. What should they work on?",
        "Needs a 'next time' line.",
        "A concrete goal, please. One thing they can change.",
        "It doesn't tell them how to improve. Add that.",
        "The tone is nice. Now add one thing to fix.",
        "They can't act on this. What's one actual step?",
        "missing next step 🙂",
        "I need it to point to something to improve, not just cheer.",
        "Can you end with one thing for {name} to try next?",
        "All compliments, no direction. One next step, please.",
        "Every comment needs a growth point and this one doesn't have one.",
        "Kind, yes, but what are they supposed to do with it? Give them a next step.",
    ],
    "long": [
        "Too long.",
        "Way too long for the margin.",
        "Shorter please.",
        "Could you trim it? Under 80 words.",
        "I'm copying these by hand onto thirty papers. Much shorter, please.",
        "That's an essay about the essay 😅 Cut it down.",
        "Won't fit on the rubric. Two or three sentences.",
        "Can you make it shorter? The kids won't read all that.",
        "tl;dr. trim it",
        "Half that length, please.",
        "Way more than I need. A few sentences, max.",
        "No kid is reading all of that.",
        "Cut it down to the essentials: one strength, one next step.",
        "The content's fine, but it's far too long.",
        "Please keep it under 80 words next time.",
        "Could you tighten it? There's only a little space at the top of the page.",
        "Shorter! It has to fit in the box.",
        "That's longer than some of the essays. Trim it.",
        "Too wordy. Tighten it up.",
        "A bit shorter, please. Three sentences tops.",
        "I don't have room for all that. Condense it.",
        "Lose about half of it, please.",
        "Can you make this margin-sized?",
        "too long, pls cut",
        "Same idea, fewer words please.",
        "My hand hurts just looking at that. Shorter.",
        "Thats way to long for a comment. Cut it.",
    ],
    "short": [
        "Too short.",
        "That's a bit thin. Two or three sentences?",
        "Could you say a little more? A couple of sentences.",
        "Bit more than that, please.",
        "That's barely a comment. Expand it a little.",
        "Too brief. {name} needs more than one line.",
        "A sticker would say as much. Please write a few sentences.",
        "More, please. At least a couple of full sentences.",
        "Can you flesh it out a bit?",
        "Too short to be useful. Add a sentence or two.",
        "expand pls",
        "That's a stamp, not a comment. Longer, please.",
        "Needs a couple more sentences.",
        "Hmm, that's pretty bare. Can you add a bit?",
        "Give it a little more substance, two or three sentences.",
        "I like short, but not that short.",
        "A real sentence or two, please, not a fragment.",
        "Could you make it a little fuller?",
        "Bit longer next time, please.",
        "That's it? Please write more.",
        "Too terse. Kids need a little more to go on.",
        "Longer please. A couple of sentences is about right.",
        "It feels rushed. A few more words would help.",
        "Nope, too short. Try again with a bit more.",
        "One line won't cut it. Add a sentence.",
        "hmm, {name} will read that in two seconds and learn nothing. a bit more pls",
    ],
}
_EMPTY = [
    "You didn't write anything.",
    "It's blank?",
    "Nothing came through. Try again please.",
    "Where's the comment?",
    "Um, that's empty.",
    "I got a blank response. Could you write the comment?",
    "empty",
    "Hello? There's no comment there.",
    "There's nothing here. Please write the comment for this essay.",
    "Looks like it came back empty. Try again?",
    "You forgot the actual comment 😅",
    "Blank. Again, please.",
    "I can't paste an empty box onto the essay. Write something, please.",
    "Did something break? I don't see any text.",
    "Nothing there. Please try once more.",
    "No comment came back. Could you write one?",
    "that's blank lol",
    "Empty reply. I still need the grading comment.",
    "I need words, not a blank space.",
    "Can you actually write it this time?",
    "Your answer is empty. Please write the feedback.",
    "Zero words. I need a comment for this one.",
    "Hmm, nothing showed up. Try again.",
    "That's an empty answer. Please write the comment.",
    "Still waiting on the actual comment.",
    "A blank page doesn't help me. Please write it.",
    "uh, where did the comment go? nothing here",
]
_GENERIC = [
    "Not quite. Name one thing they did well, one thing to improve, and keep it kind.",
    "Hmm, not quite there. Try again.",
    "Not what I'm after. One strength, one next step, kind tone.",
    "Close, but no. Rework it.",
    "Doesn't feel right for {name}. Try another version.",
    "Nope. Can you take another pass?",
    "It's not working for me. Make it clearer what went well and what to do next.",
    "Meh. Try again.",
    "I wouldn't hand this back as is. Another go, please.",
    "Not there yet. Keep it short, kind and specific.",
    "Hmm. Could you try a different version?",
    "This isn't quite it. Make the praise specific and the next step concrete.",
    "Not usable yet. Try again, please.",
    "Almost, but I'd still rewrite it. One more try?",
    "Something's off. Please redo it.",
    "Not what I need for {name}. Again, please.",
    "no, try again",
    "I'm not happy with this one. Can you rewrite it?",
    "Not quite right 🤔 another version?",
    "That misses the mark. One thing done well, one next step, kind wording.",
    "Could you try again? It doesn't read like a grading comment I'd use yet.",
    "Let's try that one again.",
    "Still not right. Rewrite it, please.",
    "That's not the comment I'd write. Have another go.",
    "Hmm, no. Start over?",
    "It needs work: specific praise, a concrete next step, a friendly tone.",
    "I'd be embarrassed to put that on {name}'s paper. Try again.",
]
_THANKS = [
    "ty",
    "👍",
    "perfect",
    "Perfect, thanks!",
    "Thanks, that's perfect for {name}.",
    "Great, next essay.",
    "Lovely, that's exactly the tone I want.",
    "That's the one. Copying it over now.",
    "Yes! Specific and kind. Thank you.",
    "Love it, {name} will be thrilled.",
    "thx, that works",
    "Exactly what I needed, thank you so much. That saves me a lot of time.",
    "Great, using that as is.",
    "Spot on. Thanks!",
    "Beautiful, {name} will actually read that. Thank you.",
    "Nice one 🙂 moving on.",
    "Ok perfect, on to the next one.",
    "That's just right: kind, specific, and short enough for the margin. Thanks!",
    "Works for me. Thanks!",
    "Oh that's lovely. I'll use it word for word.",
    "Excellent, thank you. Next!",
    "Yes, that's exactly it.",
    "Great, thanks. {name} will like that you noticed their example.",
    "Perfect, pointing to their example is exactly what I wanted.",
    "thank u!! 🙌",
    "Wonderful. It's kind, it's specific and it tells them what to do next. Thank you.",
    "Good, that'll do nicely. Thanks.",
    "That's great, done. Next essay coming up.",
    "Really nice. It's what I'd have written if I had the time. Thanks!",
    "Sounds like me on a good day 😄 thanks",
    "definately using this one, thanks",
]


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
    said = [rng.choice(_CORRECTIONS[p]) for p in problems[:2]] or [rng.choice(_GENERIC)]
    return " ".join(said).format(**fill)
