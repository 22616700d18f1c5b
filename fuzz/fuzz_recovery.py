"""atheris target: MessageStore recovery of a small real store mutated by the fuzz bytes
(8 bytes per mutation: kind, file, offset, value).  It must recover or raise StoreError,
and never serve a record failing its CRC (RELIABILITY.md T8).

    python fuzz/fuzz_recovery.py -max_total_time=60
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz import _runner  # noqa: E402

with _runner.instrumented():
    from fuzz.targets import fuzz_recovery  # noqa: E402


def seeds():
    return [bytes([0, 0, 0x80, 0, 0x10, 0, 0, 1]), bytes([2, 0, 0x80, 0, 0x10, 0, 0, 0]),
            bytes([7, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x80, 0, 0x1f, 0, 0, 3])]


if __name__ == "__main__":
    sys.exit(_runner.main(fuzz_recovery, seeds(), max_len=128))
