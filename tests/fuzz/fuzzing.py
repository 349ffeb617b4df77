"""Schema-driven fuzzing of an HTTP API: schemathesis generates requests from the service's own OpenAPI schema
(valid ones, and invalid ones in its negative mode), httpx sends them to the real service on loopback, and
every answer is kept by operation and status.

Bounded in count and in time: each operation gets at most `examples` cases per mode and an equal share of
`budget_s` (what ran is reported). `FLEET_FUZZ_REPORT=path` appends a JSON line
per run with the counts, for the benchmark notes.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode


@dataclass
class FuzzReport:
    api: str
    budget_s: float
    seconds: float = 0.0
    statuses: dict[str, Counter[int]] = field(default_factory=dict)  # "METHOD /path" -> status -> count
    undeclared: list[str] = field(default_factory=list)  # answers whose status the schema does not declare
    server_errors: list[str] = field(default_factory=list)  # 5xx answers, with the request that caused them

    @property
    def cases(self) -> int:
        return sum(sum(c.values()) for c in self.statuses.values())

    def totals(self) -> Counter[int]:
        return sum(self.statuses.values(), Counter())

    def summary(self) -> str:
        totals = ", ".join(f"{status}: {n}" for status, n in sorted(self.totals().items()))
        return (f"{self.api}: {self.cases} cases over {len(self.statuses)} operations in {self.seconds:.1f} s "
                f"(budget {self.budget_s:.0f} s); statuses {totals}")

    def save(self) -> None:
        path = os.environ.get("FLEET_FUZZ_REPORT")
        if path:
            with open(path, "a") as out:
                out.write(json.dumps({"api": self.api, "cases": self.cases, "seconds": round(self.seconds, 1),
                                      "budget_s": self.budget_s, "operations": len(self.statuses),
                                      "statuses": dict(sorted(self.totals().items()))}) + "\n")


def fuzz(api: str, base_url: str, schema: dict[str, Any], headers: dict[str, str], budget_s: float, examples: int,
         skip: Callable[[str, str], bool] = lambda _method, _path: False,
         prepare: Callable[[Any], None] = lambda _case: None) -> FuzzReport:
    """Fuzz every operation of `schema` against the service at `base_url`. Each operation and mode gets an
    equal share of the budget, so a slow operation cannot starve the others. `prepare` may adjust a
    generated case before it is sent (e.g. keep generation requests short)."""
    report = FuzzReport(api, budget_s)
    started = time.monotonic()
    operations = [result.ok() for result in schemathesis.openapi.from_dict(schema).get_all_operations()]
    operations = [op for op in operations if not skip(op.method.upper(), op.path)]
    share_s = budget_s / (2 * max(len(operations), 1))
    with httpx.Client(timeout=30) as client:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for operation in operations:
                deadline = time.monotonic() + share_s
                _fuzz_operation(client, base_url, headers, operation, mode, examples, deadline, report, prepare)
    report.seconds = time.monotonic() - started
    report.save()
    return report


def _fuzz_operation(client: httpx.Client, base_url: str, headers: dict[str, str], operation: Any,
                    mode: GenerationMode, examples: int, deadline: float, report: FuzzReport,
                    prepare: Callable[[Any], None]) -> None:
    key = f"{operation.method.upper()} {operation.path}"
    declared = set(operation.definition.raw.get("responses", {}))
    seen = report.statuses.setdefault(key, Counter())

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        if time.monotonic() > deadline:
            return
        prepare(case)
        try:
            kwargs = case.as_transport_kwargs(base_url=base_url, headers=headers)
            response = client.request(kwargs["method"], kwargs["url"], headers=kwargs.get("headers"),
                                      params=kwargs.get("params"), **_content(kwargs))
        except (UnicodeEncodeError, ValueError, httpx.InvalidURL, httpx.LocalProtocolError):
            return  # not sendable as HTTP (a header no client could send): nothing to learn
        seen[response.status_code] += 1
        if str(response.status_code) not in declared and "default" not in declared:
            report.undeclared.append(f"{key} -> {response.status_code} {response.text[:150]!r} "
                                     f"{kwargs.get('headers', {}).get('Content-Type')} {_content(kwargs).get('content', b'')[:100]!r}")
        if response.status_code >= 500:
            report.server_errors.append(f"{key} -> {response.status_code} {response.text[:200]!r} for "
                                        f"{str(kwargs.get('json', kwargs.get('content', '')))[:200]!r}")

    try:
        run()
    except Unsatisfiable:
        pass  # negative mode on an operation without parameters: there is no invalid request to make


def _content(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The body as bytes: JSON with NaN and lone surrogates allowed as a careless client would write them."""
    if "json" in kwargs:
        return {"content": json.dumps(kwargs["json"]).encode()}
    if "data" in kwargs or "content" in kwargs:
        body = kwargs.get("content", kwargs.get("data"))
        return {"content": body if isinstance(body, bytes) else str(body).encode("utf-8", "surrogatepass")}
    return {}
