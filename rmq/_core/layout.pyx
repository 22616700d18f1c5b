# cython: language_level=3
"""On-disk layout constants of rmq (RocketMQ's own; SPEC.md §1-§4).

The constants are declared in ``layout.pxd`` as anonymous ``cpdef enum``
blocks: Cython code ``cimport``s them as C constants, Python code imports them
from this module as plain ``int``s.
"""
