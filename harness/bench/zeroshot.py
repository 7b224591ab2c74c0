"""Zero-shot table: a config's starting policy on held-out tasks, per prompt variant (docs/benchmarks.md#zero-shot).

    python -m harness.bench.zeroshot configs/smollm2_frozenlake.yaml [more configs] --episodes 32 \\
        [--variants terse,chat,chat+constrain] [--modes sampled,greedy] [-o KEY=VALUE ...] [--out FILE]

Each config's policy (its model, SFT warm-up and a fresh adapter: the policy RL would start from) plays the
first `--episodes` held-out tasks of its environment once per variant and mode, with the evaluation's
common random numbers (episode k of task j samples from the stream of (j, k) in every variant), so the
variants are paired task by task. Variants (each sets three keys over the config's own):

    terse           env.options.prompt terse, rollout.stop eot,  rollout.constrain false (the old prompt)
    chat            env.options.prompt chat,  rollout.stop line, rollout.constrain false
    chat+constrain  env.options.prompt chat,  rollout.stop line, rollout.constrain true

Reported per row: format errors over turns (95% interval: percentile bootstrap over episodes, since the
turns of one episode are not independent), success over episodes (95% Wilson score interval), and under
constrained decoding the mean over actions of the model's own probability of the admissible set,
exp(sum over the action's tokens of raw log-prob - constrained log-prob) (docs/algorithms.md#chat-prompts).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.config.errors import ConfigError, UnavailableError
from harness.config.loading import load_run_config
from harness.config.schema import RunConfig
from harness.transcript.records import Episode

VARIANTS = {
    "terse": {"prompt": "terse", "rollout.stop": "eot", "rollout.constrain": False},
    "chat": {"prompt": "chat", "rollout.stop": "line", "rollout.constrain": False},
    "chat+constrain": {"prompt": "chat", "rollout.stop": "line", "rollout.constrain": True},
}
MODES = ("sampled", "greedy")
BOOTSTRAP = 2000


@dataclass
class Row:
    env: str
    variant: str
    mode: str
    episodes: int
    turns: int
    format_errors: int
    format_error_rate: float
    format_error_ci: tuple[float, float]
    successes: int
    success: float
    success_ci: tuple[float, float]
    admissible_mass: float | None  # constrained decoding only: mean over actions of prod_k Z_k
    action_tokens: float
    seconds: float


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion k / n (docs/algorithms.md#chat-prompts)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, (centre - half) / (1 + z * z / n)), min(1.0, (centre + half) / (1 + z * z / n)))


def cluster_bootstrap(errors: list[int], turns: list[int], reps: int = BOOTSTRAP) -> tuple[float, float]:
    """95% percentile interval of sum(errors) / sum(turns), resampling whole episodes (seeded).

    When no turn or every turn is an error, every resample gives the same rate and the percentile
    interval collapses to a point ([0, 0] for 0/199 turns), which claims a certainty 32 episodes do not
    give. There the interval is Wilson's over episodes instead (episodes with an error / episodes): the
    episode is the independent unit, so this is the conservative count of trials."""
    e, t = np.asarray(errors, dtype=float), np.asarray(turns, dtype=float)
    if t.sum() == 0:
        return (0.0, 1.0)
    if e.sum() == 0 or e.sum() == t.sum():
        return wilson(int((e > 0).sum()), len(e))
    idx = np.random.default_rng(0).integers(0, len(e), size=(reps, len(e)))  # (reps, n)
    rates = e[idx].sum(1) / np.maximum(t[idx].sum(1), 1)
    return (float(np.quantile(rates, 0.025)), float(np.quantile(rates, 0.975)))


def summarise(env: str, variant: str, mode: str, episodes: list[Episode], seconds: float) -> Row:
    errors = [sum(s.format_error for s in ep.steps) for ep in episodes]
    turns = [len(ep.steps) for ep in episodes]
    steps = [s for ep in episodes for s in ep.steps]
    constrained = [s for s in steps if s.unconstrained_logprobs is not None]
    mass = (
        float(np.mean([math.exp(sum(s.unconstrained_logprobs) - sum(s.sampler_logprobs)) for s in constrained]))
        if constrained
        else None
    )
    won = sum(ep.won for ep in episodes)
    return Row(
        env=env,
        variant=variant,
        mode=mode,
        episodes=len(episodes),
        turns=sum(turns),
        format_errors=sum(errors),
        format_error_rate=sum(errors) / max(sum(turns), 1),
        format_error_ci=cluster_bootstrap(errors, turns),
        successes=won,
        success=won / max(len(episodes), 1),
        success_ci=wilson(won, len(episodes)),
        admissible_mass=mass,
        action_tokens=float(np.mean([len(s.action_ids) for s in steps])) if steps else 0.0,
        seconds=seconds,
    )


def variant_config(path: str, overrides: list[str], variant: str) -> RunConfig:
    """The config with the variant's three keys set over its own and `overrides`."""
    keys = VARIANTS[variant]
    return load_run_config(
        path,
        [
            *overrides,
            f"env.options.prompt={keys['prompt']}",
            f"rollout.stop={keys['rollout.stop']}",
            f"rollout.constrain={str(keys['rollout.constrain']).lower()}",
        ],
    )


def play(policy, cfg: RunConfig, episodes: int, mode: str) -> tuple[list[Episode], float]:
    """The first `episodes` held-out tasks, one episode each, as the trainer's evaluation plays them."""
    from envs.registry import env_class
    from envs.vector import VectorEnv
    from harness.rl.evaluate import episode_stream
    from harness.rl.rollout import collect

    tasks = env_class(cfg.env.name).task_seeds("heldout", episodes, cfg.env.options)
    e = cfg.env
    with VectorEnv(e.name, e.options, e.reward_density, e.format_penalty, n=len(tasks), workers=e.workers) as venv:
        t0 = time.perf_counter()
        out = collect(
            policy.model,
            policy.chat,
            venv,
            [(t, i) for i, t in enumerate(tasks)],
            cfg,
            generator=[episode_stream(t, 0) for t in tasks],
            instructions=venv.instructions,
            greedy=mode == "greedy",
        )
        return out, time.perf_counter() - t0


def run(configs: list[str], overrides: list[str], variants: list[str], modes: list[str], episodes: int, log=print):
    from harness.model.cache import cache_dir
    from harness.rl.build import load_policy, resolve_device
    from harness.rl.seeding import start_process

    rows: list[Row] = []
    for path in configs:
        base = load_run_config(path, overrides)
        start_process(base.train.seed, base.train.threads)
        policy = load_policy(base, cache_dir(), resolve_device(base.train.device))
        for variant in variants:
            cfg = variant_config(path, overrides, variant)
            for mode in modes:
                eps, seconds = play(policy, cfg, episodes, mode)
                rows.append(summarise(cfg.env.name, variant, mode, eps, seconds))
                log(markdown([rows[-1]], header=len(rows) == 1))
    return rows


def _ci(lo_hi: tuple[float, float]) -> str:
    return f"[{lo_hi[0]:.2f}, {lo_hi[1]:.2f}]"


def markdown(rows: list[Row], header: bool = True) -> str:
    lines = (
        [
            "| env | prompt | mode | episodes | format errors (turns) | 95% CI | success | 95% CI | "
            "admissible mass | tokens/action | seconds |",
            "| --- | --- | --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: |",
        ]
        if header
        else []
    )
    for r in rows:
        mass = "" if r.admissible_mass is None else f"{r.admissible_mass:.3f}"
        lines.append(
            f"| {r.env} | {r.variant} | {r.mode} | {r.episodes} | {r.format_error_rate:.2f} "
            f"({r.format_errors}/{r.turns}) | {_ci(r.format_error_ci)} | {r.success:.2f} ({r.successes}/{r.episodes}) "
            f"| {_ci(r.success_ci)} | {mass} | {r.action_tokens:.1f} | {r.seconds:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench.zeroshot", description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+", help="run config files (configs/smollm2_*.yaml)")
    ap.add_argument("--episodes", type=int, default=32, help="held-out tasks per environment (one episode each)")
    ap.add_argument("--variants", default="terse,chat,chat+constrain", help=f"comma-separated: {', '.join(VARIANTS)}")
    ap.add_argument("--modes", default="sampled", help=f"comma-separated: {', '.join(MODES)}")
    ap.add_argument("-o", "--override", action="append", default=[], help="KEY=VALUE for every config")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON lines here")
    args = ap.parse_args(argv)
    variants, modes = args.variants.split(","), args.modes.split(",")
    bad = [v for v in variants if v not in VARIANTS] + [m for m in modes if m not in MODES]
    if bad or args.episodes < 1:
        print(
            f"error: --variants takes {', '.join(VARIANTS)}; --modes {', '.join(MODES)}; --episodes >= 1 "
            f"(got {', '.join(bad) or args.episodes})",
            file=sys.stderr,
        )
        return 2
    try:
        rows = run(args.configs, args.override, variants, modes, args.episodes)
    except (ConfigError, UnavailableError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
