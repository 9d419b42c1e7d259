"""Leader -> follower log replication of replicated durable topics (issue 15).

Consensus stays in etcd (broky.cluster): who leads a partition, at which
epoch, with which in-sync replicas. This package moves the data and
enforces the epochs: followers fetch whole runs from the leader, fsync
them before their next fetch reports them durable, and truncate by the
leader-epoch rule after a failover; the leader acks ``acks = "all"``
publishes only below the high watermark (broky.cluster.isr).
"""
