"""The shared writer of router links and owner channels (broky.mesh.outgoing)."""

from __future__ import annotations

import trio
import trio.testing

from broky.mesh.outgoing import OutgoingFrames


async def _read(stream: trio.abc.Stream, size: int) -> bytes:
    data = b""
    with trio.fail_after(5):
        while len(data) < size:
            data += await stream.receive_some()
    return data


async def test_frames_go_out_in_queueing_order_whatever_the_writer_was_doing() -> None:
    ours, peer = trio.testing.memory_stream_pair()
    outgoing = OutgoingFrames()
    outgoing.put(b"a")
    outgoing.put(b"bc")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outgoing.write_to, ours)
        assert await _read(peer, 3) == b"abc"
        await trio.testing.wait_all_tasks_blocked()  # the writer waits for work now
        outgoing.put(b"d")
        outgoing.put(b"ef")
        assert await _read(peer, 3) == b"def"
        nursery.cancel_scope.cancel()


async def test_a_restart_drops_what_the_lost_session_had_queued() -> None:
    ours, peer = trio.testing.memory_stream_pair()
    outgoing = OutgoingFrames()
    outgoing.put(b"stale")
    outgoing.restart([b"pre", b"hello"])
    outgoing.put(b"!")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outgoing.write_to, ours)
        assert await _read(peer, 9) == b"prehello!"
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(0.05):
            extra = await peer.receive_some()
            raise AssertionError(f"nothing more was queued, yet {extra!r} arrived")
        nursery.cancel_scope.cancel()
