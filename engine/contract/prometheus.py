"""The one reader of Prometheus' text exposition: the agent, the gateway, tests and benchmarks all use it.

A line scan, not a full parser: every line that is not blank or a `#` comment is a sample
`name{labels} value [timestamp]`; `sample_lines` yields each as (name, the raw text between the braces,
value) and leaves the labels unparsed, because the gateway scrapes every engine every second on the event
loop that also relays tokens and almost never needs them (prometheus_client's parser spent ~10 ms on a
vLLM-sized exposition, most of it on histogram buckets nobody reads). `parse_labels` parses them when
wanted. A sample line whose value is not a number raises ValueError: a text that is not an exposition is
refused, never read as zeros. Values are returned as written, NaN and infinities included; what to do with
those is the caller's decision.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def sample_lines(text: str) -> Iterator[tuple[str, str, float]]:
    """(metric name, raw label text, value) of every sample in `text`, in order."""
    for line in text.splitlines():
        if line and line[0] != "#":
            yield split_sample(line)


def split_sample(line: str) -> tuple[str, str, float]:
    """(metric name, the text between the braces, the value) of one sample line."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        close = line.rfind("}")
        if close < brace:
            raise ValueError(f"unterminated labels in metrics line: {line[:120]!r}")
        name, labels, rest = line[:brace], line[brace + 1 : close], line[close + 1 :]
    else:
        name, labels, rest = (line[:space], "", line[space + 1 :]) if space != -1 else (line, "", "")
    return name, labels, _value(rest, line)


def parse_labels(raw: str) -> dict[str, str]:
    """The label set of a sample from its raw label text (`engine="0",model_name="m"`), values unescaped."""
    return {key: _unescape(value) for key, value in _LABEL.findall(raw)}


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample with its labels parsed."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse_samples(text: str) -> dict[str, list[Sample]]:
    """Every sample in `text` by name (a counter's `_total`, a histogram's `_bucket`/`_sum`/`_count` each
    under its own name), labels parsed. For tests and reports; the hot paths use `sample_lines`."""
    samples: dict[str, list[Sample]] = {}
    for name, raw, value in sample_lines(text):
        samples.setdefault(name, []).append(Sample(name, parse_labels(raw), value))
    return samples


def sum_series(samples: Mapping[str, list[Sample]], name: str, **labels: str) -> float:
    """The sum over the series of `name` whose labels include `labels` (0 if none)."""
    return sum(s.value for s in samples.get(name, ()) if all(s.labels.get(k) == v for k, v in labels.items()))


def _value(field: str, line: str) -> float:
    try:
        return float(field.split()[0])
    except (IndexError, ValueError):
        raise ValueError(f"bad sample value in metrics line: {line[:120]!r}") from None


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
