"""Option parsing, without Spark."""

from __future__ import annotations

import pytest

from broky.spark.options import BrokyOptionError, ReadOptions, WriteOptions, parse_time


def test_options_are_found_whatever_the_case_spark_stored_them_in() -> None:
    # Spark hands options lowercased; the documented names are camelCase.
    options = ReadOptions.parse(
        {"broker": "127.0.0.1:1", "maxrowsperbatch": "7", "topicpattern": "o.*"}, streaming=True
    )
    assert options.max_rows_per_batch == 7
    assert options.selection.pattern is not None
    assert options.starting == "latest"  # a stream starts at the end by default
    assert ReadOptions.parse({"path": "/d"}).starting == "earliest"


def test_offsets_and_times() -> None:
    options = ReadOptions.parse(
        {
            "path": "/d",
            "startingoffsets": '{"orders": {"1": 5}}',
            "endingoffsets": "40",
            "starttime": "2026-01-01T00:00:00",
        }
    )
    assert options.starting == {"orders": {"1": 5}}
    assert options.ending == 40
    assert options.time_range == (parse_time("t", "1767225600000000000"), 2**63 - 1)
    assert parse_time("t", "2026-01-01T01:00:00+01:00") == 1_767_225_600_000_000_000


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({}, False, "give a data directory"),
        ({"path": "/d", "broker": "h:1"}, False, "not both"),
        ({"path": "/d"}, True, "streaming reads need option broker"),
        ({"path": "/d", "startingoffsets": "soon"}, False, "startingOffsets must be"),
        ({"path": "/d", "startingoffsets": "latest"}, False, "reads nothing"),
        ({"path": "/d", "partitions": "1,x"}, False, "partitions must be"),
        ({"path": "/d", "topicpattern": "("}, False, "not a valid regex"),
        ({"path": "/d", "starttime": "yesterday"}, False, "ISO 8601"),
        ({"broker": "h:1", "maxrowsperbatch": "-1"}, True, "at least 0"),
        ({"broker": "h:1", "endingoffsets": "5"}, True, "batch reads only"),
        ({"broker": "h:1", "failondataloss": "maybe"}, True, "true or false"),
        ({"path": "/d", "pushfilters": "yes"}, False, "pushFilters must be true or false"),
        ({"broker": "h:1", "pushfilters": "true"}, True, "pushFilters is for batch reads only"),
    ],
)
def test_bad_options_say_which_and_why(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(BrokyOptionError, match=message):
        ReadOptions.parse(options, streaming=streaming)


def test_write_options_stage_under_the_checkpoint_of_a_stream() -> None:
    options = WriteOptions.parse(
        {"broker": "h:1", "checkpointlocation": "file:/ck"}, streaming=True
    )
    assert options.staging_dir == "/ck/broky-sink"
    with pytest.raises(BrokyOptionError, match="checkpointLocation or stagingLocation"):
        WriteOptions.parse({"broker": "h:1"}, streaming=True)
    with pytest.raises(BrokyOptionError, match="option broker"):
        WriteOptions.parse({}, streaming=False)
