"""``durable_chunk_sizes`` measures a run's durable chunk without building
it, for runs that came as chunks and for pieces of split runs (no chunk):
each size is the length of the chunk ``durable_chunk`` builds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broky.protocol.chunk_reading import read_chunk_run
from broky.protocol.chunks import (
    CHUNK_TABLE_OFFSET,
    durable_chunk,
    durable_chunk_sizes,
    encode_run_chunk,
)
from broky.protocol.frames import Run
from broky.protocol.message import encode_message, pack_sizes


@given(
    runs=st.lists(
        st.tuples(
            st.binary(min_size=1, max_size=30),
            st.lists(st.binary(max_size=50), min_size=1, max_size=4),
            st.booleans(),
        ),
        max_size=6,
    )
)
def test_sizes_are_the_lengths_of_the_durable_chunks(
    runs: list[tuple[bytes, list[bytes], bool]],
) -> None:
    built = []
    for key, payloads, as_chunk in runs:
        messages = [encode_message(payload) for payload in payloads]
        sizes, data = pack_sizes([len(m) for m in messages]), b"".join(messages)
        if as_chunk:
            chunk = encode_run_chunk(key, 0, sizes, data)
            run = read_chunk_run(memoryview(chunk), CHUNK_TABLE_OFFSET)
            assert run is not None
        else:
            run = Run(key, 0, len(messages), sizes, data)
        built.append(run)
    assert durable_chunk_sizes(built) == [len(durable_chunk(run, 9, 2, 40)) for run in built]
