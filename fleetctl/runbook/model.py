"""A runbook as data: what `docs/runbooks/*.yaml` hold (the format: docs/runbooks/README.md).

A runbook has an id, a title, the symptoms it is for, preconditions (checked before anything changes), its
variables, its steps and its rollback. A step is exactly one of:
- `say`: text for the operator;
- `run`: a `fleetctl ...` command line (`{var}` placeholders substituted);
- `check`: a read-only `fleetctl ...` command run with `-o json`, a value picked from its output by `path`,
  compared by `op` with `expect` (or with the value at `expect_path` of the same output), polled every `interval_s` until it holds or `timeout_s` passes;
- `ask`: a question for the operator, whose answer becomes the variable `var`.
The kind is the key a step has; extra keys are refused, so a typo is an error rather than a no-op.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

ID_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
VAR_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
STEP_KINDS = ("say", "run", "check", "ask")
OPS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "not_in", "contains", "not_contains")
BUILTIN_VARS = ("runbook", "run_id")  # always defined: the runbook's id and this run's id


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _yes_no(value: Any) -> Any:
    """YAML 1.1 reads an unquoted yes/no as a boolean; an answer is text."""
    return ("yes" if value else "no") if isinstance(value, bool) else value


class Say(_Strict):
    say: str = Field(min_length=1, description="text shown to the operator")


class Run(_Strict):
    run: str = Field(min_length=1, description="a `fleetctl ...` command line; {var} placeholders substituted")
    timeout_s: float = Field(default=900.0, gt=0, description="seconds before the command is killed (a failure)")
    on_fail: str | None = Field(default=None, description="what to do next if the command fails")


class Check(_Strict):
    check: str = Field(min_length=1, description="a read-only `fleetctl ...` command; run with `-o json`")
    path: str = Field(default="", description="where the value is in the JSON: `a.0.b`, `*` maps over a "
                                               "list, `#` is a length, {var} substituted; empty: the whole document")
    op: Literal["eq", "ne", "gt", "gte", "lt", "lte", "in", "not_in", "contains", "not_contains"] = "eq"
    expect: Any = Field(default=None, description="the value to compare with (a string may hold {var} placeholders)")
    expect_path: str | None = Field(default=None, description="instead of `expect`: compare with the value at this "
                                                              "path of the same output")
    timeout_s: float = Field(default=0.0, ge=0, description="poll until this many seconds passed (0: check once)")
    interval_s: float = Field(default=2.0, gt=0, description="seconds between two polls")
    on_fail: str | None = Field(default=None, description="what to do next if it does not hold in time")

    @model_validator(mode="after")
    def _one_expectation(self) -> "Check":
        if ("expect" in self.model_fields_set) == (self.expect_path is not None):
            raise ValueError("a check compares with `expect` or with `expect_path`: give one of them")
        return self


class Ask(_Strict):
    ask: str = Field(min_length=1, description="the question")
    var: str = Field(description="the variable the answer is stored in; `--var NAME=...` answers it ahead")
    choices: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, description="the accepted answers (default: any non-empty text)")
    continue_if: str | None = Field(default=None, description="any other answer stops the run (nothing "
                                                              "is rolled back: the operator chose to stop)")

    @field_validator("choices", mode="before")
    @classmethod
    def _choices_text(cls, value: Any) -> Any:
        return [_yes_no(v) for v in value] if isinstance(value, list) else value

    @field_validator("continue_if", mode="before")
    @classmethod
    def _continue_text(cls, value: Any) -> Any:
        return _yes_no(value)


def step_kind(value: Any) -> str | None:
    """The step's kind: the one of STEP_KINDS it has as a key (None: none, or more than one)."""
    if isinstance(value, BaseModel):
        return next(k for k in STEP_KINDS if hasattr(value, k))
    if not isinstance(value, dict):
        return None
    kinds = [k for k in STEP_KINDS if k in value]
    return kinds[0] if len(kinds) == 1 else None


Step = Annotated[
    Union[Annotated[Say, Tag("say")], Annotated[Run, Tag("run")], Annotated[Check, Tag("check")],
          Annotated[Ask, Tag("ask")]],
    Discriminator(step_kind, custom_error_type="step_kind",
                  custom_error_message="a step has exactly one of the keys say, run, check, ask"),
]


class Var(_Strict):
    description: str = ""
    default: str | None = Field(default=None, description="none: `--var` (or a question) must give it")

    @field_validator("default", mode="before")
    @classmethod
    def _default_text(cls, value: Any) -> Any:
        return _yes_no(value) if isinstance(value, bool) else (str(value) if isinstance(value, (int, float)) else value)


class Runbook(_Strict):
    id: str = Field(pattern=ID_PATTERN, description="lowercase letters, digits and '-'; the file is ID.yaml")
    title: str = Field(min_length=1)
    symptoms: list[str] = Field(default_factory=list, description="what an operator sees when this applies")
    preconditions: list[Step] = Field(default_factory=list, description="say/check/ask: before any change")
    vars: dict[str, Var] = Field(default_factory=dict)
    steps: list[Step] = Field(min_length=1)
    rollback: list[Step] = Field(default_factory=list, description="offered when a step fails")

    @field_validator("vars")
    @classmethod
    def _var_names(cls, value: dict[str, Var]) -> dict[str, Var]:
        for name in value:
            if not VAR_NAME.match(name):
                raise ValueError(f"variable {name!r}: lowercase letters, digits and '_', not starting with a digit")
            if name in BUILTIN_VARS:
                raise ValueError(f"variable {name!r} is built in")
        return value

    def phases(self) -> list[tuple[str, list[Any]]]:
        return [("preconditions", list(self.preconditions)), ("steps", list(self.steps)),
                ("rollback", list(self.rollback))]
