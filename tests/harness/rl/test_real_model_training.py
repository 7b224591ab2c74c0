"""Training SmolLM2-135M-Instruct (packaged, tests/helpers/real_model.py) through the harness: one run of the
real trainer with `model.name: smollm2-135m-instruct`, an SFT warm-up on an expert demonstration and one
LoRA update, on 3x3 FrozenLake with the smallest budgets (1 demonstration, 2 rollouts of 2 turns of at
most 3 tokens, 1 held-out task); its adapter is then loaded by a plain transformers + peft client and
its point evaluated by `harness eval`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from harness.cli.main import main
from harness.config.loading import dump_config
from harness.config.schema import RunConfig
from harness.experiments.tracking import RunLogger
from harness.model.cache import read_record
from harness.rl.rollout import sample_prompts
from harness.rl.trainer import Trainer
from tests.helpers.real_model import NAME, in_run_cache, smollm2_fixture  # noqa: F401

RAW = {
    "model": {"name": NAME, "lora": {"r": 4, "alpha": 8}},
    "env": {"name": "frozenlake", "heldout_tasks": 1, "options": {"size": 3}},
    "sft": {"demos": 1, "epochs": 2, "batch_size": 1, "lr": 1e-3},
    "rollout": {"tasks_per_update": 1, "group_size": 2, "max_new_tokens": 3, "temperature": 1.0},
    "turns": {"max": 2},
    # the entropy bonus gives the adapter a gradient even when both rollouts earn the same reward
    "algo": {"lr": 1e-3, "micro_batch_size": 2, "entropy_coef": 0.01},
    "train": {
        "updates": 1,
        "eval_every": 0,
        "eval_episodes": 1,
        "checkpoint_every": 1,
        "mi_every": 0,
        "threads": 1,
        "device": "cpu",
    },
    "tracking": {"mlflow": False, "samples": 0},
}
PROMPT = "Reply with one word: up, down, left or right."


@pytest.fixture(scope="module")
def point(smollm2, tmp_path_factory):
    """The finished run: its folder, summary, the weights before and after the update, and the trained
    policy's greedy reply to PROMPT."""
    mp = pytest.MonkeyPatch()
    cache = tmp_path_factory.mktemp("cache")  # the SFT warm-up writes a 538 MB model here
    mp.setenv("HARNESS_CACHE", str(cache))
    in_run_cache(smollm2)  # `harness models fetch` into this run's cache, without converting again
    cfg = RunConfig.model_validate(RAW)
    folder = tmp_path_factory.mktemp("results") / "s" / "p"
    logger = RunLogger(folder)
    trainer = Trainer(cfg, folder, logger)
    try:
        model = trainer.policy.model
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        summary = trainer.run()
        after = {n: p.detach().clone() for n, p in model.named_parameters()}
        chat = trainer.policy.chat
        prompt = chat.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
        prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
        gen = [torch.Generator().manual_seed(0)]
        reply = sample_prompts(model, chat, [list(prompt)], gen, max_new_tokens=6, temperature=1.0, greedy=True)
    finally:
        trainer.close()
        logger.close("done")
    (folder / "config.yaml").write_text(dump_config(cfg))
    yield SimpleNamespace(folder=folder, summary=summary, before=before, after=after, prompt=prompt, reply=reply)
    mp.undo()
    shutil.rmtree(cache, ignore_errors=True)


def test_the_run_starts_from_the_packaged_model_and_its_sft_warmup(point, smollm2):
    assert point.summary["model/base"] == f"packaged:{smollm2.name}"
    assert point.summary["model/sft"].startswith("sft:")


def test_sft_warmup_on_expert_demonstrations_lowers_the_demo_loss(point):
    from harness.model.cache import cache_dir

    entry = cache_dir() / "sft" / point.summary["model/sft"].removeprefix("sft:")
    record = read_record(entry)
    assert record["info"]["demos"] == 1
    losses = record["info"]["sft"]["sft/epoch_losses"]
    assert len(losses) == 2 and losses[1] < losses[0], losses
    assert json.loads((entry / "config.json").read_text())["model_type"] == "llama"  # merged: a plain model


def test_one_lora_update_changes_the_adapter_and_nothing_else(point):
    changed = {n for n in point.before if not torch.equal(point.before[n], point.after[n])}
    lora = {n for n in point.before if "lora_" in n}
    assert lora and changed and changed <= lora, sorted(changed - lora)[:5]
    assert any("lora_B" in n for n in changed)  # B starts at zero: the update moved the adapter's output
    assert (point.folder / "adapter" / "adapter_model.safetensors").is_file()


CLIENT = """
import json, sys
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

adapter, prompt = sys.argv[1], json.loads(sys.argv[2])
base = json.load(open(adapter + "/adapter_config.json"))["base_model_name_or_path"]
tok = AutoTokenizer.from_pretrained(adapter)
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter).eval()
ids = torch.tensor([prompt])
out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
new = out[0, ids.shape[1]:].tolist()
print(json.dumps({"ids": new, "text": tok.decode(new, skip_special_tokens=True), "harness": "harness" in sys.modules}))
"""


def test_a_plain_transformers_and_peft_client_loads_the_adapter_and_generates(point):
    """No harness import: AutoModelForCausalLM + PeftModel.from_pretrained on the saved adapter; its
    greedy reply is the trained policy's own (the same tokens as the harness's sampler)."""
    proc = subprocess.run(
        [sys.executable, "-c", CLIENT, str(point.folder / "adapter"), json.dumps(list(point.prompt))],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["harness"] and out["text"].strip()
    ours = point.reply.ids[0]
    assert out["ids"][: len(ours)] == ours, (out, ours)


def test_harness_eval_on_the_real_model_point(point, capsys):
    with pytest.raises(SystemExit) as done:
        main(["eval", str(point.folder), "--tasks", "1", "--samples", "1"])
    assert done.value.code in (0, None)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("eval adapter-heldout1-x1 of adapter: greedy success")
    summary = json.loads((point.folder / "eval" / "adapter-heldout1-x1.json").read_text())
    assert summary["results"]["greedy"]["tasks"] == 1 and summary["results"]["sampled"]["episodes"] == 1
