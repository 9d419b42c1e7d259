"""Durable storage: partitioned append-only logs of runs, on the local disk.

No I/O framework and no broker imports: the router calls these synchronous
APIs, tools read the same files offline. ``docs/storage.md`` documents the
on-disk format and the rules.
"""
