"""Reference text environments behind one protocol (`envs.base.Env`)."""
from envs.base import Env, EnvOptions, ParsedAction, StepResult  # noqa: F401
from envs.registry import ENVS, make_env  # noqa: F401
