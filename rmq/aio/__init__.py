"""asyncio clients: plain pyzmq DEALER sockets read from the event loop (``loop.add_reader``;
:mod:`rmq.aio.remoting` for the consumers, :mod:`rmq.aio.producer` its own pipelined sender).

::

    from rmq.aio import Producer
    async with Producer("127.0.0.1:9876", group="pg") as p:
        r = await p.send(Message("orders", b"x"))

Names are imported lazily, so ``import rmq.aio`` stays cheap.
"""

_LAZY = {
    "Producer": "rmq.aio.producer",
    "AsyncProducer": "rmq.aio.producer",
    "PullConsumer": "rmq.aio.consumer",
    "PushConsumer": "rmq.aio.consumer",
    "AsyncPullConsumer": "rmq.aio.consumer",
    "AsyncPushConsumer": "rmq.aio.consumer",
    "SimpleConsumer": "rmq.aio.simple_consumer",
    "AsyncSimpleConsumer": "rmq.aio.simple_consumer",
    "TransactionProducer": "rmq.aio.transaction",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rmq.aio' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(mod), name)
