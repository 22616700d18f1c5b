"""atheris target: rmq.protocol.decode of fuzzed multipart parts (RELIABILITY.md T8).

    python fuzz/fuzz_frame.py -max_total_time=60
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz import _runner  # noqa: E402

with _runner.instrumented():
    import msgpack  # noqa: E402
    from fuzz.targets import PART_SEPARATOR, fuzz_frame  # noqa: E402


def seeds():
    hdr = msgpack.packb({"code": 10, "opaque": 7, "flag": 0, "remark": "",
                         "fields": {"topic": "T", "queueId": 0, "properties": {"TAGS": "a"}}}, use_bin_type=True)
    return [b"\x01" + hdr + PART_SEPARATOR + b"body", b"\x01" + hdr, b"\x03" + hdr + PART_SEPARATOR + b"x",
            b"\x01" + b"\xdd\xff\xff\xff\xff", b"\x01" + b"\x81" * 200]


if __name__ == "__main__":
    sys.exit(_runner.main(fuzz_frame, seeds(), max_len=70_000))
