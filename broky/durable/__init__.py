"""Durable topics in the broker: config tables, partition owners, acks, replay.

``broky.storage`` is the log itself (no trio, no broker); this package runs
it inside a broker: one owner task per partition, group commit, acks in
frame order, and replay that joins the live stream without gap or duplicate.
"""
