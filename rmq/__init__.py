"""rmq: a RocketMQ-style message broker for Python with a Cython storage core."""

__version__ = "0.1.0"
