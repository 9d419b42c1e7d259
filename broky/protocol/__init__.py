"""Broky's wire protocol, sans-IO: bytes in, typed frames out, and back.

Nothing in this package performs I/O or imports trio; the server, the client and
the tests all drive the same code.
"""
