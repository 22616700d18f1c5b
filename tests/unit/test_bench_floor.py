"""rmq.bench.floor: the Python floor of send_async's and PushConsumer's per-message calls (no
I/O), and how ``rmq bench client`` holds its rows to it."""
import pytest

from rmq._core import commitlog as cl
from rmq.bench.client import AIO_PUSH, POLL, PUSH, SEND_ASYNC, SEND_BATCH, _row, judge
from rmq.bench.floor import RECORDS_PER_PAGE, push_floor, record_pages, send_async_floor


def test_record_pages_are_real_records_cut_into_pull_pages():
    pages = record_pages(RECORDS_PER_PAGE + 5, 100, topic="T")
    assert len(pages) == 2
    msgs = [m for p in pages for m in cl.decode_records(p, check_crc=True)]
    assert len(msgs) == RECORDS_PER_PAGE + 5 and [m.queue_offset for m in msgs] == list(range(RECORDS_PER_PAGE + 5))
    assert {m.topic for m in msgs} == {"T"} and all(m.body == b"x" * 100 and m.tags == "t" for m in msgs)
    assert len({m.properties["UNIQ_KEY"] for m in msgs}) == len(msgs)


@pytest.mark.parametrize("floor", [send_async_floor, push_floor])
def test_a_floor_counts_every_message_through_the_rows_own_callback(floor):
    r = floor(100, 3000, rounds=2)
    assert r["msgs"] == 3000 and r["msgs_per_s"] > 0 and r["seconds"] == pytest.approx(3000 / r["msgs_per_s"])


def test_only_the_rows_with_one_call_per_message_are_held_to_the_floor():
    refs = {100: {"floor": {"produce": {"msgs_per_s": 1000.0}, "consume": {"msgs_per_s": 4000.0}}}}
    rows = []
    for path in (SEND_ASYNC, SEND_BATCH, PUSH, AIO_PUSH, POLL):
        r = _row(path, 100, 10)
        r["msgs_per_s"] = 500.0
        rows.append(r)
        judge(r, rows, refs)
    x = {r["path"]: r.get("x_floor") for r in rows}
    assert x == {SEND_ASYNC: 0.5, SEND_BATCH: None, PUSH: 0.125, AIO_PUSH: 0.125, POLL: None}
