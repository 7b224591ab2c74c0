"""The RL loop: the trainer wiring a rollout worker (tasks, engines, filters, judge, ACT) to a learner
(training batch, losses, update, diagnostics), the episode loop, sampling, the rollout engines
(`engines/`), demonstrations, evaluation, checkpoints, seeding."""
