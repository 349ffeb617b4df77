"""Fitting an engine profile from a sweep's points."""

from __future__ import annotations

import pytest

from fleetctl.pd.profile import DecodePoint, PrefillPoint, fit, p90


def test_the_best_throughput_within_the_ttft_slo_and_the_most_slots_within_the_itl_slo() -> None:
    prefill = [PrefillPoint(1, 800, 0.3), PrefillPoint(2, 1400, 0.6), PrefillPoint(4, 1600, 2.5)]
    decode = [DecodePoint(1, 0.02, 50), DecodePoint(4, 0.04, 100), DecodePoint(8, 0.09, 89), DecodePoint(16, 0.2, 80)]
    fitted = fit(prefill, decode, ttft_slo_s=1.0, itl_slo_s=0.1)
    assert (fitted.prefill_tokens_per_s, fitted.decode_slots, fitted.decode_itl_s) == (1400, 8.0, 0.09)
    assert fitted.notes[0].startswith("prefill: 1400 tok/s at concurrency 2")


def test_nothing_within_the_slo_is_said_and_falls_back() -> None:
    fitted = fit([PrefillPoint(2, 500, 4.0), PrefillPoint(1, 300, 3.0)], [DecodePoint(1, 0.4, 2.5)], 1.0, 0.1)
    assert fitted.prefill_tokens_per_s == 300 and fitted.decode_slots == 0.25
    assert fitted.decode_itl_s == 0.1  # a fraction of a slot is sized at the SLO
    assert "no point within the TTFT SLO" in fitted.notes[0] and "exceed the ITL SLO" in fitted.notes[1]


def test_p90_and_empty_sweeps() -> None:
    assert p90([float(i) for i in range(1, 11)]) == 9.0
    assert p90([5.0]) == 5.0
    with pytest.raises(ValueError):
        fit([], [DecodePoint(1, 0.1, 1)], 1, 1)
