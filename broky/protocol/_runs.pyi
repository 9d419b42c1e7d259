class EncodedRun:
    key: bytes
    count: int
    chunk: bytes
    def __init__(self, key: bytes, count: int, chunk: bytes) -> None: ...
