"""Columnar decoder (rmq._core.columnar) and the Spark fast path (rmq.spark.arrow.pages_to_batch):
the same RecordBatch as ``messages_to_batch(decode_records(...))``, field for field."""
import struct
import zlib
from array import array

import pyarrow  # the Spark fast path below needs it: fail here, clearly, without it
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq._core import commitlog as cl
from rmq._core.columnar import decode_columns, scan_page
from rmq._core.mapped_file import MappedFile
from rmq.client.consumer_api import post_process_messages
from rmq.client.message import MessageQueue
from rmq.errors import CorruptRecordError
from rmq.spark.arrow import RawPage, arrow_schema, messages_to_batch, pages_to_batch
from tests.unit.test_commitlog import golden_record

BORN_HOST = bytes([192, 168, 0, 1]) + struct.pack(">i", 54321)
STORE_HOST = bytes([10, 0, 0, 7]) + struct.pack(">i", 10911)
V6_HOST = bytes(range(16)) + struct.pack(">i", 9)
MQ = MessageQueue("TopicTest", "broker-a", 3)
COMPRESSED_ZLIB = 0x1 | 0x300


class Log:
    """Records appended to one MappedFile; ``pages()`` cuts them into pull pages."""

    def __init__(self, path, size=64 << 20):
        self.mf = MappedFile(str(path / "00000000000000000000"), size)
        self.bounds = []          # (start, end) of each appended batch
        self.qo = 0

    def put(self, messages, topic=b"TopicTest", sys_flag=0, prop_crc=True, born_host=BORN_HOST,
            store_host=STORE_HOST, reconsume=0, born_ts=1700000000000, store_ts=1700000000123):
        """messages: [(body, props dict or raw bytes, flag)]"""
        enc = [(b, p if isinstance(p, bytes) else cl.encode_properties(p), f) for b, p, f in messages]
        out = array("q", [0] * len(enc))
        start = self.mf.wrote_position
        st_, count, wrote, inc = cl.append_batch(self.mf, cl.encode_batch(enc), topic, MQ.queue_id, self.qo,
                                                 sys_flag, born_ts, born_host, store_host, store_ts, b"",
                                                 prop_crc, reconsume, 0, 8 << 20, out)
        assert st_ == cl.PUT_OK and count == len(enc)
        self.qo += inc
        self.bounds.append((start, start + wrote))
        return self

    def data(self):
        return self.mf.read(0, self.mf.wrote_position)

    def pages(self, per_page=None):
        """One page per put (default), or pages of ``per_page`` records."""
        if per_page is None:
            return [self.mf.read(a, b - a) for a, b in self.bounds]
        data = self.data()
        pages, pos, k, start = [], 0, 0, 0
        while pos < len(data):
            _, size = cl.check_message(data, pos, False)
            pos += size
            k += 1
            if k == per_page:
                pages.append(data[start:pos])
                start, k = pos, 0
        if start < pos:
            pages.append(data[start:pos])
        return pages

    def close(self):
        self.mf.close()


@pytest.fixture
def log(tmp_path):
    lg = Log(tmp_path)
    yield lg
    lg.close()


def reference(pages, schema, tags=None):
    msgs = [m for p in pages for m in post_process_messages(cl.decode_records(p))]
    if tags is not None:
        msgs = [m for m in msgs if m.properties.get("TAGS") in tags]
    return messages_to_batch([msgs], MQ, schema)


def assert_same(pages, include_properties=(True, False), tags=None):
    """Compare both ways; returns the fast batch with ``properties``."""
    first = None
    for ip in include_properties:
        schema = arrow_schema(ip)
        fast = pages_to_batch(pages, MQ, schema, ip, tags=tags)
        slow = reference(pages, schema, tags)
        assert fast.schema == slow.schema == schema
        assert fast.num_rows == slow.num_rows
        for name in schema.names:
            a, b = fast.column(name), slow.column(name)
            assert a.type == b.type, name
            assert a.to_pylist() == b.to_pylist(), name
            assert a.equals(b), name
        assert fast.equals(slow)
        fast.validate(full=True)
        if first is None:
            first = fast
    return first


def test_no_properties(log):
    log.put([(b"a", b"", 0), (b"bb", b"", 7)], prop_crc=False)
    b = assert_same(log.pages())
    assert b.column("tags").null_count == 2 and b.column("properties").to_pylist() == [[], []]
    assert b.column("msg_id").to_pylist()[0] == cl.create_message_id(STORE_HOST, 0)


def test_tags_keys_uniq_key_present_and_absent(log):
    log.put([(b"1", {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABCDEF"}, 0),
             (b"2", {"TAGS": "TagB"}, 0),
             (b"3", {"KEYS": "only-keys"}, 0),
             (b"4", {"UNIQ_KEY": "U"}, 0),
             (b"5", {"X": "y"}, 0)])
    b = assert_same(log.pages())
    assert b.column("tags").to_pylist() == ["TagA", "TagB", None, None, None]
    assert b.column("keys").to_pylist() == ["k1 k2", None, "only-keys", None, None]
    assert b.column("msg_id").to_pylist()[0] == "ABCDEF"
    assert b.column("msg_id").to_pylist()[3] == "U"
    assert "__CRC32#" not in dict(b.column("properties").to_pylist()[0])


def test_odd_properties_strings(log):
    # empty values and names are skipped, a repeated name keeps its first place and its last value,
    # no trailing separator, separators in a row
    for raw in [b"TAGS\x01\x02KEYS\x01k\x02", b"\x01v\x02A\x011\x02B\x012\x02A\x013", b"\x02\x02A\x01\x01x\x02",
                b"TAGS\x01a\x02TAGS\x01b\x02", b"UNIQ_KEY\x01\x02", b"noseparator", b"A\x01b\x01c"]:
        log.put([(b"x", raw, 0)], prop_crc=False)
        log.put([(b"x", raw, 0)], prop_crc=True)
    assert_same(log.pages())


def test_unicode(log):
    log.put([("héllo ☃ 🎉".encode(), {"TAGS": "标签", "KEYS": "ключ 🔑", "UNIQ_KEY": "ü", "名": "値"}, 0)],
            topic="тема".encode())
    b = assert_same(log.pages())
    assert b.column("tags").to_pylist() == ["标签"]


def test_invalid_utf8_properties_take_the_slow_path(log):
    log.put([(b"x", b"TAGS\x01\xff\xfe\x02KEYS\x01\xed\xa0\x80\x02", 0), (b"y", {"TAGS": "ok"}, 0)])
    assert decode_columns(log.pages())["bad_utf8"] == 1
    b = assert_same(log.pages())
    assert b.column("tags").to_pylist()[0] == "\ufffd\ufffd"


def test_empty_body_and_4_mib_body(log):
    big = bytes(range(256)) * (4 * 1024 * 1024 // 256)
    log.put([(b"", {"TAGS": "e"}, 0)])
    log.put([(big, {"TAGS": "big"}, 0)])
    log.put([(b"", b"", 0)], prop_crc=False)
    b = assert_same(log.pages())
    assert b.column("body").to_pylist() == [b"", big, b""]


def test_v2_topic_and_ipv6_hosts(log):
    topic = ("%RETRY%" + "g" * 150).encode()
    log.put([(b"x", {"TAGS": "t"}, 0), (b"y", b"", 0)], topic=topic)
    log.put([(b"z", {"KEYS": "k"}, 0)], born_host=V6_HOST, store_host=V6_HOST, reconsume=3)
    d = decode_columns(log.pages())
    assert bytes(d["topic_data"][:len(topic)]) == topic
    b = assert_same(log.pages())
    assert len(b.column("msg_id").to_pylist()[2]) == 56
    assert b.column("reconsume_times").to_pylist() == [0, 0, 3]


def test_compressed_bodies_are_inflated(log):
    bodies = [b"a" * 5000, b"hello " * 1000]
    log.put([(b"plain", {"TAGS": "p"}, 0)])
    for body in bodies:
        log.put([(zlib.compress(body, 5), {"TAGS": "z"}, 0)], sys_flag=COMPRESSED_ZLIB)
    log.put([(b"not zlib", {"TAGS": "bad"}, 0)], sys_flag=COMPRESSED_ZLIB)    # kept as stored
    log.put([(b"tail", b"", 0)])
    d = decode_columns(log.pages())
    assert list(d["compressed"]) == [1, 2, 3]
    b = assert_same(log.pages())
    assert b.column("body").to_pylist() == [b"plain"] + bodies + [b"not zlib", b"tail"]


def test_many_pages_and_raw_pages(log):
    for i in range(50):
        log.put([(b"m%d" % j, {"TAGS": "t%d" % (j % 3), "UNIQ_KEY": "%032X" % (i * 100 + j)}, 0)
                 for j in range(i % 7 + 1)])
    pages = log.pages()
    assert_same(pages)
    assert_same(log.pages(per_page=13))
    raw = [RawPage.scan(p) for p in pages]
    assert sum(len(p) for p in raw) == pages_to_batch(raw, MQ, arrow_schema()).num_rows
    assert pages_to_batch(raw, MQ, arrow_schema()).equals(pages_to_batch(pages, MQ, arrow_schema()))


def test_tag_filter(log):
    log.put([(b"%d" % j, {"TAGS": "t%d" % (j % 3)} if j % 4 else {}, 0) for j in range(30)])
    b = assert_same(log.pages(), tags={"t0", "t2"})
    assert set(b.column("tags").to_pylist()) == {"t0", "t2"}
    assert pages_to_batch(log.pages(), MQ, arrow_schema(), tags={"nope"}).num_rows == 0


def test_scan_page_cuts_at_the_end_offset(log):
    log.put([(b"x" * j, b"", 0) for j in range(10)])
    data = log.data()
    nbytes, count, first, last, body = scan_page(data, 4)
    assert (count, first, last, body) == (4, 0, 3, 0 + 1 + 2 + 3)
    assert nbytes == log.pages(per_page=4)[0].__len__()
    assert scan_page(data)[:4] == (len(data), 10, 0, 9)
    page = RawPage.scan(data, 4)
    assert len(page) == 4 and bytes(page.data) == data[:nbytes]
    assert scan_page(b"") == (0, 0, -1, -1, 0)


def test_crc_check_and_corrupt_records(log):
    log.put([(b"payload", {"TAGS": "a"}, 0), (b"second", b"", 0)])
    data = bytearray(log.data())
    i = data.index(b"payload")
    data[i] ^= 1                                     # a body bit flips: only a CRC check sees it
    assert decode_columns([bytes(data)])["n"] == 2
    with pytest.raises(CorruptRecordError, match="BAD_CRC"):
        decode_columns([bytes(data)], check_crc=True)
    with pytest.raises(CorruptRecordError, match="page 1"):
        decode_columns([log.data(), log.data()[:-3]])
    with pytest.raises(CorruptRecordError):
        scan_page(log.data()[:-3])
    assert decode_columns([log.data()], check_crc=True)["n"] == 2


def test_empty_pages():
    d = decode_columns([b"", b""], include_properties=True)
    assert d["n"] == 0 and list(d["body_offsets"]) == [0] and list(d["prop_offsets"]) == [0]


_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.tuples(
    st.binary(max_size=200),
    st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "DELAY", "ü"]) | _text, _text, max_size=5),
    st.integers(-2**31, 2**31 - 1)), min_size=1, max_size=8), min_size=1, max_size=6),
    st.booleans(), st.integers(0, 5), st.integers(-2**40, 2**41))
def test_random_messages_match_the_slow_path(tmp_path_factory, batches, prop_crc, reconsume, ts):
    lg = Log(tmp_path_factory.mktemp("col"), 4 << 20)
    try:
        for k, msgs in enumerate(batches):
            lg.put(msgs, prop_crc=prop_crc, reconsume=reconsume, born_ts=ts + k, store_ts=ts * 2 - k,
                   store_host=V6_HOST if k % 3 == 2 else STORE_HOST)
        assert_same(lg.pages())
        assert_same(lg.pages(per_page=5), tags={"", "a", "ü"})
    finally:
        lg.close()


@pytest.mark.parametrize("bad", [False, True], ids=["fast", "invalid-utf8-slow-path"])
def test_pages_of_several_queues_in_one_batch(log, bad):
    """``mqs=`` (PullConsumer.poll_arrow): pages of one broker group, one decode; topic and queue
    id from the records, equal to one batch per page put together (either path)."""
    log.put([(b"a", {"TAGS": "t"}, 0), (b"b", {}, 0)])
    log.put([(b"c", b"TAGS\x01\xff\x02" if bad else {"KEYS": "k"}, 0)], topic=b"Other")
    pages = log.pages()
    mqs = [MQ, MessageQueue("Other", "broker-a", MQ.queue_id)]
    schema = arrow_schema(True)
    got = pages_to_batch(pages, None, schema, True, mqs=mqs)
    parts = [pages_to_batch([p], q, schema, True) for p, q in zip(pages, mqs)]
    want = pyarrow.Table.from_batches(parts, schema=schema).combine_chunks().to_batches()[0]
    assert got.equals(want), (got.to_pylist(), want.to_pylist())
    assert got.column("topic").to_pylist() == ["TopicTest", "TopicTest", "Other"]


def test_the_fast_path_does_not_make_pyarrow_import_pandas(tmp_path):
    """pa.scalar / pa.array of Python objects make pyarrow import pandas, about 0.25 s on a
    process's first batch (PullConsumer.poll_arrow's first call); the fast path builds every
    column from buffers, so a fresh process decodes without it."""
    import subprocess
    import sys
    code = f"""
import pathlib, sys
from tests.unit.test_columnar import Log, MQ
from rmq.arrow import arrow_schema, pages_to_batch
assert "pandas" not in sys.modules
lg = Log(pathlib.Path({str(tmp_path)!r}))
lg.put([(b"x", {{"TAGS": "a", "KEYS": "k"}}, 0)] * 3)
one = pages_to_batch(lg.pages(), MQ, arrow_schema(True), True)
many = pages_to_batch(lg.pages(), None, arrow_schema(True), True, mqs=[MQ])
assert one.num_rows == many.num_rows == 3 and one.column("topic").to_pylist() == ["TopicTest"] * 3
assert one.column("queue_id").to_pylist() == [3] * 3 and one.column("broker_name").to_pylist() == ["broker-a"] * 3
print("pandas" in sys.modules)
"""
    root = __file__.rsplit("/tests/", 1)[0]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


_UTF8_PIECES = st.sampled_from([b"a", b"abcdefgh", b"0123456789ABCDEF", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80",
                                b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xff",
                                b"\x80", b"\xe0\x80\xaf", b"k\x01v\x02"])


@settings(max_examples=500, deadline=None)
@given(props=st.lists(_UTF8_PIECES, max_size=24).map(b"".join))
def test_utf8_check_agrees_with_pythons_decoder(props):
    """decode_columns' UTF-8 check (ASCII runs skipped 8 bytes at a time) says what
    ``bytes.decode("utf-8")`` says, for properties of any length and alignment."""
    assert_utf8_check_agrees(props)


def assert_utf8_check_agrees(props: bytes) -> None:
    """decode_columns flags a record with ``props`` as bad UTF-8 exactly when Python's decoder refuses them."""
    rec = golden_record(b"b", b"T", props, 0, 0, 0, 0, 1, 2, prop_crc=False)
    try:
        props.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    assert decode_columns([rec])["bad_utf8"] == (0 if valid else 1), props


@pytest.mark.parametrize("piece", [b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xc3", b"\xed\xa0\x80",
                                   b"\xc0\xaf", b"\xff", b"\x80", b"\xe0\x80\xaf"])
def test_utf8_check_finds_a_non_ascii_byte_at_every_place_of_an_8_byte_word(piece):
    """The ASCII skip reads 8 bytes at a time: a multi-byte sequence (valid or not) at each of the
    16 places of two words after a run of ASCII is seen, as ``bytes.decode`` sees it."""
    for at in range(17):
        assert_utf8_check_agrees(b"a" * at + piece + b"b" * (17 - at))
