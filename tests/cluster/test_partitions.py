"""Real link partitions (network namespaces) under acked load: the
Jepsen-style run of tests/cluster/jepsen.py with the faults of
tests/cluster/net_faults.py only.

etcd and three ``broky serve`` nodes each run in a namespace of their own
on one bridge; clients publish from the root namespace. 12 faults (the
kills and pauses of tests/cluster/test_replication.py add 20 more;
``scripts/jepsen_replication.py --netns`` runs any number): a
follower cut off from its peers, a leader isolated from etcd and peers
(a probe keeps publishing to it), a node's link down. At the end every
acked publish is on every replica at its offset, replicas agree byte for
byte, per-client order holds, and no isolated leader acked anything after
its lease was gone. Skipped (with the reason) where namespaces cannot be
made; CI runs as root on Debian, where they can.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.cluster import jepsen, net_faults
from tests.cluster.netns import NetnsUnavailable

CYCLES = 12


@pytest.mark.slow
@pytest.mark.usefixtures("netns_cleanup")
async def test_link_partitions_lose_no_acked_publish(tmp_path: Path) -> None:
    try:
        with trio.fail_after(240):
            report = await jepsen.run_partitioned(tmp_path, CYCLES)
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces unavailable here (needs root and veth/bridge): {exc}")
    print(report.summary())
    assert report.verdict is not None
    assert report.verdict.ok, report.verdict
    assert not report.late_acks, report.late_acks
    assert report.cycles == CYCLES
    assert set(report.faults) == set(net_faults.NET_FAULTS)
    assert len(report.acked) > 200
