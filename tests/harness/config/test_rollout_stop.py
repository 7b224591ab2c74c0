"""`rollout.stop` and `env.options.prompt` at load time: off by default, bad values named with the choices,
and the line stop refused with the vLLM engine (docs/algorithms.md#chat-prompts)."""

from __future__ import annotations

import pytest

from harness.config.errors import ConfigError
from harness.config.loading import load_run_config
from harness.config.schema import RunConfig


def _write(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_defaults_keep_the_old_behaviour():
    cfg = RunConfig()
    assert cfg.rollout.stop == "eot" and not cfg.rollout.constrain


def test_bad_stop_value_names_the_key_and_the_choices(tmp_path):
    path = _write(tmp_path, "env: {name: frozenlake}\n")
    with pytest.raises(ConfigError) as e:
        load_run_config(path, ["rollout.stop=paragraph"])
    message = str(e.value)
    assert "rollout.stop" in message and "paragraph" in message and "eot, line" in message


def test_bad_prompt_value_names_the_key_and_the_choices(tmp_path):
    path = _write(tmp_path, "env: {name: sokoban, options: {prompt: friendly}}\n")
    with pytest.raises(ConfigError) as e:
        load_run_config(path)
    message = str(e.value)
    assert message.startswith(str(path)) and "env.options.prompt" in message and "terse, chat" in message


def test_line_stop_is_refused_with_vllm():
    with pytest.raises(ValueError, match="rollout.stop = 'line'"):
        RunConfig.model_validate({"rollout": {"backend": "vllm", "stop": "line"}, "train": {"device": "cuda"}})
