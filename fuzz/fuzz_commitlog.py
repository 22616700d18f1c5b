"""atheris target: the Cython CommitLog parser (check_message, decode_records, scan_valid,
decode_properties) on fuzzed bytes (RELIABILITY.md T8).

    python fuzz/fuzz_commitlog.py -max_total_time=60
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz import _runner  # noqa: E402

with _runner.instrumented():
    from fuzz.targets import fuzz_records, seed_store  # noqa: E402


def seeds():
    log = seed_store()["commitlog/00000000000000000000"]
    return [log[:n] for n in (200, 600, 1500, 4000)]


if __name__ == "__main__":
    sys.exit(_runner.main(fuzz_records, seeds(), max_len=16_384))
