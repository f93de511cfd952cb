"""What judging one gate rule gives: pass, fail or not evaluated, with the reason (pure).

Shared by the absolute rules (``oomload.verdict.gate``) and the rules relative to a baseline run
(``oomload.verdict.relative``), with the comparison operators both parse; ``oomload.verdict.gate``
re-exports these names.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, Protocol

from oomload.capacity.schedule import MAX_CONCURRENCY
from oomload.errors import ConfigError

Op = Literal["<=", ">=", "==", "<", ">"]
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "<": operator.lt,
    ">": operator.gt,
}
UPPER_BOUNDS = ("<", "<=", "==")  # operators that bound a value from above


def rule_int(text: str, rule: str, what: str) -> int:
    """A whole number in 1..``MAX_CONCURRENCY`` in a gate rule (a level: no run measures one past it);
    ``ConfigError`` naming the rule otherwise."""
    try:
        value = int(text)
    except ValueError as err:
        raise ConfigError(f"gate {rule!r}: {what} {text!r} is not a whole number") from err
    if not 1 <= value <= MAX_CONCURRENCY:
        raise ConfigError(f"gate {rule!r}: {what} must be in 1..{MAX_CONCURRENCY:,}, got {value}")
    return value


def as_op(text: str) -> Op:
    for op in ("<=", ">=", "==", "<", ">"):
        if text == op:
            return op
    raise ValueError(f"unknown operator {text!r}")


class GateStatus(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NOT_EVALUATED = "not_evaluated"


class Rule(Protocol):
    """What a result needs of its rule: the text as written and the unit of ``observed``."""

    @property
    def text(self) -> str: ...

    @property
    def unit(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class GateResult:
    gate: Rule
    status: GateStatus
    reason: str
    observed: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "rule": self.gate.text,
            "status": self.status.value,
            "reason": self.reason,
            "observed": self.observed,
            "unit": self.gate.unit,
        }
