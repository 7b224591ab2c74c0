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
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def __post_init__(self) -> None:
        self.eot_id: int = self.tokenizer.convert_tokens_to_ids(IM_END)
        if self.eot_id is None or self.eot_id == self.tokenizer.unk_token_id:
            raise ValueError(f"tokenizer has no {IM_END!r} token; the chat format needs it")
        self.pad_id: int = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eot_id

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt(self, instructions: str, first_observation: str) -> list[int]:
        return self.encode(prompt_text(instructions, first_observation))

    def observation(self, observation: str) -> list[int]:
        return self.encode(observation_text(observation))

    def action(self, action_text: str) -> list[int]:
        """Ids of an expert action (for SFT): its text followed by the end-of-turn token."""
        return self.encode(action_text) + [self.eot_id]

    def decode_action(self, ids: list[int]) -> str:
        """Text of a sampled action, without the end-of-turn token."""
        if ids and ids[-1] == self.eot_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)
