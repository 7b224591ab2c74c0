"""A hand-built episode for the batch-layout tests (token ids chosen so every segment is recognisable)."""

from harness.transcript.records import Episode, StepRecord

PAD = 0


def episode(group=0, ctx=False):
    # prompt [1,2,3]; a0 [10,11]; obs1 [4,5]; a1 [12]; obs2 [6]; a2 [13,14,15]
    segs = [([1, 2, 3], [10, 11]), ([4, 5], [12]), ([6], [13, 14, 15])]
    ep = Episode(task_seed=7, group=group, instructions="")
    seen: list[int] = []
    for t, (obs, act) in enumerate(segs):
        seen = seen + obs
        context = ([1, 2, 3] + obs if t else list(obs)) if ctx else None  # a 'single'-style context
        ep.steps.append(
            StepRecord(
                turn=t,
                obs_ids=obs,
                context_ids=context,
                action_ids=act,
                sampler_logprobs=[-0.5] * len(act),
                action_text="x",
                observation="o",
                reward=1.0 if t == 2 else 0.0,
                state_key=f"s{t}",
            )
        )
        seen = seen + act
    return ep
