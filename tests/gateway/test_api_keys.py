"""Client API keys: parsing, constant-time identification, token-bucket rate limits; keys never in errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.gateway.api_keys import KeyRing, KeySpec, TokenBucket, load_key_ring, parse_key_lines
from fleetctl.gateway.errors import TooManyRequests, Unauthorized


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_key_lines_parse_with_comments_and_optional_rps() -> None:
    lines = ["# team keys", "", "alpha:sk-a:5", "beta:sk-b", "gamma:sk-c:  # unlimited"]
    assert parse_key_lines(lines, "keys.txt") == [KeySpec("alpha", "sk-a", 5.0), KeySpec("beta", "sk-b", 0.0),
                                                  KeySpec("gamma", "sk-c", 0.0)]


def test_a_key_line_ending_in_probe_makes_a_probe_key_and_only_it_may_probe() -> None:
    keys = parse_key_lines(["canary:sk-p:0:probe", "team:sk-t:3"], "keys.txt")
    assert keys == [KeySpec("canary", "sk-p", 0.0, True), KeySpec("team", "sk-t", 3.0, False)]
    ring = KeyRing(keys)
    canary, team = ring.identify("Bearer sk-p"), ring.identify("Bearer sk-t")
    assert ring.may_probe(canary) and not ring.may_probe(team) and not ring.may_probe(None)
    assert KeyRing([]).may_probe(None)  # an open gateway cannot tell callers apart


@pytest.mark.parametrize("line", ["alpha", ":sk-a:1", "alpha::1", "alpha:sk-secret:fast", "alpha:sk-secret:-1",
                                  "alpha:sk-secret:0:admin", "alpha:sk-secret:0:probe:x"])
def test_bad_key_lines_name_the_line_not_the_key(line: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        parse_key_lines(["# header", line], "keys.txt")
    assert "keys.txt line 2" in str(excinfo.value) and "sk-secret" not in str(excinfo.value)


def test_no_keys_means_open() -> None:
    ring = KeyRing([])
    assert ring.open and ring.check(None) is None


def test_keys_identify_callers() -> None:
    ring = KeyRing([("alpha", "sk-a", 0), ("beta", "sk-b", 0)])
    assert ring.check("Bearer sk-b") == "beta"
    assert ring.check("bearer  sk-a ") == "alpha"
    for header in (None, "", "Bearer ", "Basic sk-a", "Bearer sk-c"):
        with pytest.raises(Unauthorized) as excinfo:
            ring.check(header)
        assert excinfo.value.status_code == 401 and "sk-" not in excinfo.value.message


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        KeyRing([("alpha", "sk-a", 0), ("alpha", "sk-b", 0)])


def test_rate_limit_is_a_token_bucket_with_retry_after() -> None:
    clock = Clock()
    ring = KeyRing([("slow", "sk-s", 2.0), ("free", "sk-f", 0)], clock=clock)
    assert [ring.check("Bearer sk-s") for _ in range(2)] == ["slow", "slow"]  # a burst of one second's worth
    with pytest.raises(TooManyRequests) as excinfo:
        ring.check("Bearer sk-s")
    assert excinfo.value.retry_after_s == 1 and "slow" in excinfo.value.message
    clock.now = 0.5  # one token back
    assert ring.check("Bearer sk-s") == "slow"
    assert all(ring.check("Bearer sk-f") == "free" for _ in range(100))


def test_bucket_wait_is_the_time_to_the_next_token() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=0.5, capacity=1.0, clock=clock)
    assert bucket.take() == 0.0
    assert bucket.take() == pytest.approx(2.0)
    clock.now = 1.0
    assert bucket.take() == pytest.approx(1.0)


def test_keys_load_from_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("alpha:sk-a:1\n")
    ring = load_key_ring(path, "beta:sk-b,gamma:sk-c:3")
    assert len(ring) == 3 and ring.check("Bearer sk-c") == "gamma"
