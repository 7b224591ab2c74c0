"""Collapse diagnostics: KL-spike and echo-trap detectors, their monitor, cross-prompt similarity.

docs/algorithms.md#diagnostics. Everything here is fed the per-update scalars the trainer already
reduces (one value per update, no tensors), so it costs nothing and adds no sync points.
The mutual-information proxy (RAGEN-2), which needs the model, lives in `harness.diagnostics.mi_proxy`.

Trackers are small stateful objects with `update(...) -> dict[str, float]` (namespaced
`diag/...` metrics for metrics.jsonl) and `state_dict()` / `load_state_dict()` holding plain
Python values only, so a run resumed from a checkpoint continues with identical flags.

Typical wiring (trainer, once per update, after the metrics dict is complete):

    monitor = CollapseMonitor()                    # or CollapseMonitor(stop_on=("echo_trap",))
    metrics.update(monitor.update(update, metrics))   # reads diag/kl_k3, env/group_reward_std
    state["collapse"] = monitor.state_dict()           # into the checkpoint
    if monitor.should_stop: break
    summary["collapsed_at"] = monitor.collapsed_at     # None or {"update": k, "reason": ...}
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

KL_KEY = "diag/kl_k3"  # per-update mean k3 KL to the reference (harness.rl.update)
GROUP_STD_KEY = "env/group_reward_std"  # per-update mean in-group reward std (harness.diagnostics.episode_metrics)
PROXY_KEY, TRUE_KEY = "env/proxy_success", "env/true_success"  # a probe's rewarded and true outcome (probe_metrics)


class KLSpikeDetector:
    """Flags a KL spike: the per-update mean k3 KL jumps above its own exponential moving average.

    z:          spike when `kl > ema + z * ema_std` (ema_std = sqrt of the EMA variance).
    alpha:      EMA weight of the newest value (0.1 ~ a 10-update memory).
    warmup:     no flag until this many values have been seen (the EMA needs a history).
    multiple:   if set, spike when `kl > multiple * ema` instead of the z-score test.
    min_rel_std: the std used in the z-score is at least `min_rel_std * |ema|`, so a perfectly
                smooth series (EMA variance ~ 0) is not flagged for float jitter.
    min_std:    and at least this many nats (after a first update at KL exactly 0 the EMA
                variance is 0, which gave z-scores of 1e11).
    max_kl:     a mean k3 KL above this is always a spike, warm-up or not (the collapse run
                jumped from 0 to 6.2 nats at its second update, inside the warm-up).
    min_kl:     no spike below this absolute mean k3 KL (nats per token). Measured on the tiny
                FrozenLake runs: healthy updates fluctuate between 0.01 and 0.15, which the
                z-test alone flagged in 9 of 15 runs of the clipping sweep; a collapse goes past 1.

    Each value is compared with the EMA of the values *before* it, then folded into the EMA
    (a sustained level shift is flagged once, then becomes the new normal). A non-finite KL is
    always a spike and is not folded in.
    """

    def __init__(
        self,
        z: float = 4.0,
        alpha: float = 0.1,
        warmup: int = 5,
        multiple: float | None = None,
        min_rel_std: float = 0.05,
        min_kl: float = 0.2,
        max_kl: float = 1.0,
        min_std: float = 0.01,
    ):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"KLSpikeDetector: alpha must be in (0, 1], got {alpha}")
        if multiple is not None and multiple <= 1.0:
            raise ValueError(f"KLSpikeDetector: multiple must be > 1 (a factor over the EMA), got {multiple}")
        self.z, self.alpha, self.warmup, self.multiple, self.min_rel_std = z, alpha, warmup, multiple, min_rel_std
        self.min_kl, self.max_kl, self.min_std = min_kl, max_kl, min_std
        self.count, self.mean, self.var = 0, 0.0, 0.0

    def _std(self) -> float:
        return max(math.sqrt(self.var), self.min_rel_std * abs(self.mean), self.min_std, 1e-12)

    def update(self, value: float) -> dict[str, float]:
        """Feed one update's mean KL; returns diag/kl_ema (the baseline it was compared with),
        diag/kl_zscore, diag/kl_spike (0/1) and diag/kl_blowup (0/1: above max_kl or non-finite)."""
        value = float(value)
        if not math.isfinite(value):
            return {"diag/kl_ema": self.mean, "diag/kl_zscore": math.inf, "diag/kl_spike": 1.0, "diag/kl_blowup": 1.0}
        blowup = float(value > self.max_kl)
        if self.count == 0:
            self.count, self.mean, self.var = 1, value, 0.0
            return {"diag/kl_ema": value, "diag/kl_zscore": 0.0, "diag/kl_spike": blowup, "diag/kl_blowup": blowup}
        baseline, zscore = self.mean, (value - self.mean) / self._std()
        if self.multiple is not None:
            spike = value > self.multiple * baseline
        else:
            spike = zscore > self.z
        spike = (spike and self.count >= self.warmup and value > self.min_kl) or value > self.max_kl
        diff = value - self.mean  # Welford-style exponentially weighted mean and variance
        self.mean += self.alpha * diff
        self.var = (1.0 - self.alpha) * (self.var + self.alpha * diff * diff)
        self.count += 1
        return {
            "diag/kl_ema": baseline,
            "diag/kl_zscore": zscore,
            "diag/kl_spike": float(spike),
            "diag/kl_blowup": blowup,
        }

    def state_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "var": self.var}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.count, self.mean, self.var = int(state["count"]), float(state["mean"]), float(state["var"])


class EchoTrapDetector:
    """RAGEN's echo trap: in-group reward std collapses and stays collapsed.

    Fed the per-update mean in-group reward std. The reference is its mean over the first
    `window_ref` updates; afterwards, the trap fires when the std stays below
    `ratio * reference` for `patience` consecutive updates (RAGEN: 10, 10, 0.1, and it stops
    training there). `fired_at` is the update at which the run of low values reached
    `patience`; it stays set once fired. A reference of 0 (every group already had zero
    variance) never fires; watch env/zero_var_group_frac for that case.
    """

    def __init__(self, window_ref: int = 10, patience: int = 10, ratio: float = 0.1):
        if window_ref < 1 or patience < 1:
            raise ValueError(f"EchoTrapDetector: window_ref and patience must be >= 1, got {window_ref}, {patience}")
        self.window_ref, self.patience, self.ratio = window_ref, patience, ratio
        self.seen, self.ref_sum, self.low_run = 0, 0.0, 0
        self.fired_at: int | None = None

    @property
    def reference(self) -> float | None:
        """Mean std over the first `window_ref` updates, once they have been seen."""
        return self.ref_sum / self.window_ref if self.seen >= self.window_ref else None

    @property
    def reason(self) -> str | None:
        if self.fired_at is None:
            return None
        return (
            f"echo_trap: in-group reward std below {self.ratio:g} x its first-{self.window_ref}-update "
            f"mean ({self.reference:.4g}) for {self.patience} consecutive updates, at update {self.fired_at}"
        )

    def update(self, value: float, step: int | None = None) -> dict[str, float]:
        """Feed one update's mean in-group reward std; `step` (default: the count of values fed)
        is what `fired_at` records. Returns diag/reward_std_ratio (std / reference, nan before the
        reference exists), diag/echo_low_run and diag/echo_trap (0/1, stays 1 once fired)."""
        value = float(value)
        self.seen += 1
        step = self.seen if step is None else int(step)
        if self.seen <= self.window_ref:  # still building the reference
            self.ref_sum += value
            return {"diag/reward_std_ratio": math.nan, "diag/echo_low_run": 0.0, "diag/echo_trap": 0.0}
        ref = self.reference
        self.low_run = self.low_run + 1 if value < self.ratio * ref else 0
        if self.fired_at is None and self.low_run >= self.patience:
            self.fired_at = step
        return {
            "diag/reward_std_ratio": value / ref if ref > 0 else math.nan,
            "diag/echo_low_run": float(self.low_run),
            "diag/echo_trap": float(self.fired_at is not None),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "ref_sum": self.ref_sum, "low_run": self.low_run, "fired_at": self.fired_at}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.seen, self.ref_sum, self.low_run = int(state["seen"]), float(state["ref_sum"]), int(state["low_run"])
        self.fired_at = None if state["fired_at"] is None else int(state["fired_at"])


class RewardHackingDetector:
    """The truth falls while the exploit grows, on the held-out tasks (docs/algorithms.md#reward-hacking).

    Two inputs. `update(proxy, true)`, per update, from the training episodes of a reward-hacking
    probe (`env/proxy_success`, `env/true_success`; only the probes report a truth; in a mixture,
    its own): logs `diag/proxy_true_gap` every update and, once `2 *
    window` updates are in, `diag/proxy_rise` and `diag/true_change` (mean of the last `window`
    updates minus the mean of the first `window`). These are curves, not the event: every update
    trains on other tasks, so a window's rates move with the tasks drawn. On the FrozenLake probe a
    rule on them ("proxy or hack rate up >= 0.1 while the truth is down >= 0.05", the rule until
    session 6) fired in all 18 runs of the reward_hacking sweep, at updates 10-11, where the same hard
    maps come up in every run, including the runs whose held-out truth never moved.

    `heldout(step, rows)`, at every evaluation, with the `eval_tasks.jsonl` rows of that evaluation:
    the event. The evaluation before RL (step 0) is the reference; each later evaluation plays the
    same tasks with the same sampling streams (common random numbers), so the change of a task's
    true success and exploit flag is the policy's, paired by (task, sample). With d the per-episode
    differences over the n pairs of one decoding mode (sampled, the policy RL trains; greedy where
    only greedy was evaluated) and z = mean(d) / (sd(d) / sqrt(n)), the event fires at the first
    evaluation where

        mean(d_true) <= -fall  and  z_true <= -z    and    mean(d_exploit) >= fall  and  z_exploit >= z

    the truth is down by at least `fall` (an effect size) beyond noise (a paired one-sided test), and
    the exploit is up as much: a policy that gets worse without exploiting is not hacking. At z = 2
    each look is a ~2.3% one-sided test; three looks (updates 10, 20, 30) make ~7% at most under no
    change. Logged at each evaluation: `diag/heldout_true_change`, `diag/heldout_exploit_change` and
    their z. `diag/reward_hacking` (0/1, stays 1) is the event."""

    def __init__(self, window: int = 5, fall: float = 0.05, z: float = 2.0):
        if window < 1 or fall <= 0 or z <= 0:
            raise ValueError(f"RewardHackingDetector: window >= 1, fall > 0, z > 0; got {window}, {fall}, {z}")
        self.window, self.fall, self.z = window, fall, z
        self.history: list[tuple[float, ...]] = []  # (proxy, true) per update (older checkpoints: + hack rate)
        self.reference: dict[str, tuple[int, int]] | None = None  # "mode/task/sample" -> (true, exploit)
        self.fired_at: int | None = None

    def update(self, proxy: float, true: float) -> dict[str, float]:
        self.history.append((float(proxy), float(true)))
        w = self.window
        out = {"diag/proxy_true_gap": float(proxy) - float(true)}
        if len(self.history) >= 2 * w:
            ref, now = self.history[:w], self.history[-w:]
            ref_p, ref_t = (sum(h[i] for h in ref) / w for i in (0, 1))
            now_p, now_t = (sum(h[i] for h in now) / w for i in (0, 1))
            out["diag/proxy_rise"], out["diag/true_change"] = now_p - ref_p, now_t - ref_t
        out["diag/reward_hacking"] = float(self.fired_at is not None)
        return out

    def heldout(self, step: int, rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """The paired held-out check; {} where the rows carry no truth (not a probe) or, after a
        resume from a checkpoint older than the reference, where there is nothing to pair with."""
        probe = {
            f"{r['mode']}/{r['task']}/{r['sample']}": (int(r["true_success"]), int(r["exploit_rate"]))
            for r in rows
            if "true_success" in r
        }
        if not probe:
            return {}
        if step == 0:
            self.reference = probe
            return {}
        if self.reference is None:
            return {}
        mode = "sampled/" if any(k.startswith("sampled/") for k in self.reference) else "greedy/"
        pairs = [(self.reference[k], v) for k, v in probe.items() if k.startswith(mode) and k in self.reference]
        if len(pairs) < 2:
            return {}
        (d_true, z_true), (d_exp, z_exp) = (_paired([b[i] - a[i] for a, b in pairs]) for i in (0, 1))
        if (
            self.fired_at is None
            and d_true <= -self.fall
            and z_true <= -self.z
            and d_exp >= self.fall
            and z_exp >= self.z
        ):
            self.fired_at = int(step)
        return {
            "diag/heldout_true_change": d_true,
            "diag/heldout_true_z": z_true,
            "diag/heldout_exploit_change": d_exp,
            "diag/heldout_exploit_z": z_exp,
            "diag/reward_hacking": float(self.fired_at is not None),
        }

    @property
    def reason(self) -> str | None:
        if self.fired_at is None:
            return None
        return (
            f"reward_hacking: held-out true success down by >= {self.fall:g} and the exploit rate up by >= "
            f"{self.fall:g} against the evaluation before RL (paired by task, |z| >= {self.z:g}), at update "
            f"{self.fired_at}"
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "history": [list(h) for h in self.history],
            "reference": None if self.reference is None else {k: list(v) for k, v in self.reference.items()},
            "fired_at": self.fired_at,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history = [tuple(float(x) for x in h) for h in state.get("history", [])]
        ref = state.get("reference")
        self.reference = None if ref is None else {k: (int(v[0]), int(v[1])) for k, v in ref.items()}
        self.fired_at = None if state.get("fired_at") is None else int(state["fired_at"])


def _paired(d: Sequence[float]) -> tuple[float, float]:
    """Mean of paired differences and its z (mean over its standard error); z = 0 when every
    difference is the same (no spread: nothing to test, and no change when they are all 0)."""
    n = len(d)
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    return mean, (mean / math.sqrt(var / n) if var > 0 else 0.0)


class CollapseMonitor:
    """Both detectors behind one call; records the first collapse event for the run summary.

    `update(step, metrics)` reads `diag/kl_k3` (KL spike) and `env/group_reward_std` (echo
    trap) from the update's metrics when present (a run without a reference model has no KL),
    and `env/proxy_success` with `env/true_success` (the reward-hacking curves; only the probes
    report the truth), and returns the detectors' diag/... metrics plus diag/collapsed (0/1, stays
    1). `heldout(step, rows)` takes each evaluation's episode rows: the reward-hacking event.
    `events` lists every event: each KL spike (the EMA z-test, a warning), each KL blow-up
    (mean k3 above the detector's max_kl, 1 nat by default), the echo trap once, and reward
    hacking once (`RewardHackingDetector`; an event, not a collapse: training itself is healthy).
    `collapsed_at`: None, or {"update": k, "reason": "kl_blowup" | "echo_trap"} of the first
    *collapse* event. A z-test spike alone is not a collapse: on the tiny FrozenLake clipping
    sweep, healthy runs had single-update spikes of 0.22-0.27 nats that fell back to 0.01 at
    the next update with success unchanged, while the collapse run went from 0 to 6.2 nats.
    `should_stop`: an event whose reason is in `stop_on` has happened (optional early stop;
    RAGEN stops on "echo_trap"; default: never).
    """

    REASONS = ("kl_spike", "kl_blowup", "echo_trap", "reward_hacking")
    COLLAPSE = ("kl_blowup", "echo_trap")

    def __init__(
        self,
        kl: KLSpikeDetector | None = None,
        echo: EchoTrapDetector | None = None,
        stop_on: Sequence[str] = (),
        hacking: RewardHackingDetector | None = None,
    ):
        unknown = set(stop_on) - set(self.REASONS)
        if unknown:
            raise ValueError(f"CollapseMonitor: stop_on has unknown reasons {sorted(unknown)}; allowed {self.REASONS}")
        self.kl = kl or KLSpikeDetector()
        self.echo = echo or EchoTrapDetector()
        self.hacking = hacking or RewardHackingDetector()
        self.stop_on = tuple(stop_on)
        self.events: list[dict[str, Any]] = []

    @property
    def collapsed_at(self) -> dict[str, Any] | None:
        first = next((e for e in self.events if e["reason"] in self.COLLAPSE), None)
        return dict(first) if first else None

    @property
    def should_stop(self) -> bool:
        return any(e["reason"] in self.stop_on for e in self.events)

    def update(self, step: int, metrics: Mapping[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        if KL_KEY in metrics:
            out.update(self.kl.update(metrics[KL_KEY]))
            if out["diag/kl_blowup"]:
                self.events.append({"update": int(step), "reason": "kl_blowup"})
            elif out["diag/kl_spike"]:
                self.events.append({"update": int(step), "reason": "kl_spike"})
        if GROUP_STD_KEY in metrics:
            fired_before = self.echo.fired_at is not None
            out.update(self.echo.update(metrics[GROUP_STD_KEY], step))
            if not fired_before and self.echo.fired_at is not None:
                self.events.append({"update": self.echo.fired_at, "reason": "echo_trap"})
        if PROXY_KEY in metrics and TRUE_KEY in metrics:
            out.update(self.hacking.update(metrics[PROXY_KEY], metrics[TRUE_KEY]))
        out["diag/collapsed"] = float(self.collapsed_at is not None)
        return out

    def heldout(self, step: int, rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """An evaluation's episode rows (eval_tasks.jsonl): the reward-hacking event's paired check
        (`RewardHackingDetector.heldout`); {} for every environment without a truth."""
        fired_before = self.hacking.fired_at is not None
        out = self.hacking.heldout(step, rows)
        if not fired_before and self.hacking.fired_at is not None:
            self.events.append({"update": self.hacking.fired_at, "reason": "reward_hacking"})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "kl": self.kl.state_dict(),
            "echo": self.echo.state_dict(),
            "hacking": self.hacking.state_dict(),
            "events": [dict(e) for e in self.events],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.kl.load_state_dict(state["kl"])
        self.echo.load_state_dict(state["echo"])
        self.hacking.load_state_dict(state.get("hacking", {}))  # checkpoints from before the detector: empty
        self.events = [dict(e) for e in state["events"]]


# ----------------------------------------------------------------------------- cross-prompt similarity
def _ngrams(text: str, n: int) -> frozenset[tuple[str, ...]]:
    """Word n-grams; a response shorter than n words is one gram (its whole word tuple)."""
    words = tuple(text.split())
    if len(words) < n:
        return frozenset([words]) if words else frozenset()
    return frozenset(words[i : i + n] for i in range(len(words) - n + 1))


def _jaccard(a: frozenset, b: frozenset) -> float:
    if not a and not b:
        return 1.0  # two empty responses are identical
    return len(a & b) / len(a | b)


def _cross_pairs(prompt_ids: Sequence[int], max_pairs: int, seed: int) -> list[tuple[int, int]]:
    """All (i, j), i < j, with different prompts; or `max_pairs` of them drawn with a fixed seed."""
    n = len(prompt_ids)
    total = n * (n - 1) // 2
    if total <= max_pairs:
        return [(i, j) for i in range(n) for j in range(i + 1, n) if prompt_ids[i] != prompt_ids[j]]
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    for _ in range(20 * max_pairs):  # rejection sampling; bounded even if most pairs share a prompt
        i, j = rng.randrange(n), rng.randrange(n)
        if prompt_ids[i] != prompt_ids[j]:
            pairs.append((i, j))
            if len(pairs) == max_pairs:
                break
    return pairs


def cross_prompt_similarity(
    responses: Sequence[str], prompt_ids: Sequence[int], n: int = 2, *, max_pairs: int = 2000, seed: int = 0
) -> float:
    """Mean word n-gram Jaccard overlap between responses to DIFFERENT prompts (RAGEN).

    Rising towards 1 = responses becoming input-agnostic (one template for every task).
    responses[i] answered prompt prompt_ids[i]. Pairs sharing a prompt are skipped. With more
    than `max_pairs` pairs, `max_pairs` are sampled (with replacement, fixed `seed`), so the
    cost is bounded and the value deterministic. nan when no two responses have different prompts.
    """
    if len(responses) != len(prompt_ids):
        raise ValueError(f"cross_prompt_similarity: {len(responses)} responses but {len(prompt_ids)} prompt ids")
    if n < 1:
        raise ValueError(f"cross_prompt_similarity: n must be >= 1, got {n}")
    pairs = _cross_pairs(list(prompt_ids), max_pairs, seed)
    if not pairs:
        return math.nan
    grams = [_ngrams(r, n) for r in responses]
    return sum(_jaccard(grams[i], grams[j]) for i, j in pairs) / len(pairs)
