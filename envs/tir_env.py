"""Tool-integrated reasoning with a sandboxed Python interpreter, in the style of ToRL (Li et al. 2025,
arXiv 2503.23383).

Each task seed generates a math word problem with an exact integer answer that rewards computation,
of one of four kinds and at one of three difficulty levels (`level`; larger numbers and more steps):
- arithmetic: a multi-step expression over several integers (sums of products, powers);
- modular: the remainder of a power, or of a product of several numbers, modulo m;
- counting: how many integers in a range are divisible by some numbers and not by another;
- system: two linear equations with an integer solution; the answer is a function of (x, y).

A turn is either a program or the answer. A program is a fenced block ```python ... ```: the
harness runs it in the sandbox (envs/sandbox.py, docs/algorithms.md#sandbox) and shows its output as
```output ... ``` (an error shows its last lines, as ToRL truncates tracebacks; the output is escaped,
so it cannot close the fence, spell a chat-template token or carry control characters). At most
`max_calls` programs per episode (ToRL's C); a program past the cap is not run and the agent is told
to answer. A code block closes at a line that starts with ``` (as in Markdown; backticks inside the
program do not close it). The answer is `\\boxed{N}` written outside every code block (a `\\boxed`
inside the program, or after an unclosed fence, is part of the program), compared exactly with the
task's integer; it ends the episode. Text that is neither, or a turn over MAX_ACTION_CHARS, is a
format error.

Score (dense rewards, the rule judge): 1 once the correct answer is boxed; 0.5 while the agent's
programs have *computed* the answer: each program that exited normally with complete output claims
the last integer of its output (the value it ends on, as the expert's program prints only the
answer), and the claims so far are all the answer. Printing many candidates in one program claims
only the last; claiming different values in different programs (guessing across calls) revokes the
0.5 until the answer is boxed. So enumeration earns no more than one blind guess. Else 0.
Expert: the program that computes the answer, then the boxed answer it printed.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from math import lcm
from typing import Literal

from pydantic import Field

from envs.base import EnvOptions, ParsedAction, TurnEnv
from envs.registry import ENVS
from envs.sandbox import Limits, run_python
from envs.sandbox import require as require_sandbox

FENCE_OPEN, FENCE_CLOSE = "```python\n", "\n```"  # a closing fence starts a line
BOXED = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")
INTEGER = re.compile(r"-?\d+")
MAX_ACTION_CHARS = 65_536  # a turn is at most this long (a policy's turn is far shorter)
MAX_ANSWER_DIGITS = 64  # a longer boxed number is a wrong answer, not parsed as an int
KINDS = ("arithmetic", "modular", "counting", "system")


class TIROptions(EnvOptions):
    level: int = Field(1, ge=1, le=3, description="difficulty: size of the numbers and number of steps")
    kinds: list[Literal["arithmetic", "modular", "counting", "system"]] = Field(
        list(KINDS), min_length=1, description="problem kinds drawn from (uniformly, by seed)"
    )
    max_calls: int = Field(2, ge=0, le=16, description="programs run per episode (ToRL's tool-call cap C)")
    wall_s: float = Field(3.0, gt=0, le=60, description="wall-clock limit of one program (seconds)")
    memory_mb: int = Field(256, ge=64, le=4096, description="address-space limit of one program")
    output_chars: int = Field(400, ge=16, le=20_000, description="characters of output shown to the agent")


@dataclass(frozen=True)
class Problem:
    kind: str
    text: str
    program: str  # the expert's program; it prints the answer
    answer: int


def _arithmetic(rng: random.Random, level: int) -> Problem:
    hi = (20, 200, 2000)[level - 1]
    n = 2 + level
    pairs = [(rng.randint(2, hi), rng.randint(2, hi)) for _ in range(n)]
    e = rng.randint(2, 1 + level)
    terms = " + ".join(f"{x}*{y}" for x, y in pairs)
    total = sum(x * y for x, y in pairs)
    if level == 3:  # keep the answer short: its last nine digits
        return Problem(
            "arithmetic",
            f"Let S = {terms}. What is S^{e} modulo 1000000000?",
            f"S = {terms}\nprint(S**{e} % 10**9)\n",
            total**e % 10**9,
        )
    return Problem("arithmetic", f"Let S = {terms}. What is S^{e}?", f"S = {terms}\nprint(S**{e})\n", total**e)


def _modular(rng: random.Random, level: int) -> Problem:
    m = rng.randint(7, (50, 1000, 100_000)[level - 1])
    if rng.random() < 0.5:
        base, exp = rng.randint(2, 10**level * 10), rng.randint(10, 10 ** (level + 1))
        return Problem(
            "modular",
            f"What is the remainder when {base}^{exp} is divided by {m}?",
            f"print(pow({base}, {exp}, {m}))\n",
            pow(base, exp, m),
        )
    xs = [rng.randint(10, 10 ** (level + 2)) for _ in range(2 + level)]
    prod = 1
    for x in xs:
        prod *= x
    shown = " * ".join(map(str, xs))
    return Problem(
        "modular",
        f"What is the remainder when {shown} is divided by {m}?",
        f"print(({shown}) % {m})\n",
        prod % m,
    )


def _counting(rng: random.Random, level: int) -> Problem:
    n = rng.randint(100, (1_000, 100_000, 10_000_000)[level - 1])
    p, q = rng.sample([2, 3, 5, 7, 11, 13], 2)
    r = rng.choice([4, 6, 9, 10, 15, 21])
    # inclusion-exclusion: |p or q| - |(p or q) and r|
    answer = (n // p + n // q - n // lcm(p, q)) - (n // lcm(p, r) + n // lcm(q, r) - n // lcm(p, q, r))
    program = (
        f"from math import lcm\nn, p, q, r = {n}, {p}, {q}, {r}\n"
        "either = n // p + n // q - n // lcm(p, q)\n"
        "with_r = n // lcm(p, r) + n // lcm(q, r) - n // lcm(p, q, r)\n"
        "print(either - with_r)\n"
    )
    return Problem(
        "counting",
        f"How many integers k with 1 <= k <= {n} are divisible by {p} or by {q}, but not by {r}?",
        program,
        answer,
    )


def _linear(a: int, b: int) -> str:
    """a x + b y, written as a person would (3x - 4y, -x + y)."""

    def term(c: int, v: str, first: bool) -> str:
        mag = "" if abs(c) == 1 else str(abs(c))
        sign = ("-" if c < 0 else "") if first else (" - " if c < 0 else " + ")
        return f"{sign}{mag}{v}"

    return term(a, "x", True) + term(b, "y", False)


def _system(rng: random.Random, level: int) -> Problem:
    hi = (20, 200, 5000)[level - 1]
    x, y = rng.randint(-hi, hi), rng.randint(-hi, hi)
    while True:
        a, b, c, d = (rng.randint(1, 9 * level) * rng.choice((1, -1)) for _ in range(4))
        if a * d - b * c != 0:
            break
    e, f = a * x + b * y, c * x + d * y
    program = (
        f"a, b, e = {a}, {b}, {e}\nc, d, f = {c}, {d}, {f}\ndet = a*d - b*c\n"
        "x = (e*d - b*f) // det\ny = (a*f - e*c) // det\nprint(x*y + x - y)\n"
    )
    return Problem(
        "system",
        f"Integers x and y satisfy {_linear(a, b)} = {e} and {_linear(c, d)} = {f}. What is xy + x - y?",
        program,
        x * y + x - y,
    )


MAKERS = {"arithmetic": _arithmetic, "modular": _modular, "counting": _counting, "system": _system}


def make_problem(seed: int, options: TIROptions) -> Problem:
    rng = random.Random(seed)
    kind = options.kinds[rng.randrange(len(options.kinds))]
    return MAKERS[kind](rng, options.level)


def code_block(program: str) -> str:
    return f"```python\n{program}```"


def read_turn(text: str) -> tuple[str | None, str | None]:
    """(program, answer) of one turn, in time linear in its length. The program is the body of the
    first ```python block (closed by a line starting with ```); the answer is the number of the first
    \\boxed{N} outside every code block, with its sign and without leading zeros (a number over
    MAX_ANSWER_DIGITS digits is kept as written, so it is a wrong answer rather than an int too long to
    parse). Text after an unclosed fence is code (as Markdown reads it), neither program nor answer."""
    program, outside, i = None, [], 0
    while (start := text.find(FENCE_OPEN, i)) >= 0:
        outside.append(text[i:start])
        body = start + len(FENCE_OPEN)
        end = text.find(FENCE_CLOSE, body - 1)  # the opening's own newline closes an empty block
        if end < 0:
            i = len(text)
            break
        if program is None:
            program = text[body : end + 1]
        i = end + len(FENCE_CLOSE)
    outside.append(text[i:])
    boxed = BOXED.search("\n".join(outside))
    if boxed is None:
        return program, None
    number = boxed.group(1)
    digits = number.lstrip("-")
    if len(digits) > MAX_ANSWER_DIGITS:
        return program, number
    return program, str(int(number))


def last_integer(output: str) -> str | None:
    """The last integer written in a program's output (what it computed, by the score's rule)."""
    numbers = INTEGER.findall(output)
    return numbers[-1] if numbers else None


@ENVS.register(
    "tir",
    doc="tool-integrated reasoning: generated math problems solved by writing Python run in a "
    "kernel-isolated sandbox, answer in \\boxed{}",
    source="ToRL (Li et al. 2025, arXiv 2503.23383): code blocks, output feedback, tool-call cap C",
)
class ToolIntegratedReasoning(TurnEnv):
    name = "tir"
    Options = TIROptions
    observation_markers = ("```output",)

    @property
    def instructions(self) -> str:
        return (
            "Solve the problem. To compute, write a Python program in a block ```python ... ``` and it is run; "
            "its printed output comes back. Give the final answer as \\boxed{N}."
        )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        require_sandbox()

    def _new_task(self, seed: int) -> None:
        self.problem = make_problem(seed, self.options)
        self.calls = 0
        self.feedback = ""
        self.answered: str | None = None  # the boxed number as written (sign and digits, no leading zeros)
        self.claims: set[str] = set()  # the last integers of the programs that ran to completion

    def _apply(self, action: str) -> str:
        program, answer = read_turn(action)
        if answer is not None:
            self.answered = answer
            self.feedback = ""
            return ""
        if self.calls >= self.options.max_calls:
            self.feedback = f"Tool call limit ({self.options.max_calls}) reached: give the answer as \\boxed{{N}}."
            return ""
        self.calls += 1
        o = self.options
        result = run_python(program, Limits(wall_s=o.wall_s, cpu_s=max(1, int(o.wall_s)), memory_mb=o.memory_mb))
        shown = result.observation(limit=o.output_chars).strip()
        claim = last_integer(result.stdout) if result.ok else None
        if claim is not None:
            self.claims.add(claim)
        self.feedback = f"```output\n{shown}\n```"
        return ""

    @property
    def computed(self) -> bool:
        """Every program that ran to completion ended on the answer (and at least one did)."""
        return self.claims == {str(self.problem.answer)}

    def render(self) -> str:
        return f"{self.problem.text}\n{self.feedback}" if self.feedback else self.problem.text

    def score(self) -> float:
        if self.won():
            return 1.0
        return 0.5 if self.computed else 0.0

    def won(self) -> bool:
        return self.answered == str(self.problem.answer)

    def over(self) -> bool:
        return self.answered is not None

    def state_key(self) -> str:
        return f"{self._seed}|{self.calls}|{int(self.computed)}|{self.feedback}"

    def admissible(self) -> list[str] | None:
        return None

    def parse_action(self, text: str) -> ParsedAction:
        if len(text) > MAX_ACTION_CHARS:
            return ParsedAction(None, True, f"a turn is at most {MAX_ACTION_CHARS} characters")
        if read_turn(text) != (None, None):
            return ParsedAction(text.strip(), False)
        return ParsedAction(None, True, "write a program in ```python ... ``` or the answer as \\boxed{N}")

    def expert_action(self) -> str:
        if self.computed or self.calls >= self.options.max_calls:
            return f"\\boxed{{{self.problem.answer}}}"
        return code_block(self.problem.program)

    def task_type(self, seed: int) -> str:
        return make_problem(seed, self.options).kind
