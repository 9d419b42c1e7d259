"""Keys and patterns must be text (docs/protocol.md section 8), over a real socket.

A raw socket sends what the library refuses to: bytes that are not UTF-8 and
keys with NUL. The broker answers each with a stream error and keeps the
connection; the library refuses the same keys before sending anything.
"""

from __future__ import annotations

import pytest
import trio

import broky
from broky import Broker, ErrorCode, Message
from broky.cli import main
from broky.protocol.errors import LocalProtocolError
from broky.protocol.frames import (
    Deliver,
    Error,
    Frame,
    Ping,
    Pong,
    Publish,
    Subscribe,
    Subscribed,
)
from broky.protocol.message import decode_run
from tests.conftest import raw_connection, raw_run

BAD_KEYS = (b"good.\xff\xfe", b"good.with\x00nul", b"good.\xc3", b"good.tab\there")


async def test_raw_keys_and_patterns_that_are_not_text_get_stream_errors(broker: Broker) -> None:
    with trio.fail_after(10):
        async with raw_connection(broker) as raw:
            await raw.handshake()
            await raw.send_frame(Subscribe(1, b"good.>"))
            assert await raw.receive_frame() == Subscribed(1)
            for stream, pattern in enumerate((b"bad.\xff\xfe", b"good.\x00.>", b"a b"), 2):
                await raw.send_frame(Subscribe(stream, pattern))
                error = await raw.receive_frame()
                assert isinstance(error, Error)
                assert (error.code, error.stream) == (ErrorCode.INVALID_PATTERN, stream)

            runs = [raw_run(b"good.first", b"1")]
            for key in BAD_KEYS:
                runs += [raw_run(key, b"bad"), raw_run(b"good.next", b"2")]
            await raw.send_frame(Publish(7, tuple(runs)))
            await raw.send_frame(Ping(1))
            frames: list[Frame] = []
            while Pong(1) not in frames or len(messages(frames)) < 1 + len(BAD_KEYS):
                frames.append(await raw.receive_frame())

            errors = [frame for frame in frames if isinstance(frame, Error)]
            assert [(e.code, e.stream) for e in errors] == [(ErrorCode.INVALID_KEY, 7)] * len(
                BAD_KEYS
            )
            assert [m.key for m in messages(frames)] == ["good.first"] + ["good.next"] * len(
                BAD_KEYS
            )
            # The connection is still up and still routes.
            await raw.send_frame(Publish(7, (raw_run(b"good.last", b"3"),)))
            frame = await raw.receive_frame()
            assert [m.key for m in messages([frame])] == ["good.last"]


def messages(frames: list[Frame]) -> list[Message]:
    return [
        message
        for frame in frames
        if isinstance(frame, Deliver)
        for run in frame.runs
        for message in decode_run(run)
    ]


@pytest.mark.parametrize("text", ["good.with\x00nul", "good.\udcff", "good. space", "good.\u2028"])
async def test_the_client_refuses_the_same_keys_before_sending(address: str, text: str) -> None:
    with trio.fail_after(10):
        async with broky.connect(address) as client:
            async with client.subscription("good.>") as subscription:
                with pytest.raises(LocalProtocolError) as caught:
                    await client.publish(text, b"bad")
                assert caught.value.code is ErrorCode.INVALID_KEY
                with pytest.raises(LocalProtocolError) as caught:
                    await client.subscribe(text + ".>")
                assert caught.value.code is ErrorCode.INVALID_PATTERN
                await client.publish("good.after", b"ok")
                async for message in subscription:
                    assert (message.key, message.payload) == ("good.after", b"ok")
                    break
            assert not client.closed


@pytest.mark.parametrize(("command", "text"), [("pub", "bad key"), ("sub", "bad.\x00.>")])
def test_the_cli_refuses_them_as_a_usage_error(
    command: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main([command, text, "--address", "127.0.0.1:1"])
    assert caught.value.code == 2
    assert "control or whitespace" in capsys.readouterr().err
