"""An engine as the gateway sees it: scraped load corrected by its own requests, health, traffic shares."""

from __future__ import annotations

import pytest

from fleetctl.gateway.engine_metrics import EngineSample
from fleetctl.gateway.engine_state import ERRORS_TO_DOWN, EngineLive, InFlight
from fleetctl.gateway.traffic import SessionMap, ShareTracker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_own_requests_count_at_once_between_scrapes() -> None:
    live = EngineLive("e", "http://e")
    live.take_sample(EngineSample(num_running=2, num_waiting=1))
    assert (live.num_waiting, live.num_running) == (1, 2)
    a = live.start(InFlight(prompt_tokens=100, max_tokens=10))
    b = live.start(InFlight(prompt_tokens=50, max_tokens=10))
    assert (live.num_waiting, live.own_queued_prefill_tokens) == (3, 150)
    a.first_token_at = 1.0
    assert (live.num_waiting, live.num_running) == (2, 3)
    live.take_sample(EngineSample(num_running=3, num_waiting=2))  # the engine now reports them too
    assert (live.num_waiting, live.num_running, live.others_waiting, live.others_running) == (2, 3, 1, 2)
    live.finish(a)
    live.finish(b)
    assert (live.num_waiting, live.num_running) == (1, 2)


def test_counts_never_go_below_the_gateways_own() -> None:
    live = EngineLive("e", "http://e")
    live.take_sample(EngineSample())
    live.start(InFlight(prompt_tokens=10, max_tokens=5))
    live.take_sample(EngineSample(num_waiting=0))  # scraped before the engine saw it
    assert live.num_waiting == 1 and live.others_waiting == 0


def test_hard_failures_take_an_engine_out_at_once_soft_ones_after_a_few() -> None:
    live = EngineLive("e", "http://e")
    for _ in range(ERRORS_TO_DOWN - 1):
        live.record_failure("error_5xx", hard=False)
    assert live.healthy
    live.record_failure("error_5xx", hard=False)
    assert not live.healthy and live.down_reason == "error_5xx"
    live.probe_ok()
    assert live.healthy and live.consecutive_errors == 0
    live.record_failure("connect", hard=True)
    assert not live.healthy


def test_shares_decay_per_routed_request_and_are_relative_to_the_candidates() -> None:
    shares = ShareTracker(half_life_requests_per_engine=4.0)
    assert shares.shares(["a", "b"]) == {"a": 0.5, "b": 0.5}
    for _ in range(3):
        shares.record("a")
    shares.record("b")
    a = 1 * 2 ** (-3 / 4) + 2 ** (-2 / 4) + 2 ** (-1 / 4)  # a's three, aged by the requests routed since
    assert shares.shares(["a", "b"]) == pytest.approx({"a": a / (a + 1), "b": 1 / (a + 1)})
    for _ in range(4):
        shares.record("c")  # another engine's traffic ages a's and b's alike: their shares of the two hold
    assert shares.shares(["a", "b"]) == pytest.approx({"a": a / (a + 1), "b": 1 / (a + 1)})
    assert shares.shares(["a", "b", "c"])["c"] > 0.6 and shares.shares(["a"]) == {"a": 1.0}


def test_two_requests_in_a_row_do_not_make_a_hot_spot_however_long_the_lull_before() -> None:
    """The hot-spot guard reads these shares: a burst of two to the engine holding their prefix, after a
    quiet spell, must not push that engine past 1.5 x the mean share of four."""
    shares = ShareTracker()
    engines = ["a", "b", "c", "d"]
    for i in range(64):
        shares.record(engines[i % 4])
    shares.record("a")
    shares.record("a")
    assert shares.shares(engines)["a"] < 1.5 * 0.25


def test_sessions_are_lru_bounded() -> None:
    sessions = SessionMap(max_entries=2)
    sessions.set("s1", "a")
    sessions.set("s2", "b")
    assert sessions.get("s1") == "a"  # s1 used: s2 is now the oldest
    sessions.set("s3", "c")
    assert sessions.get("s2") is None and sessions.as_mapping("s3") == {"s3": "c"}
    assert sessions.as_mapping(None) == {} and len(sessions) == 2


def test_queued_prefill_counts_only_what_the_cache_does_not_hold() -> None:
    """A request routed for its cached prefix queues only its uncached tail: counting the whole prompt made the
    engine holding a shared prefix look busy by exactly the work its cache saves."""
    live = EngineLive("e", "http://e")
    live.start(InFlight(prompt_tokens=400, max_tokens=8, cached_tokens=320))
    live.start(InFlight(prompt_tokens=100, max_tokens=8))
    assert live.own_queued_prefill_tokens == 80 + 100
    over = live.start(InFlight(prompt_tokens=10, max_tokens=8, cached_tokens=16))  # never negative
    assert over.prefill_tokens == 0 and live.own_queued_prefill_tokens == 180


def test_an_inflight_prompt_counts_as_held_until_it_finishes() -> None:
    live = EngineLive("e", "http://e")
    assert live.inflight_prefix([1, 2, 3]) == 0
    a = live.start(InFlight(prompt_tokens=64, max_tokens=8, block_hashes=(1, 2, 9, 9)))
    live.start(InFlight(prompt_tokens=64, max_tokens=8, block_hashes=(1, 7)))
    assert live.inflight_prefix([1, 2, 3]) == 2  # the longest shared leading run over the tickets
    assert live.inflight_prefix([5, 2, 3]) == 0  # chained hashes: a different first block shares nothing
    a.first_token_at = 1.0
    assert live.inflight_prefix([1, 2, 3]) == 2  # decoding: the engine holds the prompt's blocks
    live.finish(a)
    assert live.inflight_prefix([1, 2, 3]) == 1


def test_a_decode_engines_inflight_prompt_is_not_locality() -> None:
    """P/D: the decode engine receives the prompt's K/V from the prefill engine; it does not prefill it."""
    live = EngineLive("d", "http://d")
    live.start(InFlight(prompt_tokens=64, max_tokens=8, role="decode", block_hashes=(1, 2)))
    assert live.inflight_prefix([1, 2]) == 0


def test_an_own_request_that_finished_while_the_scrape_was_on_its_way_is_not_someone_elses() -> None:
    """The engine counted it running; by the time its answer arrived the gateway had seen it finish. Taken as
    another client's decode, it held a slot until the next scrape and admission refused the next request."""
    live = EngineLive("e", "http://e")
    short = live.start(InFlight(prompt_tokens=4, max_tokens=4))
    short.first_token_at = 1.0
    live.begin_scrape()
    live.finish(short)
    live.take_sample(EngineSample(num_running=1))
    assert (live.num_running, live.others_running, live.others_waiting) == (0, 0, 0)


def test_an_own_request_the_engine_runs_before_its_first_token_is_not_counted_twice() -> None:
    """vLLM counts a request running from its first prefill step; the gateway, from its first token."""
    live = EngineLive("e", "http://e")
    live.start(InFlight(prompt_tokens=400, max_tokens=8))
    live.begin_scrape()
    late = live.start(InFlight(prompt_tokens=4, max_tokens=8))  # sent while the scrape was on its way
    live.take_sample(EngineSample(num_running=2, num_waiting=1))  # one of them is another client's
    assert (live.others_running + live.others_waiting, live.num_running + live.num_waiting) == (1, 3)
    live.finish(late)
    assert live.num_running + live.num_waiting == 2


def test_a_failed_scrape_closes_its_window() -> None:
    live = EngineLive("e", "http://e")
    live.begin_scrape()
    live.scrape_failed()
    live.start(InFlight(prompt_tokens=4, max_tokens=8))
    live.take_sample(EngineSample(num_running=3))
    assert live.others_running == 2


def test_the_share_half_life_scales_with_the_engines_routed_to() -> None:
    """Per engine, so a large fleet judges each engine's share on as many of its own requests as a small one."""
    small, large = ShareTracker(half_life_requests_per_engine=8.0, engines=2), ShareTracker(8.0, engines=16)
    assert (small.half_life_requests, large.half_life_requests) == (16.0, 128.0)
    for tracker in (small, large):
        tracker.record("a")
        for _ in range(16):
            tracker.record("b")
    def share_of_a(half_life: float) -> float:
        a, b = 2 ** (-16 / half_life), sum(2 ** (-k / half_life) for k in range(16))
        return a / (a + b)

    assert small.shares(["a", "b"])["a"] == pytest.approx(share_of_a(16.0))
    assert large.shares(["a", "b"])["a"] == pytest.approx(share_of_a(128.0))  # a's one request has barely aged


def test_a_change_of_engine_count_re_times_only_the_decay_that_follows() -> None:
    shares = ShareTracker(half_life_requests_per_engine=4.0, engines=1)
    shares.record("a")
    for _ in range(4):
        shares.record("b")  # one half-life at 4 requests: a's count is 0.5
    shares.engines = 2  # now 8 requests per half-life
    for _ in range(8):
        shares.record("b")  # one more half-life: a's count is 0.25
    assert shares._decayed("a") == pytest.approx(0.25)
