"""The turn format: a Qwen-style chat template built from token-id segments.

A training sequence is a concatenation of segments, each tokenized once and never decoded
and re-encoded:

    prompt segment   <|im_start|>system\n{instructions}<|im_end|>\n
                     <|im_start|>user\n{obs_1}<|im_end|>\n<|im_start|>assistant\n
    action segment   {sampled ids ...}<|im_end|>           (exactly as sampled; EOT included)
    obs segment      \n<|im_start|>user\n{obs_t}<|im_end|>\n<|im_start|>assistant\n
    action segment   ...

SFT demonstrations are assembled from the same segments, so the model is trained on the
token layout it later samples in. The same strings are Qwen2.5's own template, so real Qwen
checkpoints see their native format.

An observation is environment text, and some of it is untrusted (a program's output in `tir`): it is
tokenized with special tokens split (`encode_text`), and the template's own special tokens are put in
as ids around it, so no observation can spell `<|im_end|>` or `<|im_start|>assistant` and forge a turn.
For text without special-token strings the ids are exactly those of the joint string, since the
tokenizer splits a joint string at its special tokens and encodes the pieces apart (checked when a
ChatFormat is made, so a tokenizer whose special tokens strip their neighbours is refused).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

IM_START, IM_END, EOS = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END]
TRUNCATED = " [truncated]"


def prompt_text(instructions: str, first_observation: str) -> str:
    return (
        f"{IM_START}system\n{instructions}{IM_END}\n{IM_START}user\n{first_observation}{IM_END}\n{IM_START}assistant\n"
    )


def observation_text(observation: str) -> str:
    return f"\n{IM_START}user\n{observation}{IM_END}\n{IM_START}assistant\n"


@dataclass
class ChatFormat:
    """Tokenizes segments; holds the end-of-turn id that stops generation."""

    tokenizer: object
    _line_ends: LineEnds | None = field(default=None, init=False, repr=False)  # made by line_ends()

    def __post_init__(self) -> None:
        self.eot_id: int = self.tokenizer.convert_tokens_to_ids(IM_END)
        if self.eot_id is None or self.eot_id == self.tokenizer.unk_token_id:
            raise ValueError(f"tokenizer has no {IM_END!r} token; the chat format needs it")
        self.pad_id: int = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eot_id
        self.start_id: int = self.tokenizer.convert_tokens_to_ids(IM_START)
        self._newline, self._assistant = self.encode_text("\n"), self.encode_text("assistant\n")
        probe = "probe: (1, 2) at 10:30"
        if self.observation(probe) != self.encode(observation_text(probe)):
            raise ValueError(
                f"the tokenizer does not split text at {IM_START!r} / {IM_END!r} alone (a special token that "
                "strips its neighbours?); the chat format builds observation segments around them as ids"
            )

    def encode(self, text: str) -> list[int]:
        """Ids of trusted template text (special-token strings in it become special tokens)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_text(self, text: str) -> list[int]:
        """Ids of environment text: a special-token string in it is tokenized as plain text."""
        return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def prompt(self, instructions: str, first_observation: str) -> list[int]:
        return self.encode(f"{IM_START}system\n{instructions}{IM_END}") + self.observation(first_observation)

    def observation(self, observation: str) -> list[int]:
        """The ids of `observation_text(observation)`, the observation's own text never a special token."""
        user = self.encode_text(f"user\n{observation}")
        return [*self._newline, self.start_id, *user, self.eot_id, *self._newline, self.start_id, *self._assistant]

    def action(self, action_text: str) -> list[int]:
        """Ids of an expert action (for SFT): its text followed by the end-of-turn token."""
        return self.encode(action_text) + [self.eot_id]

    def decode_action(self, ids: list[int]) -> str:
        """Text of a sampled action, without the end-of-turn token."""
        if ids and ids[-1] == self.eot_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def line_ends(self, vocab: int) -> LineEnds:
        """The newline tables of this tokenizer over `vocab` ids (made once; `rollout.stop: line`)."""
        if self._line_ends is None or self._line_ends.vocab != vocab:
            self._line_ends = LineEnds.of(self.tokenizer, vocab)
        return self._line_ends


def first_line(text: str) -> str:
    """The action of a reply under `rollout.stop: line`: its first line with text, stripped ('' if none)."""
    return next((line.strip() for line in text.split("\n") if line.strip()), "")


@dataclass
class LineEnds:
    """Per token id, what `rollout.stop: line` needs to know of its text (docs/algorithms.md#chat-prompts).

    newline: the token holds a newline; closes: some newline in it follows text in the same token (a
    BPE token such as `)\\n`); text: it holds a character other than whitespace. A row that has written
    text stops at the first token holding a newline, and a row that has not stops at a token that
    `closes`; either way the whole token is kept, whatever follows the newline inside it. Ids past the
    tokenizer's vocabulary (padded embedding rows) decode to nothing: all False."""

    vocab: int
    newline: torch.Tensor  # (V,) bool
    closes: torch.Tensor  # (V,) bool
    text: torch.Tensor  # (V,) bool

    @classmethod
    def of(cls, tokenizer, vocab: int) -> LineEnds:
        pieces = tokenizer.batch_decode([[i] for i in range(min(vocab, len(tokenizer)))], skip_special_tokens=False)
        pieces += [""] * (vocab - len(pieces))

        def table(flags) -> torch.Tensor:
            return torch.tensor(list(flags), dtype=torch.bool)

        return cls(
            vocab,
            newline=table("\n" in x for x in pieces),
            closes=table(any(line.strip() for line in x.split("\n")[:-1]) for x in pieces),
            text=table(bool(x.strip()) for x in pieces),
        )

    def step(self, tokens: torch.Tensor, wrote: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(stop, wrote after) for `tokens` (B,) drawn by rows that had written text (`wrote`, (B,) bool)."""
        stop = self.newline[tokens] & (wrote | self.closes[tokens])
        return stop, wrote | self.text[tokens]

    def to(self, device) -> LineEnds:
        return LineEnds(self.vocab, self.newline.to(device), self.closes.to(device), self.text.to(device))
