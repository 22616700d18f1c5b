"""Lint: the durability journal is trustworthy only if nothing else syncs (RELIABILITY.md T1b).

The power-cut simulator believes ``STORE/.durable``, which the one sync wrapper
(rmq/_core/mapped_file.pyx: ``MappedFile._flush_range`` -> msync, ``fsync_file``,
``fsync_dir``) appends to only after the call returned 0.  A sync call anywhere else would
make durable data the journal does not know about (harmless) or, worse, a second code path
whose failures do not stop acknowledgements.  So every sync call in the source tree must be one
of the sites listed here, each explicitly.
"""
import os
import re
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "rmq")

SYNC_CALL = re.compile(r"\b(?:os\.)?(?:fsync|fdatasync|msync|sync_file_range)\(|\bimport\s+mmap\b|"
                       r"\bmmap\.mmap\s*\(|\bO_D?SYNC\b")

# (file, the stripped source line) -> how many times it may occur
ALLOWED = {
    # the wrapper itself: the C declarations and the three calls
    ("rmq/_core/mapped_file.pyx", "int msync(void* addr, size_t length, int flags)"): 1,
    ("rmq/_core/mapped_file.pyx", "int fsync(int fd)"): 1,
    ("rmq/_core/mapped_file.pyx", "rc = msync(self.base + aligned, <size_t>(end - aligned), MS_SYNC)"): 1,
    ("rmq/_core/mapped_file.pyx", "rc = fsync(cfd)"): 2,          # fsync_file (fd), fsync_dir
    # epoch file (HA): tmp file fsync and directory fsync in its own module (not store data the
    # power-cut simulator rewrites: it leaves files the journal does not know as they are)
    ("rmq/store/epoch.py", "os.fsync(fd)"): 1,
    ("rmq/store/epoch.py", "os.fsync(f.fileno())"): 1,
    # supervisor: its pid file and the broker.conf it writes (not store data)
    ("rmq/actors/supervisor.py", "os.fsync(fd)"): 1,
    ("rmq/actors/supervisor.py", "os.fsync(f.fileno())"): 1,
    # client side: the local consumer-offset file of a broadcasting consumer
    ("rmq/client/offset_store.py", "os.fsync(f.fileno())"): 1,
    # benchmark of the machine's raw fdatasync / mmap ceilings (never on a store)
    ("rmq/bench/ceilings.py", "import mmap"): 1,
    ("rmq/bench/ceilings.py", "m = mmap.mmap(f.fileno(), nbytes)"): 1,
    ("rmq/bench/ceilings.py", "os.fdatasync(fd)"): 1,
}


def _code_lines(path):
    """Source lines outside comments and docstring-ish text (lines inside ``...`` are prose)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if s.startswith("#"):
                continue
            s = s.split("  #", 1)[0].strip()
            if "``" in s:
                continue
            yield s


def find_sync_sites():
    found = Counter()
    for root, _dirs, files in os.walk(SRC):
        for n in files:
            if not n.endswith((".py", ".pyx", ".pxd", ".pxi", ".h")):
                continue
            path = os.path.join(root, n)
            rel = os.path.relpath(path, ROOT)
            for s in _code_lines(path):
                if SYNC_CALL.search(s):
                    found[(rel, s)] += 1
    return found


def test_no_sync_call_outside_the_wrapper():
    found = find_sync_sites()
    unexpected = {k: v for k, v in found.items() if ALLOWED.get(k, 0) < v}
    assert not unexpected, (
        "sync calls outside the one wrapper (use rmq._core.mapped_file.fsync_file / fsync_dir, which "
        f"journal under RMQ_DURABILITY_TRACE, or list the site in ALLOWED with a reason): {unexpected}")


def test_allow_list_is_not_stale():
    found = find_sync_sites()
    stale = {k: v for k, v in ALLOWED.items() if found.get(k, 0) != v}
    assert not stale, f"allowed sync sites that changed or went away (update ALLOWED): {stale}"


def test_durable_position_moves_only_after_a_successful_sync():
    """In the wrapper the journal line and ``durable_position`` follow the msync's rc == 0 check."""
    with open(os.path.join(SRC, "_core", "mapped_file.pyx"), encoding="utf-8") as f:
        src = f.read()
    body = src[src.index("cdef int _flush_range"):src.index("def flush(self")]
    i_call = body.index("rc = msync(")
    i_check = body.index("if rc != 0:", i_call)
    i_raise = body.index("raise StoreError", i_check)
    assert i_call < i_check < i_raise < body.index("self.durable_position = end") \
        < body.index('durability_journal(f"R ')
