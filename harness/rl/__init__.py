"""The RL loop: trainer, rollout, sampling, training batches, losses, the update, checkpoints, seeding."""
