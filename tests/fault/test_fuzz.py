"""T8 fuzzing, per-commit tier (RELIABILITY.md §4.2): hypothesis over the frame decoder, the
Cython CommitLog parser and recovery of small mutated stores, plus a seeded random-bytes
loop (the libFuzzer-less fallback of fuzz/*.py).  The targets live in fuzz/targets.py and
raise only on a real finding.  ``-m slow`` runs the longer variants.

Each test prints "fuzz execs / crashes / hangs: N / C / H", counted as the targets run (a crash:
any exception, a target's Finding included; a hang: a target's Finding for a run over
fuzz.targets.HANG_S), and asserts C = H = 0 and N > 0.
"""
import logging
import random

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz import _runner
from fuzz import targets as T
from rmq import protocol as P

pytestmark = pytest.mark.fault

EXAMPLES = {"frame": 400, "records": 300, "recovery": 60}
SLOW_FACTOR = 25


class Tally:
    """Executions of fuzz targets, and how many crashed or hung (counted, then re-raised)."""

    def __init__(self, name: str):
        self.name, self.execs, self.crashes, self.hangs = name, 0, 0, 0

    def run(self, fn, *args):
        try:
            fn(*args)
        except T.Finding as e:
            if "(hang)" in str(e):
                self.hangs += 1
            else:
                self.crashes += 1
            raise
        except BaseException:
            self.crashes += 1
            raise
        self.execs += 1

    def figure(self) -> str:
        return f"{self.name}: fuzz execs / crashes / hangs: {self.execs} / {self.crashes} / {self.hangs}"


def run_counted(tally: Tally, fuzz) -> None:
    """Run the hypothesis test ``fuzz``; print ``tally``'s figure whatever happens, then check it."""
    try:
        fuzz()
    finally:
        print("\n" + tally.figure())
    assert tally.crashes == 0 and tally.hangs == 0, tally.figure()
    assert tally.execs > 0, tally.figure()


def cfg(name, slow=False):
    return settings(max_examples=EXAMPLES[name] * (SLOW_FACTOR if slow else 1), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def quiet_store_logs():
    # recovery of garbage logs a warning per damaged file: keep the output to the figures
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


# -- strategies ------------------------------------------------------------------------------------
scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=40)
           | st.binary(max_size=40))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(
    st.text(max_size=8) | st.integers(-2**63, 2**63 - 1) | st.binary(max_size=4), c, max_size=4), max_leaves=16)
headers = st.fixed_dictionaries({}, optional={
    "code": st.integers(-2**40, 2**40) | values, "opaque": st.integers(-2**63, 2**63 - 1) | values,
    "flag": st.integers(0, 7) | values, "remark": st.text(max_size=100) | values,
    "fields": st.dictionaries(st.text(max_size=12), values, max_size=8) | values})
raw_msgpack = st.sampled_from([
    b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
    b"\x81" * 5000, b"\x91" * 5000, b"\xa3\xff\xfe\xfd", b"\xd4\x01\x00", b"\xc7\x00\x05", b"\xd6\xff\x00\x00\x00\x01",
    b"\x81\x01\x02", b"\x81\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x02", b"\xc1", b""]) | st.binary(max_size=200)


@st.composite
def frames(draw):
    if draw(st.booleans()):
        hdr = msgpack.packb(draw(headers | values), use_bin_type=draw(st.booleans()))
    else:
        hdr = draw(raw_msgpack)
    if draw(st.integers(0, 9)) == 0:        # mangle the packed header
        b = bytearray(hdr)
        for _ in range(draw(st.integers(1, 4))):
            if b:
                b[draw(st.integers(0, len(b) - 1))] = draw(st.integers(0, 255))
        hdr = bytes(b[:draw(st.integers(0, len(b)))])
    magic = draw(st.sampled_from([P.PROTOCOL_MAGIC, P.PROTOCOL_MAGIC, b"RMQ2", b"", b"RMQ1\x00"]))
    bodies = draw(st.lists(st.binary(max_size=20), max_size=3))
    extra = draw(st.sampled_from([0, 0, 0, P.MAX_BODY_PARTS - 1, P.MAX_BODY_PARTS, P.MAX_BODY_PARTS + 1]))
    return [magic, hdr, *bodies, *([b"x"] * extra)][:draw(st.integers(0, 80))]


@st.composite
def mutated_records(draw):
    log = T.seed_store()["commitlog/00000000000000000000"]
    start = draw(st.sampled_from([0, 0, 1, 4, 100]))
    b = bytearray(log[start:start + draw(st.integers(0, 3000))])
    for _ in range(draw(st.integers(0, 5))):
        if not b:
            break
        i = draw(st.integers(0, len(b) - 1))
        kind = draw(st.integers(0, 3))
        if kind == 0:
            b[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == 1:
            b[i] = draw(st.integers(0, 255))
        elif kind == 2:
            b[i:i + 4] = draw(st.sampled_from([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00\x00\x00\x00",
                                               b"\x80\x00\x00\x00", b"\x00\x00\x00\x14"]))
        else:
            del b[i:]
    return bytes(b)


store_mutations = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 255), st.integers(0, 2**32 - 1),
                                     st.integers(0, 2**16 - 1)), min_size=1, max_size=6).map(
    lambda ms: b"".join(bytes([k, f]) + o.to_bytes(4, "big") + v.to_bytes(2, "big") for k, f, o, v in ms))


# -- targets -----------------------------------------------------------------------------------------
def fuzz_frames(slow=False):
    tally = Tally("hypothesis frame" + (" (long)" if slow else ""))

    @cfg("frame", slow)
    @given(frames() | st.binary(max_size=2000 if slow else 300).map(T.frame_parts))
    def fuzz(parts):
        tally.run(T.check_frame, parts)

    run_counted(tally, fuzz)


def fuzz_records(slow=False):
    tally = Tally("hypothesis records" + (" (long)" if slow else ""))

    @cfg("records", slow)
    @given(mutated_records() | st.binary(max_size=4000 if slow else 600))
    def fuzz(data):
        tally.run(T.fuzz_records, data)

    run_counted(tally, fuzz)


def fuzz_recovery(tmp, slow=False):
    tally = Tally("hypothesis recovery" + (" (long)" if slow else ""))

    @cfg("recovery", slow)
    @given(data=store_mutations)
    def fuzz(data):
        tally.run(T.fuzz_recovery, data, tmp)

    run_counted(tally, fuzz)


def test_fuzz_frame_decode():
    fuzz_frames()


def test_fuzz_commitlog_parser():
    fuzz_records()


def test_fuzz_store_recovery(tmp_path):
    fuzz_recovery(str(tmp_path))


def test_seeded_random_loop():
    """The libFuzzer-less fallback: seeded random bytes and seed mutations through every target."""
    rng = random.Random(20260101)
    frame_seeds = [b"\x01" + msgpack.packb({"code": 10, "fields": {"topic": "T"}}) + T.PART_SEPARATOR + b"b"]
    log = T.seed_store()["commitlog/00000000000000000000"]
    tally = Tally("seeded random loop")

    def loop():
        for _ in range(3000):
            tally.run(T.fuzz_frame, _runner.mutate(rng, frame_seeds, 400))
        for _ in range(600):
            tally.run(T.fuzz_records, _runner.mutate(rng, [log[:600], log[:2000]], 3000))

    run_counted(tally, loop)
    assert tally.execs == 3600


# -- longer variants ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_fuzz_frame_decode_long():
    fuzz_frames(slow=True)


@pytest.mark.slow
def test_fuzz_commitlog_parser_long():
    fuzz_records(slow=True)


@pytest.mark.slow
def test_fuzz_store_recovery_long(tmp_path):
    fuzz_recovery(str(tmp_path), slow=True)


ATHERIS_SECONDS = 5                 # per target: a smoke run of libFuzzer's coverage-guided loop


@pytest.mark.slow
@pytest.mark.parametrize("target", ["frame", "commitlog", "recovery"])
def test_atheris_target_runs(target, tmp_path):
    """Each fuzz/fuzz_*.py entry point under atheris (libFuzzer) for ATHERIS_SECONDS: it must run
    instrumented (not the fallback loop), execute inputs and end without a crash or a hang
    (libFuzzer exits non-zero and saves the input on either).  atheris comes with
    ``pip install -e ".[fuzz]"``; without it this fails, it does not skip."""
    import os
    import re
    import subprocess
    import sys

    try:
        import atheris  # noqa: F401
    except ImportError:
        pytest.fail('atheris is not installed: pip install -e ".[fuzz]" (the slow tier needs it)')
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "fuzz", f"fuzz_{target}.py")
    r = subprocess.run([sys.executable, script, f"-max_total_time={ATHERIS_SECONDS}"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=ATHERIS_SECONDS + 120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    m = re.search(r"fuzz execs / crashes / hangs: (\d+) / 0 / 0  \(atheris\)", out)
    assert m and int(m.group(1)) > 0, out[-3000:]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(("crash-", "timeout-", "oom-"))]
    print(f"\natheris {target}: {int(m.group(1)):,} execs in {ATHERIS_SECONDS} s, 0 crashes, 0 hangs")
