"""Registry of environments: name -> Env subclass, listed by `harness envs`."""
from __future__ import annotations

from algorithms.registry import Registry

ENVS = Registry("env.name", "reference text environments")


def make_env(name: str, options: dict | None = None, **kwargs):
    """Build one instance of the environment registered under `name`."""
    return ENVS.get(name)(options, **kwargs)
