"""The run configuration: its schema, how a file becomes one, and the errors every layer raises.

Who owns what:
- `schema`: `RunConfig`, its checks across sections, and the one import point of every section. The
  sections live by topic in `model`, `env`, `algo` and `training`, built from the blocks of `fields`;
  each declares its defaults, bounds and documentation once (`harness config-docs` prints them).
- `algo`: also the one place where a section becomes the parameter dataclass its axis function
  receives (`ClipConfig.params` -> `algorithms.types.ClipParams`, ...).
- `loading`: YAML -> overrides -> preset -> validated `RunConfig` (`load_run_config`, `validate_run_config`),
  checked against the registries of `algorithms` and `envs` before anything runs.
- `keys`: dotted keys and the one-paragraph error texts that name them.
- `errors`: `ConfigError`, `ConfigWarning` and the other errors shown to users.

Only `store` sits below this layer; config imports `algorithms` (registries, presets, parameter
dataclasses, the checks an algorithm owns) and `envs` (the environment registry and options) to validate.
"""
