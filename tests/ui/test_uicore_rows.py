"""The Fleet screen's rows (ui/fleet_rows.py) and how its columns fit (ui/columns.py): pure, no terminal."""

from __future__ import annotations

from uicore_data import DRIFT, change, delta, engine, node, small_fleet

from fleetctl.watch_state import FleetState
from ui.columns import fit, line
from ui.fleet_filter import parse_filter
from ui.fleet_rows import COLUMNS, DRAINING, DRIFTED, ERROR, NORMAL, PENDING, FleetRows, engine_row, natural


def rows_of(snapshot=None) -> tuple[FleetState, FleetRows]:
    fleet, rows = FleetState(), FleetRows()
    rows.update(fleet, fleet.apply(snapshot or small_fleet()))
    return fleet, rows


def test_one_row_per_engine_plus_empty_nodes_in_natural_order() -> None:
    _, rows = rows_of()
    assert rows.order == ["node-1/e-1", "node-1/e-2", "node-2/e-3", "node-2/e-4", "node-3/", "node-10/e-5",
                          "node-10/e-6"]
    assert natural("node-2") < natural("node-10")


def test_states_and_tones() -> None:
    _, rows = rows_of()
    tone = {key: row.tone for key, row in rows.rows.items()}
    assert tone == {"node-1/e-1": NORMAL, "node-1/e-2": NORMAL, "node-2/e-3": ERROR, "node-2/e-4": DRAINING,
                    "node-3/": ERROR, "node-10/e-5": PENDING, "node-10/e-6": DRIFTED}
    assert rows.rows["node-2/e-4"].state == "draining"  # marked for drain, still ready
    assert rows.rows["node-3/"].state == "down"
    assert rows.rows["node-2/e-3"].cordoned


def test_an_engine_on_a_node_that_goes_down_reads_node_down() -> None:
    fleet, rows = rows_of()
    changed = rows.update(fleet, fleet.apply(delta(change("node", "node-1", {"state": "down"}))))
    assert changed == {"node-1/e-1", "node-1/e-2"}
    assert rows.rows["node-1/e-1"].state == "node down" and rows.rows["node-1/e-1"].tone == ERROR


def test_an_adopted_engine_on_no_agents_node_reads_its_own_state() -> None:
    """An engine fleetctl adopted runs on no agent's node ('adopted' is no node row): never 'node down'."""
    adopted = {"name": "adopted-10-0-0-5-8100", "node": "adopted", "model": "m", "class_ref": "m@r1",
               "role": "mixed", "state": "ready", "adopted": True, "metrics": {}}
    assert engine_row("adopted/x", adopted, None).state == "ready"
    gone = engine_row("adopted/x", {**adopted, "state": "unreachable"}, None)
    assert (gone.state, gone.tone) == ("unreachable", ERROR)
    assert engine_row("n/x", {**adopted, "adopted": False}, None).state == "node down"  # an agent's, unheard


def test_filter_terms() -> None:
    _, rows = rows_of()
    rows.set_filter("role:decode")
    assert rows.order == ["node-1/e-2", "node-2/e-3", "node-10/e-5"]
    rows.set_filter("role:decode state:failed")
    assert rows.order == ["node-2/e-3"]
    rows.set_filter("r2")  # plain text: any field (here the class)
    assert rows.order == ["node-10/e-5"]
    rows.set_filter("node-1 !role:prefill")
    assert rows.order == ["node-1/e-2", "node-10/e-5", "node-10/e-6"]
    rows.set_filter("")
    assert len(rows.order) == 7
    assert parse_filter("Role:Decode bogus:x") == parse_filter("role:decode bogus:x")


def test_sort_by_a_metric_unknowns_last_and_reversed() -> None:
    _, rows = rows_of()
    rows.set_sort("ttft")
    assert rows.order[:4] == ["node-1/e-1", "node-2/e-4", "node-10/e-6", "node-1/e-2"]  # 0.12 (ties by name), 0.45
    assert set(rows.order[4:]) == {"node-2/e-3", "node-3/", "node-10/e-5"}  # unknown TTFT
    rows.set_sort("kv", reverse=True)
    assert rows.order[0] == "node-2/e-4"  # 90%


def test_a_delta_reorders_only_when_a_sort_value_moves() -> None:
    fleet, rows = rows_of()
    rows.set_sort("kv", reverse=True)
    before = rows.order
    rows.update(fleet, fleet.apply(delta(change("engine", "node-1/e-1", {"restarts": 1}))))
    assert rows.order is before  # nothing the sort reads changed: same order object
    rows.update(fleet, fleet.apply(delta(change("engine", "node-1/e-1", {
        "metrics": {"num_requests_running": 1, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.99}}))))
    assert rows.order[0] == "node-1/e-1"


def test_engines_come_and_go_and_empty_nodes_get_their_own_row() -> None:
    fleet, rows = rows_of()
    rows.update(fleet, fleet.apply(delta(change("engine", "node-3/e-9", engine("node-3", "e-9"), op="put"))))
    assert "node-3/e-9" in rows.order and "node-3/" not in rows.order
    rows.update(fleet, fleet.apply(delta(change("engine", "node-3/e-9", None, op="delete"))))
    assert "node-3/" in rows.order and "node-3/e-9" not in rows.order
    rows.update(fleet, fleet.apply(delta(change("node", "node-4", node("node-4", engines=0), op="put"))))
    assert "node-4/" in rows.order


def test_cells_at_80_and_200_columns() -> None:
    _, rows = rows_of()
    narrow = fit(COLUMNS, 77, rows.wanted_widths())
    # ITL does not fit at 77 cells; the narrower DRIFT (priority 3) still does
    assert [f.column.key for f in narrow] == ["node", "engine", "role", "class", "state", "drift", "queue", "kv", "ttft"]
    assert sum(f.width for f in narrow) + len(narrow) - 1 <= 77
    wide = fit(COLUMNS, 197, rows.wanted_widths())
    assert [f.column.key for f in wide] == [c.key for c in COLUMNS]
    cells, tone = rows.cells("node-10/e-6", wide)
    assert tone == DRIFTED
    text = line(wide, cells)
    assert "max_num_seqs" in text and "45%" in text and "120ms" in text and "21ms" in text
    node_cells, _ = rows.cells("node-2/e-3", narrow)
    assert node_cells[0] == "node-2 ⊘"


def test_drift_reads_the_fields() -> None:
    _, rows = rows_of()
    assert rows.rows["node-10/e-6"].drift == (DRIFT[0]["field"],)


def test_a_figures_only_change_shows_its_figures_when_the_row_is_read() -> None:
    fleet, rows = rows_of()
    wide = fit(COLUMNS, 197, rows.wanted_widths())
    applied = fleet.apply(delta(change("engine", "node-1/e-1", {
        "metrics": {"num_requests_running": 7, "num_requests_waiting": 3, "kv_cache_usage_perc": 0.5},
        "rates": {"window_s": 1.0, "ttft_s": 0.333, "itl_s": 0.044, "prefix_hit_rate": 0.75}})))
    assert applied.patched[("engine", "node-1/e-1")] == {"metrics", "rates"}
    assert rows.update(fleet, applied) == {"node-1/e-1"}
    text = line(wide, rows.cells("node-1/e-1", wide)[0])
    assert "7/3" in text and "50%" in text and "333ms" in text and "44ms" in text and "75%" in text
    assert rows.rows["node-1/e-1"].ttft == 0.333


def test_a_stale_row_sorts_by_its_current_figures_after_a_sort_change() -> None:
    fleet, rows = rows_of()  # sorted by node: a figures-only change leaves the order alone
    rows.update(fleet, fleet.apply(delta(change("engine", "node-10/e-6", {
        "metrics": {"num_requests_running": 0, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.999}}))))
    rows.set_sort("kv", reverse=True)
    assert rows.order[0] == "node-10/e-6"
    rows.update(fleet, fleet.apply(delta(change("engine", "node-10/e-6", {
        "metrics": {"num_requests_running": 0, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.0}}))))
    assert rows.order[-1] != "node-10/e-6" and rows.order.index("node-10/e-6") > 0  # moved down at once


def test_a_node_heartbeat_moves_no_row_but_its_state_does() -> None:
    fleet, rows = rows_of()
    assert rows.update(fleet, fleet.apply(delta(change("node", "node-1", {"heartbeat_age_s": 2.0})))) == set()
    changed = rows.update(fleet, fleet.apply(delta(change("node", "node-1", {"cordoned": True}))))
    assert changed == {"node-1/e-1", "node-1/e-2"} and rows.rows["node-1/e-1"].cordoned


def test_a_put_after_a_patch_in_one_delta_is_not_a_patch() -> None:
    fleet, _ = rows_of()
    applied = fleet.apply(delta(change("engine", "node-1/e-1", {"rates": {}}),
                                change("engine", "node-1/e-1", engine("node-1", "e-1", state="failed"), op="put"),
                                change("engine", "node-1/e-2", {"rates": {}}),
                                change("engine", "node-1/e-2", {"restarts": 2})))
    assert ("engine", "node-1/e-1") not in applied.patched
    assert applied.patched[("engine", "node-1/e-2")] == {"rates", "restarts"}


def test_an_engine_replaced_by_a_put_rebuilds_its_whole_row() -> None:
    fleet, rows = rows_of()
    rows.update(fleet, fleet.apply(delta(change("engine", "node-1/e-1", {"rates": {"ttft_s": 0.9}}))))
    rows.update(fleet, fleet.apply(delta(change("engine", "node-1/e-1", engine("node-1", "e-1", state="failed"),
                                                 op="put"))))
    assert rows.rows["node-1/e-1"].state == "failed" and rows.rows["node-1/e-1"].tone == ERROR
    rows.set_filter("state:failed")
    assert "node-1/e-1" in rows.order
