"""A sweep file's `equivalence_margin` (the verdict column's margin, docs/algorithms.md#statistics):
off by default and absent from sweep.json then, recorded when set, and a bad value is one message
naming the file, the key, the value and what is allowed."""

from __future__ import annotations

import pytest

from harness.config.errors import ConfigError
from harness.experiments.sweep import load_sweep
from tests.helpers.sweeps import make_sweep


def _with(tmp_path, line: str, metric: str = "eval_sampled/success"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = make_sweep(tmp_path)
    path.write_text(path.read_text() + f"metric: {metric}\n{line}")
    return path


def test_the_margin_is_off_by_default_and_recorded_when_set(tmp_path):
    plain = load_sweep(_with(tmp_path / "a", "")).manifest()
    assert "equivalence_margin" not in plain  # sweeps without it write the same sweep.json as before
    set_ = load_sweep(_with(tmp_path / "b", "equivalence_margin: 0.03")).manifest()
    assert set_["equivalence_margin"] == 0.03
    turns = load_sweep(_with(tmp_path / "c", "equivalence_margin: 2", metric="eval_greedy/turns")).manifest()
    assert turns["equivalence_margin"] == 2  # not a rate: any positive number


@pytest.mark.parametrize(
    "value,allowed",
    [("0", "between 0 and 1"), ("1.5", "between 0 and 1"), ("-0.1", "between 0 and 1"), ("wide", "between 0 and 1")],
)
def test_a_bad_margin_names_the_file_key_value_and_what_is_allowed(tmp_path, value, allowed):
    path = _with(tmp_path, f"equivalence_margin: {value}")
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    message = str(info.value)
    assert message.startswith(f"{path}: equivalence_margin = ") and value in message
    assert allowed in message and "e.g. 0.05" in message and "\n" not in message
