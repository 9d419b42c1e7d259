"""A replicated partition's owner in a real broker, with a stand-in gate:
acks, live delivery and reads wait for the high watermark; refusals reach
the client with their code."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import trio

from broky import Broker, BrokyError, ErrorCode
from broky.protocol.constants import ErrorCode as WireCode
from broky.protocol.frames import Run
from tests.durable.test_durable_broker import durable_config


class _Gate:
    """Holds every stored round until the test releases it."""

    def __init__(self) -> None:
        self.high_watermark = 0
        self.refuse: tuple[WireCode, str] | None = None
        self.held: list[tuple[int, Callable[[], None], Callable[[WireCode, str], None]]] = []
        #: The producer identities of the held runs (what followers will store).
        self.producers: list[tuple[int, int]] = []
        #: (offset, runs) of each round written, told before its fsync.
        self.written_rounds: list[tuple[int, int]] = []

    def refusal(self) -> tuple[WireCode, str] | None:
        return self.refuse

    def written(
        self,
        offset: int,
        runs: Sequence[Run],
        stamps: Sequence[int],
        producers: Sequence[tuple[int, int]] | None,
    ) -> None:
        self.written_rounds.append((offset, len(runs)))

    def hold(
        self,
        offset: int,
        runs: Sequence[Run],
        stamps: Sequence[int],
        deliver: Callable[[], None],
        fail: Callable[[WireCode, str], None],
        producers: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        self.producers.extend(producers or [(0, 0)] * len(runs))
        self.held.append((offset + sum(run.count for run in runs), deliver, fail))

    def release(self) -> None:
        for end, deliver, _ in self.held:
            self.high_watermark = end
            deliver()
        self.held.clear()


async def test_acks_delivery_and_reads_wait_for_the_high_watermark(tmp_path: Path) -> None:
    gate = _Gate()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            broker = Broker(durable_config(tmp_path, partitions=1))
            await nursery.start(broker.serve)
            assert broker.store is not None
            for owner in broker.store.owners.values():
                owner.replica = gate
            async with broker.connect() as client, broker.connect() as reader:
                live = await reader.subscribe("orders.>")
                acked: list[object] = []

                async def publish() -> None:
                    await client.publish("orders.k", b"one", ack=True)
                    acked.extend(await client.flush_acks())

                nursery.start_soon(publish)
                while not gate.held:  # noqa: ASYNC110 - the round reaches the gate
                    await trio.sleep(0.01)
                await trio.sleep(0.1)
                assert acked == []
                # The replication role gets the run's producer to replicate.
                assert gate.producers == [(client._acks.producer_id, 1)]
                # It was told of the round before the fsync, to replicate meanwhile.
                assert gate.written_rounds == [(0, 1)]
                assert await reader.fetch("orders", 0, 0) == []
                assert (await reader.partitions("orders"))[0].end_offset == 0
                gate.release()
                message = await live.__anext__()
                assert message.payload == b"one"
                while not acked:  # noqa: ASYNC110 - the ack is on its way
                    await trio.sleep(0.01)
                assert [m.payload for m in await reader.fetch("orders", 0, 0)] == [b"one"]
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("code", [WireCode.NOT_LEADER, WireCode.NOT_ENOUGH_REPLICAS])
async def test_a_refusal_fails_the_acked_frame_with_its_code(
    tmp_path: Path, code: WireCode
) -> None:
    gate = _Gate()
    gate.refuse = (code, "leader n2 at 127.0.0.1:1 (epoch 3)")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            broker = Broker(durable_config(tmp_path, partitions=1))
            await nursery.start(broker.serve)
            assert broker.store is not None
            for owner in broker.store.owners.values():
                owner.replica = gate
            async with broker.connect() as client:
                await client.publish("orders.k", b"one", ack=True)
                with pytest.raises(BrokyError) as raised:
                    await client.flush_acks()
                assert raised.value.code is ErrorCode(code)
                assert "leader n2 at 127.0.0.1:1" in str(raised.value)
            assert gate.held == []
            nursery.cancel_scope.cancel()
