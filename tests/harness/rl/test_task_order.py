"""Which train tasks a seed plays: by default every train.seed plays the same fresh-task sequence
(seeds differ in sampling and initialisation only); env.task_order: seeded gives each seed its own
disjoint block; a pool (env.train_tasks) is drawn with train.seed either way."""

from envs.registry import ENVS
from harness.experiments.tracking import RunLogger
from harness.rl.trainer import Trainer
from tests.helpers.configs import small_cfg


def tasks_of(tmp_path, name, updates=4, **over):
    t = Trainer(small_cfg(**over), tmp_path / name, RunLogger(tmp_path / f"log_{name}"))
    try:
        return [t.worker.train_tasks(u, 0) for u in range(updates)], t.cfg
    finally:
        t.close()


def test_train_seed_and_task_order(tmp_path):
    train = ENVS.get("frozenlake").task_seeds("train", 2_000)
    shared0, cfg = tasks_of(tmp_path, "s0", **{"train.seed": 0})
    shared1, _ = tasks_of(tmp_path, "s1", **{"train.seed": 1})
    k = cfg.rollout.tasks_per_update
    assert shared0 == shared1 == [train[u * k : (u + 1) * k] for u in range(4)]  # the default: shared

    seeded0, _ = tasks_of(tmp_path, "d0", **{"train.seed": 0, "env.task_order": "seeded"})
    seeded1, cfg1 = tasks_of(tmp_path, "d1", **{"train.seed": 1, "env.task_order": "seeded"})
    assert seeded0 == shared0  # seed 0's block is the shared sequence
    block = (cfg1.train.updates + 1) * k
    assert seeded1 == [train[block + u * k : block + (u + 1) * k] for u in range(4)]
    assert not {s for b in seeded0 for s in b} & {s for b in seeded1 for s in b}  # disjoint

    pool0, _ = tasks_of(tmp_path, "p0", **{"train.seed": 0, "env.train_tasks": 6})
    pool1, _ = tasks_of(tmp_path, "p1", **{"train.seed": 1, "env.train_tasks": 6})
    assert pool0 != pool1 and {s for b in pool0 + pool1 for s in b} <= set(train[:6])
