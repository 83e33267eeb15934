"""Agent recipes: the shipped ones load, and a wrong key or value fails naming it."""
from __future__ import annotations

import pytest

from clawrl.agents import recipe as recipes
from clawrl.errors import ConfigError


@pytest.mark.parametrize("name", ["toolcall", "terminal", "swe"])
def test_shipped_recipes_load(name):
    r = recipes.load(name)
    assert r.env == name and r.play.train and r.run.heldout > 0
    assert r.daemon_env()["CLAWRL_TRAIN_BATCH_SIZE"] == "8"


def test_command_line_overrides_win():
    r = recipes.with_overrides(recipes.load("swe"), episodes=3, heldout=0, concurrency=8, train=False)
    assert (r.run.episodes, r.run.heldout, r.run.concurrency, r.play.train) == (3, 0, 8, False)
    assert r.play.limits == recipes.load("swe").play.limits


@pytest.mark.parametrize("text, says", [
    ('env = "gui"', "env must be one of"),
    ('env = "swe"\n[run]\nepisode = 3', "unknown key 'episode' in [run]"),
    ('env = "swe"\n[limits]\ncpu_s = "ten"', "cpu_s in [limits] of bad.toml must be an integer"),
    ('env = "swe"\n[play]\ntrain = 1', "train in [play] of bad.toml must be true or false"),
    ('env = "swe"\n[run]\nconcurrency = 0', "at least 1"),
    ('env = "swe"\n[daemon.set]\n"train.batchsize" = 4', "CLAWRL_TRAIN_BATCHSIZE"),
    ('env = "swe"\nepisodes = 3', "unknown key(s) episodes"),
])
def test_a_bad_recipe_fails_naming_the_key(tmp_path, text, says):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        recipes.load(str(path))
    assert says in str(e.value)


def test_an_unknown_recipe_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match="swe, terminal, toolcall"):
        recipes.load("nope")
