"""A byte-level BPE tokenizer trained on environment text, for the locally built tiny models.

Machines without a model hub still need a tokenizer whose pieces fit the environments: it is
trained (HF `tokenizers`, deterministic) on the exact chat-formatted text of expert episodes —
instructions, observations and expert actions inside the Qwen turn format of `harness.transcript.chat` —
and wrapped as a transformers fast tokenizer carrying Qwen2.5's chat template. Pre-tokenization
is Qwen2's: its split regex (digits one by one) followed by byte-level mapping, so every string
is encodable and `decode(encode(s)) == s`.

Special tokens: `harness.transcript.chat.SPECIAL_TOKENS` (`<|endoftext|>` = pad, `<|im_start|>`,
`<|im_end|>` = end of turn and eos). Qwen's tool markers (`<tool_call>` ...) are added as
single, non-special tokens as in Qwen2.5.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from harness.transcript.chat import (
    EOS,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    TOOL_CALL,
    TOOL_CALL_END,
    TOOL_RESPONSE,
    TOOL_RESPONSE_END,
    observation_text,
    prompt_text,
)

# Qwen2's pre-tokenizer split pattern (tokenizer.json of Qwen2.5).
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TOOL_TOKENS = [TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END]

# Qwen2.5-Instruct's chat template (tokenizer_config.json), verbatim.
QWEN_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    "            {{- tool_call.name }}\n"
    '            {{- \'", "arguments": \' }}\n'
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# Template strings every tokenizer sees at least once, whatever the environment.
TEMPLATE_TEXT = (
    prompt_text("You are a helpful assistant.", "Hello")
    + "Hi"
    + IM_END
    + observation_text("<tool_response>\n{}\n</tool_response>")
    + TOOL_CALL
    + '\n{"name": "f", "arguments": {}}\n'
    + TOOL_CALL_END
    + IM_END
)


def episode_text(instructions: str, observations: Sequence[str], actions: Sequence[str]) -> str:
    """The exact text of one episode in the turn format (what the model is trained on)."""
    parts = [prompt_text(instructions, observations[0])]
    for t, action in enumerate(actions):
        parts.append(action + IM_END)
        if t + 1 < len(observations):
            parts.append(observation_text(observations[t + 1]))
    return "".join(parts)


def train_tokenizer(texts: Iterable[str], vocab_size: int, model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` (deterministic: same texts -> same vocab and merges).

    `vocab_size` counts the three special tokens; BPE stops earlier when no pair occurs twice.
    The four tool markers are added on top. Returns a transformers fast tokenizer.
    """
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEMPLATE_TEXT, *texts], trainer=trainer)
    return wrap_tokenizer(tok, model_max_length)


def wrap_tokenizer(tok: Tokenizer, model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    """Wrap a raw `tokenizers.Tokenizer` with Qwen's special tokens and chat template."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=EOS,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    fast.add_tokens(TOOL_TOKENS, special_tokens=False)
    fast.chat_template = QWEN_CHAT_TEMPLATE
    return fast
