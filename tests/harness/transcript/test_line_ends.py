"""`rollout.stop: line` at the token level (harness.transcript.chat.LineEnds, first_line), with the real
SmolLM2 tokenizer and with a Qwen-style BPE whose tokens can hold text and a newline together."""

from __future__ import annotations

import pytest
import torch

from harness.model.tokenizer import train_tokenizer
from harness.transcript.chat import ChatFormat, LineEnds, first_line
from tests.helpers.real_model import smollm2_fixture  # noqa: F401 - the `smollm2` fixture
from tests.helpers.smollm2 import tokenizer


def _stop_at(le: LineEnds, ids: list[int]) -> int | None:
    """Where a row writing `ids` one token at a time, as the sampler feeds them, stops (None: never)."""
    wrote = torch.zeros(1, dtype=torch.bool)
    for k, i in enumerate(ids):
        stop, wrote = le.step(torch.tensor([i]), wrote)
        if bool(stop):
            return k
    return None


def _reference(tok, ids: list[int]) -> int | None:
    """The rule in text: the first token after which the decoded text holds a newline after some text."""
    return next((k for k in range(len(ids)) if "\n" in tok.decode(ids[: k + 1]).lstrip()), None)


@pytest.fixture(scope="module")
def real(smollm2):
    """(the real tokenizer, its line-end tables)."""
    tok = tokenizer(smollm2)
    return tok, ChatFormat(tok).line_ends(len(tok))


@pytest.mark.parametrize("text", ["left\nright", "\n\n  left\n", "go to cabinet 1\n\nx", 'get_city("Ann")\nfoo', "up"])
def test_real_tokenizer_stops_where_the_first_line_of_text_ends(real, text):
    tok, le = real
    ids = tok.encode(text)
    assert _stop_at(le, ids) == _reference(tok, ids)


def test_real_tokenizer_tables_match_each_tokens_text(smollm2):
    tok = tokenizer(smollm2)
    le = LineEnds.of(tok, len(tok) + 64)  # a padded embedding: the extra ids are nothing
    pieces = tok.batch_decode([[i] for i in range(len(tok))])
    assert le.newline[: len(tok)].tolist() == ["\n" in p for p in pieces]
    assert le.text[: len(tok)].tolist() == [bool(p.strip()) for p in pieces]
    assert not le.newline[len(tok) :].any() and not le.text[len(tok) :].any()
    assert int(le.newline.sum()) > 50  # '\n', '\n\n', ' \n', ...: several ways to write a line end


def test_a_token_with_text_then_newline_stops_a_row_that_wrote_nothing_yet():
    """Qwen's split keeps punctuation with the newlines after it, so `()\\n` can be one BPE token: the
    row stops on it, the token is kept whole, and the first line is the text before the newline."""
    tok = train_tokenizer(["finish()\nnext()\nstop()\n"] * 50, vocab_size=400)
    le = LineEnds.of(tok, len(tok))
    ids = tok.encode("finish()\nnext()")
    pieces = [tok.decode([i]) for i in ids]
    k = next(j for j, p in enumerate(pieces) if "\n" in p)
    assert pieces[k].strip() and bool(le.closes[ids[k]])  # text and the newline in one token
    assert _stop_at(le, ids) == _reference(tok, ids) == k
    assert first_line(tok.decode(ids[: k + 1])) == "finish()"
    # the same token after a leading blank line: it still ends the first line of text
    lead = tok.encode("\n")
    assert _stop_at(le, lead + ids) == len(lead) + k


@pytest.mark.parametrize(
    "text, line",
    [("left", "left"), ("  left  \nright", "left"), ("\n\n go to cabinet 1 \n", "go to cabinet 1"), ("\n \n", "")],
)
def test_first_line_is_the_first_line_with_text_stripped(text, line):
    assert first_line(text) == line
