"""Unit tests for clawrl.personas (the loader) and the built-in personas in recipes/personas/.

Fast: no model, no server. Hand-written responses pin each persona's criteria: what must pass
(score >= 0.9), what must fail (score <= 0.5), and that replies correct or thank accordingly.
"""
from __future__ import annotations

import random
import sys
import textwrap
from pathlib import Path

import pytest

from clawrl.evals import personas
from clawrl.errors import ClawrlError
from clawrl.evals.personas import BUILTIN, Persona, load


@pytest.fixture(scope="module")
def student() -> Persona:
    return load("student")


@pytest.fixture(scope="module")
def teacher() -> Persona:
    return load("teacher")


@pytest.fixture(scope="module")
def concise() -> Persona:
    return load("concise")


def module_of(p: Persona):
    """The persona file's module (score keeps its __module__ through the loader's wrapper)."""
    return sys.modules[p.score.__module__]


def replies(p: Persona, prompt: str, response: str, score: float, seeds=range(40)) -> set[str]:
    return {p.reply(prompt, response, score, random.Random(s)) for s in seeds}


# -- every built-in persona --------------------------------------------------------------------------

def test_builtins_shipped():
    assert BUILTIN == ["concise", "student", "teacher", "yesno"]


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_prompts_and_fields(name):
    p = load(name)
    assert p.name == name and p.preference.strip() and p.max_tokens > 0
    assert len(p.train_prompts) >= 60 and len(p.heldout_prompts) >= 40
    assert not set(p.train_prompts) & set(p.heldout_prompts)
    assert len(set(p.train_prompts)) == len(p.train_prompts)
    assert len(set(p.heldout_prompts)) == len(p.heldout_prompts)
    # Stable across imports: a second load (a fresh import) gives the same lists.
    again = load(name)
    assert again.train_prompts == p.train_prompts and again.heldout_prompts == p.heldout_prompts


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("blank", ["", "   ", "\n\t\n"])
def test_blank_response_scores_zero(name, blank):
    p = load(name)
    assert p.score(p.heldout_prompts[0], blank) == 0.0


@pytest.mark.parametrize("name", BUILTIN)
def test_scores_in_unit_interval(name):
    p = load(name)
    junk = ["ok", "**x**", "# H\n- a\n- b", "word " * 300, "1 2 3 4 5", "Final answer: 7"]
    for prompt in p.train_prompts[:10] + p.heldout_prompts[:10]:
        for r in junk:
            assert 0.0 <= p.score(prompt, r) <= 1.0


# -- student -----------------------------------------------------------------------------------------

def test_student_module_knows_answers(student):
    problems = module_of(student).PROBLEMS
    for prompt in student.train_prompts + student.heldout_prompts:
        answer, work = problems[prompt]
        assert isinstance(answer, int) and answer >= 0 and answer in work


def test_student_plain_prose_passes_and_markdown_fails_on_every_prompt(student):
    problems = module_of(student).PROBLEMS
    for prompt in student.train_prompts + student.heldout_prompts:
        answer, work = problems[prompt]
        prose = (f"We start from the numbers in the problem, such as {work[0]}. "
                 f"Working through it step by step, the result is {answer}.")
        assert student.score(prompt, prose) == 1.0, prompt
        markdown = (f"**Step 1:** Start from {work[0]}.\n- Then work it out.\n\n"
                    f"**Final Answer:** {answer}")
        assert student.score(prompt, markdown) <= 0.5, prompt


def test_student_criteria_on_a_known_problem(student):
    prompt = next(q for q in student.heldout_prompts
                  if "A room is 13 metres long and 10 metres wide." in q)
    good = ("The floor is a rectangle, so its area is the length times the width. "
            "That is 13 times 10, which gives 130 square metres.")
    assert student.score(prompt, good) == 1.0
    # The usual markdown answer fails outright, right or wrong.
    markdown = ("## Solution\n**Step 1:** The area is length times width.\n"
                "- 13 x 10 = 130\n\n**Final answer: 130 square metres**")
    assert student.score(prompt, markdown) <= 0.5
    assert student.score(prompt, "# Area\n* **13 x 10 = 130**\n* Final answer: 130") <= 0.5
    assert student.score(prompt, "1. Multiply.\n2. **Answer:** 120") <= 0.5
    # A list costs two criteria: the list itself, and its steps are not prose.
    bullets = ("To find the area:\n- Multiply the length by the width.\n- 13 times 10 is 130.\n"
               "- So the area is 130 square metres.")
    numbered = ("1. The area is length times width.\n2. 13 x 10 = 130.\n"
                "3. The floor is 130 square metres.")
    assert student.score(prompt, bullets) == pytest.approx(4 / 6)
    assert student.score(prompt, numbered) == pytest.approx(4 / 6)
    # Each single style slip costs one criterion out of six.
    assert student.score(prompt, good.replace("130", "**130**")) == pytest.approx(5 / 6)
    assert student.score(prompt, good.replace("130", "__130__")) == pytest.approx(5 / 6)
    assert student.score(prompt, good + "\nFinal answer: 130.") == pytest.approx(5 / 6)
    assert student.score(prompt, good + "\nAnswer: 130") == pytest.approx(5 / 6)
    assert student.score(prompt, "### Area\n" + good) == pytest.approx(5 / 6)
    # Correctness weighs lightly: a plain, well-worked but wrong answer still scores 5/6.
    wrong = good.replace("130", "120")
    assert student.score(prompt, wrong) == pytest.approx(5 / 6)
    # Working shown needs two sentences and a number from the computation.
    assert student.score(prompt, "It is 130 square metres.") == pytest.approx(5 / 6)
    assert student.score(prompt, "130") == pytest.approx(5 / 6)
    assert student.score(prompt, "Multiply the sides. That gives the area.") == pytest.approx(4 / 6)


def test_student_commas_in_numbers_and_unknown_prompt(student):
    prompt = "A farm has 1200 hens and buys 50 more. How many hens are there?"
    text = "The farm starts with 1,200 hens. Adding 50 gives 1,250 hens in all."
    assert student.score(prompt, text) == 1.0            # correctness skipped: not a known prompt
    assert student.score(prompt, "- 1,250 hens") == pytest.approx(3 / 5)


def said_from(text: str, bank: list[str]) -> bool:
    """Whether a reply says one of the wordings of a bank (after any lead)."""
    return any(w in text for w in bank)


def test_student_replies(student):
    """Each failure is answered from its own bank of wordings; satisfaction from the thanks bank.
    (The words themselves are not checked: they are written as people write, for no judge.)"""
    mod = module_of(student)
    prompt = student.heldout_prompts[0]
    bullets = "- First step.\n- Second step."
    corrections = replies(student, prompt, bullets, 0.3)
    assert len(corrections) >= 3
    assert all(said_from(c, mod._CORRECTIONS["no_list"]) for c in corrections)
    bold = "The total is **10** dollars. So the change is 10 dollars."
    assert all(said_from(c, mod._CORRECTIONS["no_bold"]) for c in replies(student, prompt, bold, 0.8))
    label = "We take 40 from 50. Final answer: 10"
    assert any(said_from(c, mod._CORRECTIONS["no_label"])
               for c in replies(student, prompt, label, 0.8))
    thanks = replies(student, prompt, "Fine prose.", 1.0)
    assert len(thanks) >= 3 and not thanks & corrections
    assert thanks <= set(mod._THANKS)
    assert replies(student, prompt, "  ", 0.0) <= set(mod._EMPTY)


# -- teacher -----------------------------------------------------------------------------------------

def teacher_prompt(t: Persona, keyword: str) -> str:
    return next(q for q in t.heldout_prompts + t.train_prompts if keyword in q)


def test_teacher_module_knows_each_essays_details(teacher):
    mod = module_of(teacher)
    for prompt in teacher.train_prompts + teacher.heldout_prompts:
        name, keywords = mod.ESSAYS[prompt]
        assert name in prompt
        assert any(mod._keyword_pattern(k).search(prompt) for k in keywords)
        assert not mod._HARSH.search(prompt)


def test_teacher_criteria(teacher):
    prompt = teacher_prompt(teacher, "Biscuit")
    good = ("I loved your story about Biscuit sitting on your feet before the piano recital; it "
            "makes your point vivid. Next time, try adding a sentence that explains why pets "
            "comfort us, so the claim has support.")
    assert teacher.score(prompt, good) == 1.0
    generic_praise = "Good job! Nice work, keep it up."
    assert teacher.score(prompt, generic_praise) <= 0.5
    generic_with_tip = ("Great essay, you did a good job. Next time, try to proofread more "
                        "carefully and add a conclusion.")
    assert teacher.score(prompt, generic_with_tip) == 0.75          # names nothing: never passes
    harsh = ("This is sloppy and careless writing. The dog story about Biscuit is boring and the "
             "ending is terrible. Fix it.")
    assert teacher.score(prompt, harsh) <= 0.5
    harsh_but_specific = ("Your piano recital example is good, but the rest is lazy. Next time "
                          "try to support your claims.")
    assert teacher.score(prompt, harsh_but_specific) == 0.75
    no_next_step = ("What a lovely, vivid example about Biscuit and your piano recital. It made "
                    "me smile and it shows exactly why pets matter.")
    assert teacher.score(prompt, no_next_step) == 0.75
    too_long = good + " " + ("You clearly care about this topic and it shows in every line. " * 8)
    assert teacher.score(prompt, too_long) == 0.75
    assert teacher.score(prompt, "Great Biscuit story; try a source.") == 0.75     # 6 words


def test_teacher_keywords_match_forms_not_lookalikes(teacher):
    pattern = module_of(teacher)._keyword_pattern
    assert pattern("volunteer").search("the Volunteers who cleaned it")
    assert pattern("spray-paint").search("someone spray painted the slide")
    assert pattern("scrambled egg").search("your scrambled eggs and toast")
    assert not pattern("star").search("a great start")
    assert not pattern("power").search("a powerful opening")


def test_teacher_specific_kind_comment_passes_on_every_prompt(teacher):
    essays = module_of(teacher).ESSAYS
    for prompt in teacher.train_prompts + teacher.heldout_prompts:
        name, keywords = essays[prompt]
        good = (f"{name}, I really enjoyed the part about the {keywords[0]}; it brings your "
                "essay to life. Next time, try ending with a sentence that sums up your argument.")
        assert teacher.score(prompt, good) == 1.0, prompt
        assert teacher.score(prompt, f"Good job, {name}! Nice work, keep it up.") <= 0.5


def test_teacher_replies(teacher):
    mod = module_of(teacher)
    prompt = teacher_prompt(teacher, "Biscuit")
    name = mod.ESSAYS[prompt][0]
    generic = "Good job! Nice work, keep it up."
    corrections = replies(teacher, prompt, generic, 0.25)
    assert len(corrections) >= 3

    def bank(key):
        return [w.split("{")[0] for w in mod._CORRECTIONS[key]]   # the words before a slot
    assert all(said_from(c, bank("specific")) for c in corrections)
    harsh = "Sloppy and lazy. The Biscuit part is boring, try harder next time."
    assert all(said_from(c, bank("harsh")) for c in replies(teacher, prompt, harsh, 0.5))
    thanks = replies(teacher, prompt, "anything", 1.0, range(200))
    assert len(thanks) >= 3 and not thanks & corrections
    assert any(name in t for t in thanks)


# -- concise -----------------------------------------------------------------------------------------

def test_concise_scores_by_length(concise):
    prompt = concise.heldout_prompts[0]
    assert concise.score(prompt, "Paris.") == 1.0
    assert concise.score(prompt, " ".join(["word"] * 25)) == 1.0
    assert concise.score(prompt, " ".join(["word"] * 26)) == pytest.approx(0.98)
    assert concise.score(prompt, " ".join(["word"] * 50)) == pytest.approx(0.5)
    assert concise.score(prompt, " ".join(["word"] * 75)) == 0.0
    assert concise.score(prompt, " ".join(["word"] * 400)) == 0.0
    long_answer = ("The sky looks blue because sunlight is scattered by the molecules in the air. "
                   "Blue light has a shorter wavelength than red light, so it is scattered much "
                   "more strongly, in every direction, and that scattered blue light reaches our "
                   "eyes from all parts of the sky. At sunset the light passes through more air, "
                   "so most of the blue is scattered away and the sky looks red and orange.")
    assert concise.score(prompt, long_answer) <= 0.5
    assert concise.score(prompt, "Air molecules scatter short blue wavelengths of sunlight more "
                                 "than red ones, so blue reaches our eyes from everywhere.") == 1.0
    assert concise.score(prompt, "- \n- \n— ") == 0.0         # no words at all


def test_concise_replies(concise):
    mod = module_of(concise)
    prompt = concise.heldout_prompts[0]
    long_answer = " ".join(["word"] * 70)
    corrections = replies(concise, prompt, long_answer, concise.score(prompt, long_answer))
    assert len(corrections) >= 3 and corrections <= set(mod._TOO_LONG)
    mild = replies(concise, prompt, "x", 0.7)
    assert mild <= set(mod._A_BIT_LONG)
    thanks = replies(concise, prompt, "Paris.", 1.0)
    assert len(thanks) >= 3 and not thanks & (corrections | mild) and thanks <= set(mod._THANKS)


# -- the loader --------------------------------------------------------------------------------------

MINIMAL = '''
NAME = "tiny"
PREFERENCE = "Says yes."
TRAIN_PROMPTS = [f"train {i}" for i in range(3)]
HELDOUT_PROMPTS = [f"held {i}" for i in range(40)]

def score(prompt, response):
    return 1.0 if "yes" in response else 0.0

def reply(prompt, response, score, rng):
    return "thanks" if score else "say yes"
'''


def write(tmp_path: Path, text: str, name: str = "tiny.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_load_persona_outside_the_package(tmp_path):
    # A dataclass in the file needs its module registered while it runs.
    extra = "\nimport dataclasses\n@dataclasses.dataclass\nclass X:\n    a: int = 1\n"
    path = write(tmp_path, MINIMAL + extra)
    p = load(str(path))
    assert p.name == "tiny" and p.system is None and p.max_tokens == personas.DEFAULT_MAX_TOKENS
    assert len(p.heldout_prompts) == 40
    assert p.score("held 0", "yes") == 1.0
    assert p.reply("held 0", "no", 0.0, random.Random(0)) == "say yes"
    # A file with the same stem elsewhere is a different persona, not the cached one.
    other = tmp_path / "other"
    other.mkdir()
    q = load(str(write(other, MINIMAL.replace('"tiny"', '"tiny2"'))))
    assert q.name == "tiny2" and load(str(path)).name == "tiny"


def test_load_optional_fields(tmp_path):
    p = load(str(write(tmp_path, MINIMAL + '\nSYSTEM = "Be nice."\nMAX_TOKENS = 42\n')))
    assert p.system == "Be nice." and p.max_tokens == 42 and p.criteria is None
    extra = "\ndef criteria(prompt, response):\n    return {'yes': response == 'yes'}\n"
    q = load(str(write(tmp_path, MINIMAL + extra, "with_criteria.py")))
    assert q.criteria("held 0", "yes") == {"yes": True}


def test_builtin_criteria_agree_with_the_score(student, teacher):
    # The per-criterion view the reports use is the score's own breakdown.
    for p, response in ((student, "**Answer:** 7"), (teacher, "Great essay! Next time proofread.")):
        prompt = p.heldout_prompts[0]
        met = p.criteria(prompt, response)
        assert sum(met.values()) / len(met) == pytest.approx(p.score(prompt, response))


def test_unknown_persona_names_the_builtins():
    with pytest.raises(ClawrlError, match="not found.*concise, student, teacher"):
        load("no-such-persona")


TRAIN = '[f"train {i}" for i in range(3)]'


@pytest.mark.parametrize("edit, problem", [
    (lambda s: s.replace('NAME = "tiny"\n', ""), "missing NAME"),
    (lambda s: s.replace("def reply", "def not_reply"), "missing reply"),
    (lambda s: s.replace('PREFERENCE = "Says yes."', 'PREFERENCE = ""'), "PREFERENCE must be"),
    (lambda s: s.replace(TRAIN, "[]"), "TRAIN_PROMPTS must be a non-empty list"),
    (lambda s: s.replace(TRAIN, '"train 0"'), "TRAIN_PROMPTS must be a non-empty list"),
    (lambda s: s.replace(TRAIN, '["a", 7]'), r"TRAIN_PROMPTS\[1\] is not a non-empty string"),
    (lambda s: s.replace(TRAIN, '["held 5"]'), "in both TRAIN_PROMPTS and HELDOUT_PROMPTS"),
    (lambda s: s.replace("range(40)", "range(39)"), "HELDOUT_PROMPTS has 39 prompts; at least 40"),
    (lambda s: s + "\nMAX_TOKENS = 0\n", "MAX_TOKENS must be a positive integer"),
    (lambda s: s + "\nSYSTEM = 3\n", "SYSTEM must be a string or None"),
    (lambda s: s + "\nscore = 5\n", "score must be a function"),
    (lambda s: s + "\ncriteria = 5\n", "criteria must be a function"),
    (lambda s: s + "\ndef (:\n", "importing it failed with SyntaxError"),
    (lambda s: s + "\nraise RuntimeError('boom')\n", "importing it failed with RuntimeError: boom"),
])
def test_malformed_persona_files(tmp_path, edit, problem):
    path = write(tmp_path, edit(MINIMAL), "broken.py")
    with pytest.raises(ClawrlError, match=problem) as info:
        load(str(path))
    assert str(path) in str(info.value)


def test_bad_score_or_reply_values_are_reported(tmp_path):
    path = write(tmp_path, MINIMAL.replace("return 1.0 if", "return 2.0 if")
                 .replace('return "thanks" if score else "say yes"', "return None"))
    p = load(str(path))
    with pytest.raises(ClawrlError, match=r"score\(\) returned 2.0"):
        p.score("held 0", "yes")
    with pytest.raises(ClawrlError, match=r"reply\(\) returned None"):
        p.reply("held 0", "yes", 1.0, random.Random(0))


# -- replies: a phrasing bank, not a judge's cue list ---------------------------------------------------
# Whether a judge hears these replies is measured by every eval run (judge agreement with the
# simulated user), not forced here: real users are not written for any judge.

FAILING = {   # persona -> responses it scores low
    "student": ["- a\n- b", "**Bold** text. More **bold**.", "Final answer: 3", "7", "## Title\nx"],
    "teacher": ["Good job! Nice work, keep it up.", "Sloppy and lazy.", "word " * 120,
                "Nice essay. It was interesting to read and well organised overall for sure."],
    "concise": ["word " * 40, "word " * 70, "word " * 300],
    "yesno": ["Well, yes, it is.", "It depends on many things.", "Paris is lovely.", "**Maybe**"],
}


@pytest.mark.parametrize("name", BUILTIN)
def test_replies_are_varied_and_follow_satisfaction(name):
    """Corrections below the persona's HAPPY, thanks at or above it, each from many wordings."""
    p = load(name)
    assert 0 < p.happy <= 1
    prompt = p.heldout_prompts[0]
    corrections = set()
    for response in FAILING[name]:
        s = p.score(prompt, response)
        assert not p.satisfied(s), (response, s)
        corrections |= replies(p, prompt, response, s, range(200))
    thanks = replies(p, prompt, "fine", 1.0, range(200))
    assert p.satisfied(1.0)
    assert len(corrections) >= 25 and len(thanks) >= 20, (len(corrections), len(thanks))
    assert not corrections & thanks      # the same words never mean both


def test_yesno_scores_the_first_word():
    p = load("yesno")
    assert [p.score("q", r) for r in ("Yes, it is.", "**No.** Never.", "“No.”", "Well, yes.",
                                      "Nope.", "Yesterday it rained.", "", "Paris is nice.")] == \
        [1.0, 1.0, 1.0, 0.3, 0.0, 0.0, 0.0, 0.0]
