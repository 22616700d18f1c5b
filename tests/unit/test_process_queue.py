"""ProcessQueue.notify_when_below: the push consumers' flow control resumes a held-back pull
once the consume side made room (called once, by whoever brings the count down)."""
import threading

from rmq.client.consumer_process_queue import ProcessQueue


class M:
    def __init__(self, off):
        self.queue_offset, self.body = off, b"x"


def filled(n):
    pq = ProcessQueue()
    msgs = [M(i) for i in range(n)]
    pq.put_message(msgs)
    return pq, msgs


def test_called_at_once_when_the_queue_is_already_low_enough():
    pq, _ = filled(3)
    calls = []
    pq.notify_when_below(3, lambda: calls.append("now"))
    assert calls == ["now"]


def test_called_once_by_the_remove_that_brings_the_count_down_in_its_thread():
    pq, msgs = filled(10)
    calls = []
    pq.notify_when_below(4, lambda: calls.append(threading.current_thread().name))
    pq.remove_message(msgs[:5])                # 5 left: above 4
    assert calls == []
    t = threading.Thread(target=pq.remove_message, args=(msgs[5:6],), name="consumer-1")
    t.start()
    t.join()
    assert calls == ["consumer-1"]             # 4 left
    pq.remove_message(msgs[6:])
    assert calls == ["consumer-1"]             # once


def test_a_new_callback_replaces_one_not_called_yet():
    pq, msgs = filled(10)
    calls = []
    pq.notify_when_below(2, lambda: calls.append("old"))
    pq.notify_when_below(8, lambda: calls.append("new"))
    pq.remove_message(msgs)
    assert calls == ["new"]


def test_an_orderly_commit_brings_the_count_down_too():
    pq, _ = filled(6)
    calls = []
    pq.notify_when_below(2, lambda: calls.append(1))
    assert len(pq.take_messages(5)) == 5
    assert calls == []                         # taken is not consumed: still counted
    assert pq.commit() == 5
    assert calls == [1]


def test_the_callback_runs_outside_the_queue_lock():
    pq, msgs = filled(4)
    seen = []
    pq.notify_when_below(0, lambda: seen.append(pq.has_temp_message()))   # takes the lock again
    pq.remove_message(msgs)
    assert seen == [False]
