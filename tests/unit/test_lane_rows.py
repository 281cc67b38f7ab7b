"""LaneRows.from_rows: the read statement sorts nothing; the rows it builds are in (lane, id)
order whatever order the plan visited the lanes in."""

from __future__ import annotations

from relayer.store import LaneRows


def row(lane: int, number: int, key: str = "k") -> tuple[object, ...]:
    return (lane, f"id-{lane}-{number}", key, None, "events", b"body", None, False)


def test_lanes_in_ascending_order_are_kept_as_they_came() -> None:
    rows = [row(1, 1), row(1, 2), row(4, 1), row(9, 1), row(9, 2)]
    built = LaneRows.from_rows(rows)
    assert list(built.lanes) == [1, 1, 4, 9, 9]
    assert list(built.batch.ids) == [r[1] for r in rows]


def test_lanes_out_of_order_are_put_in_order_keeping_each_lanes_own_order() -> None:
    # As a plan that visits the lease rows in their physical order returns them: each lane's
    # rows together and in id order, the lanes in any order.
    rows = [row(9, 1), row(9, 2), row(1, 1), row(1, 2), row(1, 3), row(4, 1)]
    built = LaneRows.from_rows(rows)
    assert list(built.lanes) == [1, 1, 1, 4, 9, 9]
    assert list(built.batch.ids) == [
        "id-1-1", "id-1-2", "id-1-3", "id-4-1", "id-9-1", "id-9-2",
    ]  # fmt: skip
    assert list(built.batch.destinations) == ["events"] * 6
    assert list(built.future) == [False] * 6


def test_no_rows() -> None:
    assert len(LaneRows.from_rows([])) == 0
