"""rmq: a RocketMQ-style message broker for Python with a Cython storage core.

Client API (imported lazily, so store-only users do not load ZeroMQ)::

    from rmq import Producer, PullConsumer, PushConsumer, Admin, Message
"""

__version__ = "0.1.0"

_LAZY = {
    "Message": "rmq.client.message",
    "MessageQueue": "rmq.client.message",
    "SendResult": "rmq.client.message",
    "ColumnSendResults": "rmq.client.message",
    "SendStatus": "rmq.client.message",
    "PullResult": "rmq.client.message",
    "PullStatus": "rmq.client.message",
    "Producer": "rmq.client.producer",
    "TransactionProducer": "rmq.client.transaction",
    "TransactionSendResult": "rmq.client.transaction",
    "LocalTransactionState": "rmq.client.transaction",
    "PullConsumer": "rmq.client.consumer",
    "PushConsumer": "rmq.client.consumer",
    "SimpleConsumer": "rmq.client.simple_consumer",
    "MessageView": "rmq.client.simple_consumer",
    "Admin": "rmq.client.admin",
    "MessageSelector": "rmq.filter",
    "ExpressionType": "rmq.filter",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rmq' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(mod), name)
