"""Reference text environments behind one protocol (`envs.base.Env`).

Importing the package registers every environment module `envs/*_env.py` (see `load_all`).
"""

from envs.base import Env, EnvOptions, ParsedAction, StepResult, TurnEnv  # noqa: F401
from envs.demos import Episode, Turn, expert_episodes, expert_solve_rate  # noqa: F401,E402
from envs.registry import ENVS, UNAVAILABLE, describe, env_class, load_all, make_env, validate_options  # noqa: F401
from envs.vector import VectorEnv  # noqa: F401

load_all()
