"""Checkpoints: trainable weights, optimizer, update index and run state, written atomically.

The sampling and task RNGs are derived from (seed, update) at every update, so a resumed run
needs no RNG state to reproduce the uninterrupted one; torch's global RNG state is saved too
for anything that draws from it (dropout), with the CUDA generators' states on GPU machines.
Checkpoints are loaded with `weights_only=True`: a state.pt that needs anything beyond tensors
and plain Python values is refused, never executed.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import torch

from harness.store import CHECKPOINT, replace_folder


class CheckpointError(RuntimeError):
    """A checkpoint that is not safe to load (it would need arbitrary objects unpickled)."""


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


def save_checkpoint(
    run_dir: Path, update: int, modules: dict[str, torch.nn.Module], optimizer: torch.optim.Optimizer, state: dict
) -> Path:
    """Write run_dir/checkpoint atomically (a tmp folder renamed over the old one)."""
    final = run_dir / CHECKPOINT
    tmp = run_dir / f".{CHECKPOINT}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    payload = {
        "update": update,
        "weights": {k: trainable_state(m) for k, m in modules.items()},
        "optimizer": optimizer.state_dict(),
        "state": state,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    torch.save(payload, tmp / "state.pt")
    with open(tmp / "state.pt", "rb") as f:
        os.fsync(f.fileno())
    replace_folder(tmp, final)
    return final


def load_checkpoint(
    run_dir: Path, modules: dict[str, torch.nn.Module], optimizer: torch.optim.Optimizer
) -> tuple[int, dict] | None:
    """Restore weights and optimizer; return (update, state) or None when there is none."""
    path = run_dir / CHECKPOINT / "state.pt"
    if not path.exists():
        old = run_dir / f".{CHECKPOINT}.old" / "state.pt"  # crash between the two renames
        if not old.exists():
            return None
        path = old
    try:  # tensors, numbers, strings and containers only: a crafted pickle cannot run code here
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path}: refused to load the checkpoint: it holds more than tensors and plain values ({first}). "
            f"Move the point's checkpoint/ folder away to start the point from scratch."
        ) from None
    for key, module in modules.items():
        named = dict(module.named_parameters())
        with torch.no_grad():
            for n, t in payload["weights"][key].items():
                named[n].copy_(t)
    optimizer.load_state_dict(payload["optimizer"])
    torch.set_rng_state(payload["torch_rng"])
    if payload.get("cuda_rng") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(payload["cuda_rng"])
    return payload["update"], payload["state"]
