"""Producer.send_async's C entry (rmq._core.client_msg.CallerAppend.send_async): a plain producer
(batching on, no message trace) binds it as its instance's ``send_async``; it takes the common case
itself and hands every other call to the class's method, with the same arguments."""
import gc
import inspect

import pytest

from rmq import Message, Producer
from rmq.errors import MQClientError

NOWHERE = "127.0.0.1:9"             # nothing listens there: nothing here needs an answer


def test_a_plain_producer_binds_the_c_entry_and_a_traced_or_unbatched_one_does_not():
    with Producer(NOWHERE, group="entry-plain") as p:
        assert p.send_async == p._caller.send_async
    with Producer(NOWHERE, group="entry-trace", enable_msg_trace=True) as p:
        assert inspect.ismethod(p.send_async) and p.send_async.__func__ is Producer.send_async
    with Producer(NOWHERE, group="entry-nobatch", batch_size=0) as p:
        assert p.send_async.__func__ is Producer.send_async


def test_a_subclass_that_overrides_send_async_keeps_its_override():
    class Counting(Producer):
        calls = 0

        def send_async(self, msg, callback=None, **kw):
            Counting.calls += 1
            return super().send_async(msg, callback, **kw)

    with Counting(NOWHERE, group="entry-sub") as p:
        with pytest.raises(MQClientError):
            p.send_async("not a message")        # the override, then the class's checks
        assert Counting.calls == 1 and p.pending == 0


def test_every_argument_reaches_the_class_method(monkeypatch):
    """The cases the C entry does not take (selector, queue, timeout, a sharding key of another
    type) go to ``Producer.send_async`` with the same arguments."""
    seen = []

    def spy(self, msg, callback=None, **kw):
        seen.append((msg.body, callback, kw))
        return "from the class"

    monkeypatch.setattr(Producer, "send_async", spy)
    with Producer(NOWHERE, group="entry-args") as p:
        monkeypatch.setattr(Producer, "send_async", spy)
        sel = lambda mqs, m, a: mqs[0]  # noqa: E731
        assert p._caller.send_async(Message("T", b"1"), print, selector=sel, arg=7) == "from the class"
        assert p._caller.send_async(Message("T", b"2"), timeout_ms=5) == "from the class"
        assert p._caller.send_async(Message("T", b"3"), sharding_key=(1, 2)) == "from the class"
    assert seen == [(b"1", print, dict(timeout_ms=None, selector=sel, arg=7, sharding_key=None, queue=None)),
                    (b"2", None, dict(timeout_ms=5, selector=None, arg=None, sharding_key=None, queue=None)),
                    (b"3", None, dict(timeout_ms=None, selector=None, arg=None, sharding_key=(1, 2), queue=None))]


def test_bad_input_and_a_closed_or_dropped_producer_raise_mqclienterror():
    p = Producer(NOWHERE, group="entry-closed", linger_ms=60_000)
    send = p.send_async
    with pytest.raises(MQClientError):
        send("not a message")
    assert p.pending == 0
    p.close()
    with pytest.raises(MQClientError, match="closed"):
        send(Message("EntryClosed", b"x"))
    del p
    gc.collect()
    with pytest.raises(MQClientError, match="closed"):
        send(Message("EntryClosed", b"y"))
