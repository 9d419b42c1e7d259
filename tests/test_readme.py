"""The README's Python examples run as written (the client one against a live broker)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import broky

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _run(source: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_readme_has_the_two_examples() -> None:
    assert len(BLOCKS) == 2


async def test_client_example_against_a_live_broker(broker: broky.Broker, address: str) -> None:
    source = BLOCKS[0].replace("127.0.0.1:7722", address)
    assert source != BLOCKS[0]
    # The example blocks inside trio.run, so it runs in a child process while
    # this test's broker serves it.
    output = await trio.to_thread.run_sync(_run, source)
    assert output.startswith("orders.eu.created b'{\"id\": 1}'")


@pytest.mark.parametrize("index", [1])
def test_embedding_example(index: int) -> None:
    output = _run(BLOCKS[index])
    assert "key='jobs.resize', payload=b'img-42'" in output
    assert "BrokerStatistics(" in output
