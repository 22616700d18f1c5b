"""rmq.common.malloc_tuning: glibc's thresholds, observed through mallinfo2 in fresh processes."""
import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from rmq.common import malloc_tuning as MT

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# A fresh interpreter: optionally tune (or make a client that tunes), then malloc 1 MiB and report
# whether glibc gave it its own mapping (mallinfo2's hblks: chunks allocated with mmap).
PROBE = textwrap.dedent("""
    import ctypes, json, os, sys
    from rmq.common import malloc_tuning as MT

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                    "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    how = sys.argv[1]
    never = MT.applied()
    if how == "tune":
        first = MT.tune_malloc()
    else:                                         # a client made (or started), never connected
        first = None
        if how == "consumer":
            from rmq.client.consumer_api import ConsumerAPI
            client = ConsumerAPI("127.0.0.1:9")
        elif how == "producer":
            from rmq import Producer
            client = Producer("127.0.0.1:9")
        elif how == "aio-consumer":
            from rmq.aio.consumer import AsyncConsumerAPI
            client = AsyncConsumerAPI("127.0.0.1:9")
        elif how == "aio-producer":
            import asyncio
            from rmq.aio import Producer as AioProducer
            async def start():
                return await AioProducer("127.0.0.1:9").start()
            client = asyncio.new_event_loop().run_until_complete(start())
    again = MT.tune_malloc(mmap_threshold=1 << 20, trim_threshold=1 << 20)
    before = libc.mallinfo2().hblks
    p = libc.malloc(1 << 20)
    mapped = libc.mallinfo2().hblks - before
    libc.free(p)
    print(json.dumps({"never": never, "first": first, "again": again, "applied": MT.applied(), "mapped": mapped}),
          flush=True)
    os._exit(0)                                   # a made client's threads are not waited for
""")


def probe(how: str, **env) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                                          MT.TUNING_ENV)}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE, how], env=e, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_a_tuned_process_takes_a_1_mib_buffer_from_the_heap():
    r = probe("tune")
    assert r["first"] == {"M_MMAP_THRESHOLD": MT.MALLOC_MMAP_THRESHOLD_BYTES,
                          "M_TRIM_THRESHOLD": MT.MALLOC_TRIM_THRESHOLD_BYTES}
    assert r["again"] == r["first"] == r["applied"]   # once per process: the second call's values are ignored
    assert r["never"] is None                      # applied(): None before any call
    assert r["mapped"] == 0


@glibc
def test_an_untuned_process_maps_a_1_mib_buffer_of_its_own():
    # the same probe with the tuning turned off: glibc's defaults (a 128 KiB threshold at start)
    r = probe("tune", **{MT.TUNING_ENV: "0"})
    assert r["first"] == {} and r["again"] == {}
    assert r["mapped"] == 1


@glibc
@pytest.mark.parametrize("client", ["consumer", "producer", "aio-consumer", "aio-producer"])
def test_making_a_client_tunes_its_process(client):
    r = probe(client)
    assert r["never"] is None
    assert r["again"] == {"M_MMAP_THRESHOLD": MT.MALLOC_MMAP_THRESHOLD_BYTES,
                          "M_TRIM_THRESHOLD": MT.MALLOC_TRIM_THRESHOLD_BYTES}
    assert r["mapped"] == 0


@glibc
def test_glibcs_own_variable_wins_over_the_default():
    r = probe("tune", MALLOC_MMAP_THRESHOLD_=str(128 * 1024))
    assert r["first"] == {"M_TRIM_THRESHOLD": MT.MALLOC_TRIM_THRESHOLD_BYTES}   # the mmap threshold left alone
    assert r["mapped"] == 1


@pytest.mark.parametrize("kwargs", [
    {"mmap_threshold": 0},
    {"mmap_threshold": MT.MALLOC_MMAP_THRESHOLD_MAX_BYTES + 1},
    {"mmap_threshold": 1.5},
    {"trim_threshold": 0},
    {"trim_threshold": "16M"},
])
def test_a_threshold_out_of_range_is_refused_and_sets_nothing(kwargs):
    before = MT.applied()
    with pytest.raises(ValueError, match="threshold must be"):
        MT.tune_malloc(**kwargs)
    assert MT.applied() == before


def test_defaults_are_in_glibcs_range_and_above_a_pull_page():
    from rmq.client.producer_request import MAX_MESSAGE_SIZE
    from rmq.store.config import MessageStoreConfig
    assert MessageStoreConfig().max_transfer_bytes_on_message_in_memory < MT.MALLOC_MMAP_THRESHOLD_BYTES
    assert MAX_MESSAGE_SIZE <= MT.MALLOC_MMAP_THRESHOLD_BYTES <= MT.MALLOC_MMAP_THRESHOLD_MAX_BYTES
    assert MT.MALLOC_TRIM_THRESHOLD_BYTES >= MT.MALLOC_MMAP_THRESHOLD_BYTES
