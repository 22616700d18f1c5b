"""send_async's common case in C (rmq._core.client_msg.CallerAppend), on a Sender that is not
started: its state (``running``, ``pending``, ``open``, ``batch_size``) set as the I/O thread would
have it.  The call either appends to the open batch or hands everything back untouched."""
import pytest

from rmq import Message
from rmq._core.client_msg import CallerAppend, PreparedMessage
from rmq.client.futures import SendFuture
from rmq.client.message_accumulator import ASYNC, Pending
from rmq.client.producer_request import ProducerOptions, message_preparer
from rmq.client.sender import Sender
from rmq.errors import MQClientError

MAX_PENDING = 3


@pytest.fixture
def sender():
    s = Sender(["127.0.0.1:9876"], "pg", "client", ProducerOptions())
    s.running = True
    return s


def caller(s):
    return CallerAppend(s, message_preparer(ProducerOptions()), SendFuture, MAX_PENDING)


def open_batch(s, key):
    p = Pending([], None, ASYNC, 0.0, 1.0)
    p.futures = []
    p.open_key = key
    s.open[key] = p
    return p


def test_a_message_joins_its_topics_open_batch(sender):
    batch = open_batch(sender, "T")
    seen = []
    fut = caller(sender).send(Message("T", b"x" * 100), seen.append)
    assert type(fut) is SendFuture and not fut.done()
    assert batch.futures == [fut] and len(batch.preps) == 1
    assert batch.nbytes == batch.preps[0].size and sender.pending == 1
    fut.set_result("done")
    assert seen == [fut]                        # the callback is the future's


def test_a_sharding_keys_message_joins_the_batch_of_its_topic_and_key(sender):
    keyed = open_batch(sender, ("T", "k"))
    plain = open_batch(sender, "T")
    m = Message("T", b"x")
    caller(sender).send(m, None, "k")
    assert len(keyed.preps) == 1 and not plain.preps
    assert m.properties["__SHARDINGKEY"] == "k" and b"__SHARDINGKEY\x01k\x02" in keyed.preps[0].props
    n = Message("T", b"y")
    open_batch(sender, ("T", 7))
    caller(sender).send(n, None, 7)                     # a key that is not a str: its str
    assert n.properties["__SHARDINGKEY"] == "7"


@pytest.mark.parametrize("why", ["no batch", "batch full", "pending at max", "closed", "not running"])
def test_outside_the_common_case_everything_is_handed_back_untouched(sender, why):
    c = caller(sender)
    batch = open_batch(sender, "T")
    if why == "no batch":
        sender.open.clear()
    elif why == "batch full":
        batch.nbytes = sender.batch_size - 10
    elif why == "pending at max":
        sender.pending = MAX_PENDING
    elif why == "closed":
        c.closed = True
    else:
        sender.running = False
    before = (sender.pending, list(batch.preps), batch.nbytes)
    r = c.send(Message("T", b"x" * 100), None)
    assert type(r) is tuple and type(r[0]) is PreparedMessage and type(r[1]) is SendFuture
    assert r[0].uniq_id                         # prepared once: the Python path takes this one
    assert (sender.pending, list(batch.preps), batch.nbytes) == before


def test_a_message_that_cannot_join_a_batch_comes_back_without_a_future(sender):
    batch = open_batch(sender, "T")
    prep, fut = caller(sender).send(Message("T", b"z" * 5000), None)      # compressed: not batchable
    assert fut is None and not prep.batchable and not batch.preps and sender.pending == 0


def test_a_bad_message_raises_and_changes_nothing(sender):
    batch = open_batch(sender, "T")
    with pytest.raises(MQClientError):
        caller(sender).send(Message("T", b""), None)                       # an empty body
    with pytest.raises(MQClientError):
        caller(sender).send(Message("bad topic!", b"x"), None)
    assert not batch.preps and sender.pending == 0


def test_the_lock_is_free_after_every_outcome(sender):
    c = caller(sender)
    open_batch(sender, "T")
    c.send(Message("T", b"x"), None)
    sender.open.clear()
    c.send(Message("T", b"x"), None)
    with pytest.raises(MQClientError):
        c.send(Message("T", b""), None)
    assert sender.lock.acquire(blocking=False)
    sender.lock.release()


def test_a_batch_class_without_slots_takes_the_attribute_path(sender):
    class PlainBatch:                               # no __slots__: fields in an instance dict
        def __init__(self):
            self.preps, self.futures, self.nbytes = [], [], 0

    sender.open["T"] = plain = PlainBatch()
    c = caller(sender)
    f1 = c.send(Message("T", b"x" * 10), None)
    slotted = open_batch(sender, "U")               # and back to the slots of Pending
    f2 = c.send(Message("U", b"y" * 20), None)
    assert plain.futures == [f1] and plain.nbytes == plain.preps[0].size
    assert slotted.futures == [f2] and slotted.nbytes == slotted.preps[0].size and sender.pending == 2


def test_a_sender_state_that_is_not_in_its_instance_dict_hands_everything_back(sender):
    class Wrapped(Sender):
        @property
        def running(self):                          # a descriptor, not an instance attribute
            return True

        @running.setter
        def running(self, v):
            pass

    s = Wrapped(["127.0.0.1:9876"], "pg", "client", ProducerOptions())
    batch = open_batch(s, "T")
    prep, fut = caller(s).send(Message("T", b"x"), None)
    assert type(prep) is PreparedMessage and type(fut) is SendFuture
    assert not batch.preps and not batch.futures and s.pending == 0
    assert s.lock.acquire(blocking=False)
    s.lock.release()
