"""Build the optional C extension of the hot path; everything else is in pyproject.toml.

``broky.protocol._runs``, ``broky.protocol._forward``,
``broky.protocol._vectors``, ``broky.router._fanout``,
``broky.storage._partitions``, ``broky.storage._batch`` and ``broky.client._uniform``
(Cython) are the compiled twins of ``broky.protocol.frames.EncodedRunPure``,
``broky.protocol.forward.walk_pure``, ``broky.protocol.chunks.chunk_offsets_pure``
(and ``length_offsets_pure``, ``broky.protocol.located.encode_located_runs_pure``,
``encode_located_blob_pure``, ``broky.protocol.chunks.encode_run_chunk_from_pure``),
``broky.router.fanout.fan_out_pure``, ``broky.storage.topics.message_partitions_pure``
(and ``broky.storage.grouping.partition_groups_pure``),
``broky.storage.batch.encode_runs_pure`` (and ``stored_byte_ends_pure``) and
``broky.client.decoding.uniform_messages_pure``; ``broky.client._deliveries`` is the twin
of ``broky.client.delivery.convert_runs_pure`` and ``settle_ranges_pure``;
``broky.subscriptions._passes`` of ``broky.subscriptions.ack_pass.take_acked_pure``,
``merge_acked_pure``, ``broky.subscriptions.slots.assign_pure``,
``broky.subscriptions.settle_ranges.gather_ranges_pure`` and
``broky.subscriptions.delivery.delivery_segments_pure`` (and
``broky.subscriptions.image.put_pairs_pure``); ``broky.subscriptions._feed`` of
``broky.subscriptions.round_events``' ``needed_spans_pure``, ``event_bounds_pure`` and
``sort_events_pure`` and
the fresh-read loop of ``Dispatcher.feed_slots``;
``broky.protocol._columns`` of ``broky.storage.batch_reading.distinct_keys_pure`` and
``broky.durable.acks.ack_columns_pure``;
``broky.protocol._run_slots`` builds the compiled reader's Runs and has no twin of its own.
Each is optional twice over: the build continues without it when compiling fails
(``optional=True``), and Broky runs the pure-Python version whenever one is missing.
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython at build time: the pure-Python reader runs
    extensions = []
else:
    extensions = cythonize(
        [
            # ``vendor/xxhash``: xxHash's header, inlined where a key's slot
            # is hashed in C (``broky.storage._partitions``).
            Extension(
                name,
                [name.replace(".", "/") + ".pyx"],
                include_dirs=["vendor/xxhash"],
                optional=True,
            )
            for name in (
                "broky.protocol._runs",
                "broky.protocol._run_slots",
                "broky.protocol._forward",
                "broky.protocol._vectors",
                "broky.protocol._columns",
                "broky.router._fanout",
                "broky.storage._partitions",
                "broky.storage._batch",
                "broky.client._uniform",
                "broky.client._deliveries",
                "broky.subscriptions._passes",
                "broky.subscriptions._feed",
            )
        ],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )

setup(ext_modules=extensions)
