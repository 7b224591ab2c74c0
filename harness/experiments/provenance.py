"""Where a number came from: code version (git commit + dirty flag), package versions, config hash."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.config.training import LearnerConfig, RolloutConfig

REPO_ROOT = Path(__file__).resolve().parents[2]

# Packages whose versions can change a result; recorded in every summary.json.
TRACKED_PACKAGES = (
    "harness",
    "torch",
    "transformers",
    "peft",
    "trl",
    "numpy",
    "textworld",
    "alfworld",
    "gymnasium",
    "pydantic",
    "mlflow",
    "vllm",
    "ray",
)


def canonical_json(obj: Any) -> str:
    """Sorted-key, whitespace-free JSON: the form that is hashed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)


# Config sections added after results were published whose default reproduces those results byte for
# byte: at their default they are left out of the hash, so the point ids of every earlier run (and the
# committed records) stay what they were; any other value is hashed as usual.
# A whole section at its default goes first; then single keys added to a section that was already
# published with other values (train.learner's precision, logprob_positions, prefix_impl and padding_free came after
# runs with behaviour: sampler or shared_prefix: true had been written; rollout.share_prefix came after every
# published run), each at its default.
HASH_NEUTRAL_DEFAULTS: dict[tuple[str, ...], object] = {
    ("train", "learner"): LearnerConfig().model_dump(mode="json"),  # harness.rl.plan
    ("train", "learner", "precision"): LearnerConfig().precision,
    ("train", "learner", "logprob_positions"): LearnerConfig().logprob_positions,
    ("train", "learner", "prefix_impl"): LearnerConfig().prefix_impl,
    ("train", "learner", "padding_free"): LearnerConfig().padding_free,
    ("rollout", "share_prefix"): RolloutConfig().share_prefix,
}


def _without_neutral_defaults(config: dict) -> dict:
    out = config
    for path, default in HASH_NEUTRAL_DEFAULTS.items():
        parent = out
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and parent.get(path[-1]) == default:
            if out is config:
                out = json.loads(json.dumps(config))  # a copy: the caller's dict stays whole
            target = out
            for key in path[:-1]:
                target = target[key]
            del target[path[-1]]
    return out


def config_hash(config: Any, length: int = 8) -> str:
    """Hash of the canonical resolved config (a RunConfig or its JSON dump), sections at a neutral
    default (`HASH_NEUTRAL_DEFAULTS`) left out."""
    if hasattr(config, "model_dump"):
        config = config.model_dump(mode="json")
    if isinstance(config, dict):
        config = _without_neutral_defaults(config)
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:length]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=20, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


@lru_cache(maxsize=1)
def code_version() -> dict[str, Any]:
    """{"commit", "dirty", "diff_sha"}: the git commit of this checkout and whether the working tree
    differs from it (diff_sha hashes `git diff HEAD`, so two dirty runs can still be compared).
    Outside a git checkout the commit is None and the package version stands in."""
    from harness import __version__

    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "diff_sha": None, "version": __version__}
    status = _git("status", "--porcelain") or ""
    dirty = bool(status.strip())
    diff_sha = None
    if dirty:
        diff = (_git("diff", "HEAD") or "") + status
        diff_sha = hashlib.sha256(diff.encode()).hexdigest()[:12]
    return {"commit": commit.strip(), "dirty": dirty, "diff_sha": diff_sha, "version": __version__}


@lru_cache(maxsize=1)
def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    versions["python"] = sys.version.split()[0]
    return versions


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=1)
def cpu_code_path() -> dict[str, Any]:
    """What decides the floating-point bits of a CPU run besides the code and the seed: the CPU, the
    instruction set torch's kernels use, the BLAS, and the variables that pin them (MKL_CBWR,
    ATEN_CPU_CAPABILITY). Two machines that differ here give metrics that drift apart."""
    import torch

    config = torch.__config__.show()
    blas = next(
        (part.split("=")[1] for part in config.replace(",", " ").split() if part.startswith("BLAS_INFO=")), None
    )
    return {
        "model": _cpu_model(),
        "torch_kernels": torch.backends.cpu.get_cpu_capability(),
        "blas": blas,
        "MKL_CBWR": os.environ.get("MKL_CBWR"),
        "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY"),
    }


@lru_cache(maxsize=1)
def accelerator() -> str | None:
    """The CUDA device `train.device: auto` would pick, or None (runs stay on the CPU)."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def environment() -> dict[str, Any]:
    """Everything above plus the machine, for summary.json."""
    return {
        "code_version": code_version(),
        "packages": package_versions(),
        "platform": platform.platform(),
        "host": platform.node(),
        "cpu": cpu_code_path(),
        "accelerator": accelerator(),
    }
