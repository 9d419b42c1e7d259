"""Each answer of a pipelined batch reaches that batch, over a real client.

``Client.publish_batch`` keeps several acked batches in flight on one
connection (broky.client.cluster); the broker answers each acked frame, in
order, with a PublishAck or an Error in its place. An Error code the client
did not take as an answer in place left the frame waiting, so the next
PublishAck went to the wrong batch: its caller got another batch's offsets
(the long Jepsen run with network partitions found it with ``SequenceGap``).
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from broky import Client, ErrorCode
from broky.client.errors import BrokyError
from broky.protocol.frames import Error, Publish, PublishAck
from tests.client.scripted_broker import ScriptedBroker

#: Every code a broker sends in place of an acked frame (docs/protocol.md).
IN_PLACE = (
    ErrorCode.STORAGE_FAILURE,
    ErrorCode.OWNER_UNAVAILABLE,
    ErrorCode.NOT_LEADER,
    ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.OUT_OF_ORDER_SEQUENCE,
    ErrorCode.SEQUENCE_GAP,
)


@pytest.mark.parametrize("code", IN_PLACE, ids=lambda code: code.name)
async def test_an_error_in_place_answers_its_batch_and_the_next_ack_the_next(
    wired: tuple[ScriptedBroker, Client], code: ErrorCode
) -> None:
    broker, client = wired
    producer = 0x1234
    with trio.fail_after(10):
        first = await client.publish_batch("orders.a", [b"1", b"2"], producer, 1)
        second = await client.publish_batch("orders.a", [b"3"], producer, 3)
        publishes = await broker.wait_for(Publish, 2)
        assert [p.first_sequence for p in publishes] == [1, 3]
        stream = publishes[0].stream
        await broker.send(Error(code, f"refused: {code.name}", stream))
        await broker.send(PublishAck(stream, 2, (0,), (0,), (40,), (40,)))
        with pytest.raises(BrokyError) as refused:
            await client.wait_batch(first)
        assert refused.value.code is code
        [run] = await client.wait_batch(second)
    assert (run.partition, run.first_offset, run.last_offset) == (0, 40, 40)
