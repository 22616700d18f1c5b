"""Child process of test_kill9: append forever, print every acknowledged message.

argv: store_path flush_disk_type start_seq
Prints ``ack <seq> <queue_id> <queue_offset>`` after each PUT_OK (flushed under SYNC_FLUSH).
"""
import sys

from rmq.store.message_store import MessageStore
from tests.conftest import SMALL


def main():
    path, flush_type, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
    s = MessageStore(path, flush_disk_type=flush_type, **SMALL)
    print("ready", flush=True)
    while True:
        q = seq % 3
        r = s.put_message("Crash", b"seq=%08d;" % seq + b"p" * (seq % 200), q, keys=[f"s{seq}"])
        if not r.ok:
            print("fail", seq, r.status.value, flush=True)
            return
        print("ack", seq, q, r.queue_offset, flush=True)
        if seq % 7 == 0:
            s.dispatch()
        seq += 1


if __name__ == "__main__":
    main()
