"""Metrics of a list of episodes (rollout or evaluation), reduced once per update."""

from __future__ import annotations

import math
import statistics

from harness.transcript.records import Episode

# the names `episode_metrics` writes under its prefix (constrained_mass only with constrained decoding)
EVAL_METRICS = (
    "success",
    "return",
    "turns",
    "format_error_rate",
    "truncation_rate",
    "overflow_rate",
    "env_error_rate",
    "action_tokens",
    "hallucinated_obs_rate",
    "episodes",
    "constrained_mass",
)

# what `probe_metrics` adds for an environment that reports its true outcome (reward-hacking probes),
# or its deadlocks (Sokoban with `deadlock` on)
PROBE_METRICS = ("true_success", "proxy_success", "exploit_rate", "hack_rate", "deadlock_rate")


def _mean(xs) -> float:
    xs = list(xs)
    return float(statistics.fmean(xs)) if xs else 0.0


def final_info(ep: Episode) -> dict:
    return ep.steps[-1].info if ep.steps else {}


def probe_metrics(episodes: list[Episode], prefix: str) -> dict[str, float]:
    """Reward-hacking probes and the simulated user (docs/algorithms.md#reward-hacking), only for
    environments that report them in their final info: `true_success` (the outcome the proxy reward
    stands for), `exploit_rate` (episodes whose trace shows the exploit), `hack_rate` = #(rewarded and
    exploit) / #rewarded, `proxy_success` (the rewarded success on those same episodes), and
    `violation_rate` (acting on unconfirmed details), and `deadlock_rate` (Sokoban episodes that end
    with a box on a dead cell). Each is over the episodes whose final info reports it (in a mixture,
    the probe's own episodes; an episode ended by an env error has none)."""
    infos = [final_info(ep) for ep in episodes]
    out: dict[str, float] = {}
    # over the episodes of an environment that reports the truth (a mixture mixes in others)
    probe = [(ep, i) for ep, i in zip(episodes, infos) if "true_won" in i]
    if probe:
        won = [ep.won for ep, _ in probe]
        exploit = [bool(i.get("exploit", False)) for _, i in probe]
        out[f"{prefix}/true_success"] = _mean(bool(i["true_won"]) for _, i in probe)
        out[f"{prefix}/proxy_success"] = _mean(won)  # what the reward paid, on the same episodes
        out[f"{prefix}/exploit_rate"] = _mean(exploit)
        out[f"{prefix}/hack_rate"] = sum(w and x for w, x in zip(won, exploit)) / max(sum(won), 1)
    reporting = [i for i in infos if "violation" in i]
    if reporting:
        out[f"{prefix}/violation_rate"] = _mean(bool(i["violation"]) for i in reporting)
    reporting = [i for i in infos if "deadlock" in i]
    if reporting:
        out[f"{prefix}/deadlock_rate"] = _mean(bool(i["deadlock"]) for i in reporting)
    return out


def per_env_metrics(episodes: list[Episode], prefix: str, env_of, markers: tuple[str, ...] = ()) -> dict[str, float]:
    """`episode_metrics` of each environment of a mixture apart, under `{prefix}/{env}/...`;
    env_of: task seed -> the member's label (envs/mixture_env.py)."""
    by_env: dict[str, list[Episode]] = {}
    for ep in episodes:
        by_env.setdefault(env_of(ep.task_seed), []).append(ep)
    out: dict[str, float] = {}
    for label in sorted(by_env):
        out.update(episode_metrics(by_env[label], f"{prefix}/{label}", markers))
    return out


def episode_metrics(episodes: list[Episode], prefix: str, markers: tuple[str, ...] = ()) -> dict[str, float]:
    """success, return, turns, format errors, truncation, overflow, env errors, action length,
    hallucinated-observation rate (actions containing one of the env's observation markers).
    With constrained decoding also `constrained_mass`: the unconstrained policy's probability
    of the admissible continuations, exp(raw log-prob - constrained log-prob) = Z per action
    token, averaged (1 = the model no longer needs the constraint)."""
    steps = [s for ep in episodes for s in ep.steps]
    halluc = [any(m in s.action_text for m in markers) for s in steps] if markers else [False] * len(steps)
    mass = [
        math.exp(r - c)
        for s in steps
        if s.unconstrained_logprobs is not None
        for r, c in zip(s.unconstrained_logprobs, s.sampler_logprobs)
    ]
    extra = {f"{prefix}/constrained_mass": _mean(mass)} if mass else {}
    extra.update(probe_metrics(episodes, prefix))
    return {
        **extra,
        f"{prefix}/success": _mean(ep.won for ep in episodes),
        f"{prefix}/return": _mean(ep.outcome for ep in episodes),
        f"{prefix}/turns": _mean(ep.num_turns for ep in episodes),
        f"{prefix}/format_error_rate": _mean(s.format_error for s in steps),
        f"{prefix}/truncation_rate": _mean(ep.truncated for ep in episodes),
        f"{prefix}/overflow_rate": _mean(s.overflow for s in steps),
        f"{prefix}/env_error_rate": _mean(ep.env_error is not None for ep in episodes),
        f"{prefix}/action_tokens": _mean(len(s.action_ids) for s in steps),
        f"{prefix}/hallucinated_obs_rate": _mean(halluc),
        f"{prefix}/episodes": float(len(episodes)),
    }


def group_reward_stats(episodes: list[Episode]) -> dict[str, float]:
    """Mean in-group reward std (echo-trap signal) and the zero-variance group fraction."""
    groups: dict[int, list[float]] = {}
    for ep in episodes:
        groups.setdefault(ep.group, []).append(ep.outcome)
    stds = [statistics.pstdev(r) if len(r) > 1 else 0.0 for r in groups.values()]
    return {"env/group_reward_std": _mean(stds), "env/zero_var_group_frac": _mean(s == 0.0 for s in stds)}


def _turn_row(s) -> dict:
    row = {"observation": s.observation, "action": s.action_text, "reward": s.reward}
    if s.judge is not None:  # process rewards (reward.process): the verdict and the reward it added
        row.update(judge=s.judge, process_reward=s.process_reward)
    return row


def sample_rows(episodes: list[Episode], n: int) -> list[dict]:
    """The first `n` episodes as JSON rows for samples.jsonl."""
    return [
        {
            "task_seed": ep.task_seed,
            "group": ep.group,
            "won": ep.won,
            "return": ep.outcome,
            "turns": [_turn_row(s) for s in ep.steps],
        }
        for ep in episodes[:n]
    ]
