"""The copying probe: which action tokens repeat the conversation, and their loss / accuracy."""

from __future__ import annotations

import pytest

from harness.model.copying import is_copied
from harness.model.tiny import init_tiny_model
from harness.model.tokenizer import episode_text, train_tokenizer
from harness.rl.copying import copy_probe, main
from harness.rl.demos import collect_demos
from tests.helpers.configs import small_cfg


@pytest.mark.parametrize(
    "token, context, copied",
    [
        ("45", 'lookup("O-', True),  # digits are always something the model was told
        (' "Pam', 'Goal: out = get_city("Pam")\n', True),  # a name from the goal
        (' "Bern', 'Goal: out = get_city("Pam")\n', False),  # a capitalised word never said
        ("get", "Goal: out = get_city(", False),  # a call name is format
        ('")', 'get_city("Pam', False),
    ],
)
def test_which_tokens_count_as_copied(token, context, copied):
    assert is_copied(token, context) is copied


def _untrained(env, options):
    cfg = small_cfg()
    demos = collect_demos(env, options, 16)[0]
    tok = train_tokenizer([episode_text(d.instructions, d.observations, d.actions) for d in demos], 400, 1024)
    cfg.model.tiny.max_position = 1024
    return init_tiny_model(cfg.model.tiny, tok, 0), tok


def test_tool_calls_copy_and_frozenlake_moves_do_not():
    model, tok = _untrained("tooluse", {"action_format": "text"})
    rows = copy_probe(model, tok, "tooluse", {"action_format": "text"}, episodes=6)
    assert rows["copied"]["tokens"] > 0 and rows["other"]["tokens"] > rows["copied"]["tokens"]
    for r in rows.values():
        assert 0.0 <= r["accuracy"] <= 1.0 and r["loss"] > 0.0
    model, tok = _untrained("frozenlake", {})
    rows = copy_probe(model, tok, "frozenlake", {}, episodes=6)
    assert rows["copied"]["tokens"] == 0 and rows["other"]["tokens"] > 0  # moves are never copied


def test_bad_input_is_one_line_naming_it(tmp_path, capsys):
    assert main([str(tmp_path), "user"]) == 2
    assert "is not a model folder" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    assert main([str(tmp_path), "usr"]) == 2
    err = capsys.readouterr().err
    assert "usr" in err and "tooluse" in err
    assert main([str(tmp_path), "user", "{not json"]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert main([str(tmp_path), "user", "[1]"]) == 2
    assert "must be a JSON object" in capsys.readouterr().err
    assert main([str(tmp_path), "user", '{"max_items": "x"}']) == 2
    err = capsys.readouterr().err
    assert "max_items" in err and "Valid options" in err
