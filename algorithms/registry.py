"""A small registry: name -> function, with a doc line and a source for each entry.

Every ablation axis is one `Registry[Fn]`, typed with that axis's signature Protocol
(`algorithms.types`). The trainer looks functions up by the name a user wrote in YAML;
`harness axes` prints the entries and docs/algorithms.md lists them. Registering a name twice
is an error and an unknown name lists the valid choices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

Fn = TypeVar("Fn", bound=Callable[..., Any])


class UnknownChoiceError(KeyError):
    """Raised for a name that is not registered; the message lists the valid choices."""

    def __init__(self, axis: str, name: Any, choices: list[str]):
        self.axis, self.name, self.choices = axis, name, choices
        super().__init__(f"unknown {axis} {name!r}; choose one of: {', '.join(choices)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


@dataclass(frozen=True)
class Entry(Generic[Fn]):
    name: str
    fn: Fn
    doc: str
    source: str


class Registry(Generic[Fn]):
    """One axis: a mapping from the name users write to one function of a fixed signature."""

    def __init__(self, axis: str, doc: str):
        self.axis = axis  # dotted config key, e.g. "algo.clip.level"
        self.doc = doc
        self._entries: dict[str, Entry[Fn]] = {}

    def register(self, name: str, *, doc: str, source: str = "") -> Callable[[Fn], Fn]:
        def deco(fn: Fn) -> Fn:
            if name in self._entries:
                raise ValueError(f"{self.axis}: {name!r} is registered twice")
            self._entries[name] = Entry(name, fn, doc.strip(), source.strip())
            return fn

        return deco

    def get(self, name: str) -> Fn:
        return self.entry(name).fn

    def entry(self, name: str) -> Entry[Fn]:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownChoiceError(self.axis, name, self.names()) from None

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[Fn]]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)
