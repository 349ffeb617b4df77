"""PrefixPopularity: recent requests per prefix, decayed by requests, bounded."""

from __future__ import annotations

import pytest

from fleetctl.gateway.prefix_popularity import PrefixPopularity

SYSTEM = (11, 12, 13)  # chained hashes of a shared system prompt's blocks


def test_counts_are_earlier_requests_that_began_with_each_prefix():
    popularity = PrefixPopularity(half_life_requests=1e9)
    assert popularity.counts(SYSTEM + (20,)) == (0.0, 0.0, 0.0, 0.0)
    popularity.record(SYSTEM + (20,))
    popularity.record(SYSTEM + (21, 22))
    popularity.record((99,))
    counts = popularity.counts(SYSTEM + (21, 23))
    assert counts == pytest.approx((2.0, 2.0, 2.0, 1.0, 0.0))
    assert list(counts) == sorted(counts, reverse=True)  # never rise along a chain


def test_counts_halve_every_half_life_of_requests():
    popularity = PrefixPopularity(half_life_requests=4.0)
    popularity.record(SYSTEM)
    for _ in range(4):
        popularity.record((1, 2))  # other traffic
    assert popularity.counts(SYSTEM)[0] == pytest.approx(0.5)


def test_the_table_keeps_only_the_most_recent_prefixes():
    popularity = PrefixPopularity(max_entries=3)
    popularity.record((1, 2))
    popularity.record((3, 4))
    assert len(popularity) == 3
    forgotten, kept = popularity.counts((1, 2))
    assert forgotten == 0.0 and kept > 0  # the least recently seen prefix went first
    assert all(c > 0 for c in popularity.counts((3, 4)))
