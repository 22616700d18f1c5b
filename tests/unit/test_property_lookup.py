"""The C look-ups of one property in a stored properties string (SPEC.md §1.6: ``name \\x01 value``
segments split on ``\\x02``): the reput scan's ``find_property`` (TAGS -> tagsCode, UNIQ_KEY and
KEYS -> the IndexFile, DELAY -> a delay level; the first segment of the name, an empty value
included) and the client's ``MessageExt`` accessors (the dict's answer: the last segment with a
non-empty value), checked against a Python reading of the same bytes on random strings, trailing
separator or not, names that prefix one another and empty values."""
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from rmq._core import commitlog as _cl
from rmq._core.dispatch import scan_dispatch
from rmq.store.message_store import MessageStore
from rmq.store.timer import java_string_hash

NAMES = ["TAGS", "TAG", "TAGSX", "KEYS", "KEY", "UNIQ_KEY", "UNIQ_KEYS", "DELAY", "row", "x"]
VALUES = st.text(alphabet="ab 1\u00e9", max_size=6)


def first(segments, name):
    """find_property's answer: the value of the first segment named ``name``, or None."""
    for seg in segments:
        n, sep, v = seg.partition("\x01")
        if sep and n == name:
            return v
    return None


def last_non_empty(segments, name):
    out = None
    for seg in segments:
        n, sep, v = seg.partition("\x01")
        if sep and n == name and v:
            out = v
    return out


segment_lists = st.lists(st.tuples(st.sampled_from(NAMES), VALUES), max_size=8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(segment_lists, st.booleans()), min_size=1, max_size=8), st.booleans())
def test_the_scan_and_the_message_accessors_read_properties_as_python_does(records, prop_crc):
    """With the CRC property (rmq's default) every stored string ends in a separator; without it
    a record keeps its producer's ending."""
    raws, segs = [], []
    for pairs, trailing in records:
        seg = [f"{n}\x01{v}" for n, v in pairs]
        raw = "\x02".join(seg) + ("\x02" if trailing and seg else "")
        raws.append(raw.encode())
        segs.append(seg)
    with tempfile.TemporaryDirectory() as d:
        store = MessageStore(d, enabled_append_prop_crc=prop_crc)
        try:
            batch = _cl.encode_batch([(b"body", raw, 0) for raw in raws])
            res = store.put_encoded("PropScan", 0, batch, None, 0, 1_700_000_000_000, None, 0, len(raws))
            assert res.ok, res.remark
            mf = store.commitlog.mapped_file_queue.files[0]
            db = scan_dispatch(mf, 0, mf.wrote_position, 1024)
            assert db.count == len(raws)
            base = mf.file_from_offset
            data = bytes(mf.read(0, mf.wrote_position))
            for i, seg in enumerate(segs):
                tags = first(seg, "TAGS")
                assert db.tags_codes[i] == (java_string_hash(tags) if tags else 0), (seg, tags)
                for name, pos, length in (("KEYS", db.keys_pos, db.keys_len), ("UNIQ_KEY", db.uniq_pos, db.uniq_len)):
                    want = first(seg, name)
                    if want is None:
                        assert length[i] == 0, (seg, name)
                    else:
                        assert length[i] == len(want.encode()), (seg, name, want)
                        if length[i]:
                            at = db.physical_offsets[i] - base + pos[i]
                            assert data[at:at + length[i]] == want.encode()
                delay = first(seg, "DELAY")
                level = int(delay) if delay and delay.isdigit() and 0 < len(delay) < 4 else 0
                assert db.delay_levels[i] == level, (seg, delay)
            msgs = _cl.decode_records(data)
            assert len(msgs) == len(segs)
            for m, seg in zip(msgs, segs):
                assert m.tags == last_non_empty(seg, "TAGS"), seg          # read from the raw string
                keys = last_non_empty(seg, "KEYS")
                assert m.keys == ([k for k in keys.split(" ") if k] if keys else []), seg
        finally:
            store.shutdown()
