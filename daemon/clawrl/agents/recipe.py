"""An agent recipe (recipes/agents/*.toml): which environment, how many episodes, how they are
played, the sandbox's limits, and the daemon to play them against.

    env = "toolcall"          # toolcall | terminal | swe
    seed = 0
    [run]     episodes, heldout, concurrency, control, settle_timeout_s
    [play]    max_steps, max_tokens, temperature, train, step_judge, hints, user
    [limits]  cpu_s, memory_mb, file_mb, procs, open_files, timeout_s, disk_mb, output_chars
    [daemon]  recipe (the daemon recipe a started daemon serves), and [daemon.set] with
              "section.key" = value overrides of it (passed as CLAWRL_SECTION_KEY)

Every key has a default (the dataclasses below); an unknown key or a value of the wrong type
fails with a message naming it. Read once, no side effects.
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..config import REPO_RECIPES, load_config
from ..errors import ConfigError
from .envs import NAMES
from .runner import Play
from .sandbox import Limits

AGENT_RECIPES = REPO_RECIPES / "agents"


@dataclass(frozen=True)
class Run:
    episodes: int = 24          # training episodes, from the train pool
    heldout: int = 16           # held-out episodes measured before and after training; 0 = none
    concurrency: int = 4        # episodes played at once
    control: bool = True        # after training: the base model on the same held-out episodes
    settle_timeout_s: float = 1800.0   # wait for judge, trainer and hot-swap after training


@dataclass(frozen=True)
class AgentRecipe:
    path: Path
    env: str
    seed: int = 0
    run: Run = field(default_factory=Run)
    play: Play = field(default_factory=Play)
    daemon_recipe: str = "default"
    daemon_set: dict = field(default_factory=dict)   # "section.key" -> value

    def daemon_env(self) -> dict[str, str]:
        """The daemon overrides as CLAWRL_* variables."""
        out = {}
        for dotted, value in self.daemon_set.items():
            section, _, key = dotted.partition(".")
            text = str(value).lower() if isinstance(value, bool) else str(value)
            out[f"CLAWRL_{section.upper()}_{key.upper()}"] = text
        return out


def resolve(name: str) -> Path:
    p = Path(name).expanduser()
    if p.exists():
        return p
    for cand in (AGENT_RECIPES / f"{name}.toml", AGENT_RECIPES / name):
        if cand.exists():
            return cand
    known = ", ".join(sorted(q.stem for q in AGENT_RECIPES.glob("*.toml")))
    raise ConfigError(f"agent recipe {name!r} not found; give a path to a .toml file or one of: {known}")


def _build(cls, table, where: str, **fixed):
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in fixed}
    values = {}
    for key, value in table.items():
        if key not in fields:
            raise ConfigError(f"unknown key {key!r} in {where}; the keys are: {', '.join(fields)}")
        default = fields[key].default
        want = type(default) if default is not dataclasses.MISSING else str
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            kind = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[want]
            raise ConfigError(f"{key} in {where} must be {kind}, got {value!r}")
        if isinstance(value, (int, float)) and value < 0:   # an int or float field (a bool is never < 0)
            raise ConfigError(f"{key} in {where} must not be negative, got {value!r}")
        values[key] = value
    return cls(**values, **fixed)


def load(name: str) -> AgentRecipe:
    path = resolve(name)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    sections = {"env", "seed", "run", "play", "limits", "daemon"}
    if unknown := set(data) - sections:
        raise ConfigError(f"{path.name}: unknown key(s) {', '.join(sorted(unknown))}; "
                          f"the keys are: {', '.join(sorted(sections))}")
    env = data.get("env")
    if env not in NAMES:
        raise ConfigError(f"{path.name}: env must be one of {', '.join(NAMES)}, got {env!r}")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"{path.name}: seed must be an integer, got {seed!r}")
    limits = _build(Limits, data.get("limits", {}), f"[limits] of {path.name}")
    play = _build(Play, data.get("play", {}), f"[play] of {path.name}", limits=limits)
    run = _build(Run, data.get("run", {}), f"[run] of {path.name}")
    if run.concurrency < 1 or play.max_steps < 1 or play.max_tokens < 1:
        raise ConfigError(f"{path.name}: run.concurrency, play.max_steps and play.max_tokens must "
                          "be at least 1")
    daemon = dict(data.get("daemon", {}))
    daemon_set = daemon.pop("set", {})
    daemon_recipe = daemon.pop("recipe", "default")
    if daemon or not isinstance(daemon_set, dict) or not isinstance(daemon_recipe, str):
        raise ConfigError(f"{path.name}: [daemon] takes recipe = \"NAME\" and a [daemon.set] table "
                          f"of \"section.key\" = value")
    recipe = AgentRecipe(path, env, seed, run, play, daemon_recipe, daemon_set)
    # A bad daemon override fails now, naming the key, not minutes later in a child's log.
    load_config(daemon_recipe, env=recipe.daemon_env())
    return recipe


def with_overrides(recipe: AgentRecipe, *, episodes=None, heldout=None, concurrency=None,
                   train=None) -> AgentRecipe:
    """The command line's --episodes, --heldout, --concurrency and --no-train on top."""
    run = dataclasses.replace(recipe.run, **{k: v for k, v in (
        ("episodes", episodes), ("heldout", heldout), ("concurrency", concurrency)) if v is not None})
    play = recipe.play if train is None else dataclasses.replace(recipe.play, train=train)
    return dataclasses.replace(recipe, run=run, play=play)
