"""What an engine really runs, as its agent reports it: `LaunchedCommand` (the command line and environment
the agent launched it with) and `ReportedConfig` (the settings the engine itself reports once it is ready).

Both travel in `EngineObserved` on every heartbeat, so the controller can compare what runs with the class
revision it was started for (live config drift). Both are bounded like every wire model: at most
`ARGV_MAX` arguments of `ARG_MAX` characters, `ENV_MAX` variables, `SETTINGS_MAX` settings.

No secrets leave the node: an environment variable whose name looks secret (`SECRET_WORDS`: TOKEN, KEY,
SECRET, PASSWORD, CREDENTIAL) has its value replaced by `REDACTED`, and so does the value of a command-line
flag whose name looks secret (`--api-key K`, `--hf-token=T`). The agent redacts before it sends; the models
redact again on validation, so a value that slipped through is never stored either.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.contract.bounds import Finite, Int64, bounded_text

ARGV_MAX = 256
ARG_MAX = 4000
ENV_MAX = 64
ENV_NAME_MAX = 200
ENV_VALUE_MAX = 4000
SETTINGS_MAX = 64
SETTING_NAME_MAX = 100
SETTING_TEXT_MAX = 500
VERSION_MAX = 200

REDACTED = "<redacted>"
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL")
# Matched per word of the name (split at '-', '_', '.'): a word that ends in TOKEN or KEY (HF_TOKEN, APIKEY)
# or holds SECRET, PASSWORD or CREDENTIAL. Per word, so max_num_batched_tokens and kv_cache_size_tokens,
# which count tokens, are not taken for secrets.
_SECRET_WORD = re.compile(r"(TOKEN|KEY)$|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)

Arg = bounded_text(ARG_MAX)
EnvName = Annotated[bounded_text(ENV_NAME_MAX, non_blank=True), Field(min_length=1)]
EnvValue = bounded_text(ENV_VALUE_MAX)
SettingName = Annotated[bounded_text(SETTING_NAME_MAX, non_blank=True), Field(min_length=1)]
SettingValue = bool | Int64 | Finite | bounded_text(SETTING_TEXT_MAX) | None
EngineSource = Literal["reference", "vllm"]


def looks_secret(name: str) -> bool:
    """A variable or flag name that may hold a credential (`SECRET_WORDS`, case-insensitively, per word)."""
    return any(_SECRET_WORD.search(word) for word in re.split(r"[-_.]+", name.lstrip("-")) if word)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {name: REDACTED if looks_secret(name) else value for name, value in env.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """`--api-key K` -> `--api-key <redacted>`; `--hf-token=T` -> `--hf-token=<redacted>`."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if arg.startswith("--") and looks_secret(arg.split("=", 1)[0]):
            if "=" in arg:
                arg = arg.split("=", 1)[0] + "=" + REDACTED
            else:
                hide_next = True
        out.append(arg)
    return out


class LaunchedCommand(BaseModel):
    """The command line the agent launched the engine with, and the environment variables it set for it
    (only those: not the agent's own environment). Secret-looking values are redacted."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    argv: list[Arg] = Field(default_factory=list, max_length=ARGV_MAX, description="the exact command line")
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=ENV_MAX,
                                         description="variables the agent set for the engine")

    @field_validator("argv")
    @classmethod
    def _redacted_argv(cls, argv: list[str]) -> list[str]:
        return redact_argv(argv)

    @field_validator("env")
    @classmethod
    def _redacted_env(cls, env: dict[str, str]) -> dict[str, str]:
        return redact_env(env)


class ReportedConfig(BaseModel):
    """The engine's own account of its effective settings, fetched by the agent once the engine is ready.

    `source` says how to read `settings`: "reference" is the reference engine's `GET /v1/fleet/config`
    (EngineConfig field names, resolved values: `kv_cache_dtype` is never "auto"); "vllm" is vLLM's
    `vllm:cache_config_info` labels (strings, as vLLM prints them) plus `max_model_len` and `root` from
    `GET /v1/models`. `version` is the engine's version (`GET /version` for vLLM)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    source: EngineSource
    version: bounded_text(VERSION_MAX) | None = None
    settings: dict[SettingName, SettingValue] = Field(default_factory=dict, max_length=SETTINGS_MAX)

    @field_validator("settings")
    @classmethod
    def _redacted_settings(cls, settings: dict[str, Any]) -> dict[str, Any]:
        return {name: REDACTED if looks_secret(name) and value is not None else value
                for name, value in settings.items()}
