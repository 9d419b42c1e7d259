from broky.protocol.frames import Buffer
from broky.protocol.message import Message

def uniform_messages(
    messages: Buffer,
    count: int,
    size: int,
    prefix: bytes,
    key: str,
    ts_broker: int,
    partition: int,
    base_offset: int,
    message_type: type[Message],
) -> list[Message] | None: ...
