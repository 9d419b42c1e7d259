# cython: language_level=3
"""Compiled twin of ``broky.protocol.frames.EncodedRunPure``: the run as the broker forwards it.

Why a compiled type: on short runs (many keys, one message per frame) the
broker builds, routes, queues and frees one of these per message. As an
attrs class each costs a Python-level ``__init__`` frame, three generic
attribute lookups per read and a heap-type deallocation; as an extension
type the compiled reader (``_forward``) fills its fields directly and the
compiled fan-out (``broky.router._fanout``) reads them as C struct members.
Measured in process over 1,000 keys, this is most of what a run costs
besides copying its bytes.

Same fields, equality and repr as the pure class; tests compare the two.
"""


cdef class EncodedRun:
    """A run as the broker forwards it: its key, message count and chunk
    (see ``broky.protocol.chunks``). Nothing mutates one after it is built."""

    def __init__(self, key, Py_ssize_t count, chunk):
        self.key = key
        self.count = count
        self.chunk = chunk

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        cdef EncodedRun that = <EncodedRun>other
        return self.key == that.key and self.count == that.count and self.chunk == that.chunk

    def __ne__(self, other):
        result = self.__eq__(other)
        if result is NotImplemented:
            return result
        return not result

    __hash__ = None

    def __repr__(self):
        return f"EncodedRun(key={self.key!r}, count={self.count!r}, chunk={self.chunk!r})"
