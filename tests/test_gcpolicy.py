"""A broker process collects cycles rarely and skips what startup allocated."""

from __future__ import annotations

import subprocess
import sys

from broky.gcpolicy import OLDER_THRESHOLDS, YOUNG_THRESHOLD


def test_tune_for_broker_sets_thresholds_and_freezes_startup_objects() -> None:
    # In a child process: the settings are process-wide, the test run's own stay.
    script = (
        "import gc; from broky.gcpolicy import tune_for_broker; tune_for_broker(); "
        "print(*gc.get_threshold(), gc.get_freeze_count() > 0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == [str(YOUNG_THRESHOLD), *map(str, OLDER_THRESHOLDS), "True"]
