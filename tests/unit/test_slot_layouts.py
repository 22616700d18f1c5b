"""SendFuture and SendResult made and completed through their slots in C
(``rmq._core.client_msg``: ``new_send_future``, ``finish_future``, ``complete_send_batch``) are the
objects their Python paths make, field for field; anything else goes through its class.  The race
of a completion against waiters in other threads, for futures made either way:
tests/unit/test_futures.py."""
import dataclasses
import gc
import sys
from concurrent.futures import Future, InvalidStateError

import pytest

from rmq._core.client_msg import complete_send_batch, finish_future, new_send_future
from rmq.client.futures import SendFuture
from rmq.client.message import Message, MessageQueue, SendResult, SendStatus
from rmq.client.producer_request import ProducerOptions, message_preparer


def c_future(callback=None):
    return new_send_future(SendFuture, callback)


def has_dict(f) -> bool:
    return any(type(o) is dict for o in gc.get_referents(f))


def preps(n):
    return message_preparer(ProducerOptions()).prepare_batch([Message("T", b"x") for _ in range(n)])


@pytest.mark.parametrize("callback", [None, print])
def test_a_future_made_in_c_has_every_slot_its_init_sets(callback):
    c, py = c_future(callback), SendFuture(callback)
    assert type(c) is SendFuture and isinstance(c, Future)
    for name in SendFuture.__slots__:
        assert getattr(c, name) == getattr(py, name), name
    assert not gc.is_tracked(c) and not gc.is_tracked(py)      # pending: out of the cyclic GC
    assert c.running() and not c.done() and not c.cancel() and not has_dict(c)


def test_a_future_made_in_c_completes_as_one_made_by_its_class():
    calls = []
    f = c_future(lambda fut: calls.append(("ctor", fut.result())))
    f.add_done_callback(lambda fut: calls.append(("before", fut.result())))
    finish_future(f, 3, None)
    f.add_done_callback(lambda fut: calls.append(("after", fut.result())))
    assert calls == [("ctor", 3), ("before", 3), ("after", 3)]
    assert gc.is_tracked(f) and not has_dict(f)        # done: collectable again
    with pytest.raises(InvalidStateError):
        finish_future(f, 4, None)
    g = c_future()
    g.set_exception(ValueError("boom"))
    assert isinstance(g.exception(), ValueError)
    with pytest.raises(ValueError, match="boom"):
        g.result()


def test_the_slot_path_logs_a_raising_callback_and_runs_the_others(caplog):
    seen = []
    f = c_future(lambda fut: 1 / 0)
    f.add_done_callback(lambda fut: seen.append(fut.result()))
    f.set_result("ok")
    assert seen == ["ok"] and "exception calling callback" in caplog.text


def test_a_subclass_goes_through_its_own_init():
    class Traced(SendFuture):
        __slots__ = ("traced",)

        def __init__(self, callback=None):
            super().__init__(callback)
            self.traced = True

    f = new_send_future(Traced, None)
    assert type(f) is Traced and f.traced
    finish_future(f, 1, None)
    assert f.result() == 1


def test_results_made_in_c_equal_the_dataclass_ones():
    ps = preps(3)
    mq = MessageQueue("T", "broker-a", 2)
    out = complete_send_batch(None, SendResult, SendStatus.SEND_OK, ps, mq, 40, ["a", "b", "c"])
    want = [SendResult(SendStatus.SEND_OK, p.uniq_id, mq, 40 + i, oid) for i, (p, oid) in enumerate(zip(ps, "abc"))]
    assert out == want
    assert [type(r) for r in out] == [SendResult] * 3
    assert dataclasses.asdict(out[1]) == dataclasses.asdict(want[1])
    assert repr(out[0]) == repr(want[0]) and out[2].queue_id == 2 and out[0].region_id == "DefaultRegion"
    assert not any(gc.is_tracked(r) for r in out)


def test_results_and_futures_made_in_c_hold_and_release_their_references():
    # (counts read into locals first: pytest's assertion rewriting holds what an assert indexes)
    mq = MessageQueue("T", "broker-a", 0)
    ps = preps(100)
    ids = [f"{i:032X}" for i in range(100)]
    one_id = ids[7]
    base_mq, base_id = sys.getrefcount(mq), sys.getrefcount(one_id)
    cb = [].append
    base_cb = sys.getrefcount(cb)
    futures = [c_future(cb) for _ in range(100)]
    with_futures = sys.getrefcount(cb)
    assert with_futures == base_cb + 100
    out = complete_send_batch(futures, SendResult, SendStatus.SEND_OK, ps, mq, 0, ids)
    n_mq, n_id, n_cb = sys.getrefcount(mq), sys.getrefcount(one_id), sys.getrefcount(cb)
    assert futures == [None] * 100 and len(out) == 100
    assert (n_mq, n_id, n_cb) == (base_mq + 100, base_id + 1, base_cb)   # each future let go of its callback
    del out
    cb.__self__.clear()                                  # the futures the callback collected (holding results)
    n_mq, n_id = sys.getrefcount(mq), sys.getrefcount(one_id)
    assert (n_mq, n_id) == (base_mq, base_id)


def test_a_result_type_that_is_not_all_slots_goes_through_setattr():
    @dataclasses.dataclass
    class Plain:                                         # no __slots__: an instance dict
        status: object = None
        msg_id: str = ""
        message_queue: object = None
        queue_offset: int = 0
        offset_msg_id: str = ""
        region_id: str = "R"

    class WithNew(SendResult):
        __slots__ = ()

        def __new__(cls, *a):
            obj = super().__new__(cls)
            obj.region_id = "from __new__"
            return obj

    class Audited(SendResult):                         # writes go through a __setattr__ of its own
        __slots__ = ("writes",)

        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)
            if name != "writes":
                object.__setattr__(self, "writes", getattr(self, "writes", 0) + 1)

    ps = preps(2)
    mq = MessageQueue("T", "b", 1)
    audited = complete_send_batch(None, Audited, SendStatus.SEND_OK, ps, mq, 5, ["x", "y"])
    assert [r.writes for r in audited] == [6, 6]       # every field through it, as setattr does
    for cls in (Plain, WithNew):
        out = complete_send_batch(None, cls, SendStatus.SEND_OK, ps, mq, 5, ["x", "y"])
        assert [type(r) for r in out] == [cls, cls]
        assert [(r.msg_id, r.queue_offset, r.offset_msg_id) for r in out] == [(ps[0].uniq_id, 5, "x"),
                                                                             (ps[1].uniq_id, 6, "y")]
    # the layouts are cached per class: SendResult after another class is still right
    out = complete_send_batch(None, SendResult, SendStatus.SEND_OK, ps, mq, 0, ["x", "y"])
    assert out[1] == SendResult(SendStatus.SEND_OK, ps[1].uniq_id, mq, 1, "y")
