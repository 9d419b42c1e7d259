"""A partition leader's in-sync replicas and high watermark, as data.

Kafka's ISR model, with the fixes its KIPs added, sans I/O: the replication
layer feeds it what happened (the leader appended or fsynced, a follower
acknowledged a durable offset, time passed, an ISR change was committed to
etcd or failed) and asks it what follows (the high watermark, which
publishes to answer, which ISR change to propose).

The rules, each the answer to a known failure:

1. **A replica counts only for what it has fsynced.** Acks carry durable
   offsets, never written ones (Jepsen, NATS 2.12.1: acked data lost when
   replicas acknowledged unsynced writes).
2. **HW = min(durable offset) over the maximal ISR**: the committed ISR plus
   any pending addition. A removal counts only once etcd has committed it
   (KIP-497): until then the removed follower still holds the HW back, so a
   deposed leader that cannot commit its shrink can never ack past what the
   next leader (chosen from the committed ISR) has.
3. **Acks of another leader epoch, or of another life of the node, are
   ignored** (Kafka's leader epoch on fetches; KIP-903 node epochs): acks
   sent to a previous leader can never advance this one's HW.
4. **A follower is added back only once it holds everything below the
   HW**, so adding it never lowers the HW; one that has not caught up to
   the leader's log end for ``replica_lag_max`` is proposed for removal.
5. **A replica that leaves the ISR, or the replica set, is forgotten**:
   what it held may be gone (a replica dropped by a move deletes its copy,
   broky.cluster.moves), so it is known again only from its next acks, and
   the fsynced end a follower outside the ISR reports is taken as it is.
6. **``acks = "all"`` needs ``min_insync`` replicas in the committed ISR**,
   checked before appending (NOT_ENOUGH_REPLICAS) and again when the HW
   covers the publish (NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank
   below it meanwhile: the data is safe on the smaller ISR but was not
   promised to be).

One instance serves one leader epoch of one partition; a new epoch starts
a new instance. Offsets are exclusive ends: "durable 10" means offsets 0..9.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Sequence

import attrs

from broky.cluster.state import IsrEntry

#: Default for ``replica_lag_max``: a follower that has not caught up for
#: this long leaves the ISR (Kafka's replica.lag.time.max.ms is 30 s; a
#: broker on one LAN can be stricter, and a smaller ISR acks sooner).
DEFAULT_REPLICA_LAG_MAX = 5.0

#: Default ``min_insync``: with 3 replicas, an acked publish is then on at
#: least 2 disks (Kafka's advice for RF 3).
DEFAULT_MIN_INSYNC = 2


class Acks(enum.Enum):
    """How durable a publish must be before it is acknowledged."""

    #: fsynced by every member of the ISR (at least ``min_insync`` of them).
    ALL = "all"
    #: fsynced by the leader alone: a failover can lose it.
    LEADER = "leader"


class Outcome(enum.Enum):
    ACKED = "acked"
    #: The committed ISR is smaller than ``min_insync``: refused before appending.
    NOT_ENOUGH_REPLICAS = "not_enough_replicas"
    #: Stored, but the ISR shrank below ``min_insync`` before it was acked.
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = "not_enough_replicas_after_append"


class IsrRuleError(ValueError):
    """A caller broke this machine's contract (a bug, not a peer's fault)."""


@attrs.frozen
class IsrSettings:
    min_insync: int = DEFAULT_MIN_INSYNC
    replica_lag_max: float = DEFAULT_REPLICA_LAG_MAX


@attrs.frozen
class Answer:
    """What to tell the publisher whose ``token`` was given to ``wait``."""

    token: object
    outcome: Outcome


@attrs.define
class _Follower:
    """What the leader knows of one follower, in one life (a life that
    ended keeps its last durable offset: what it fsynced stays fsynced)."""

    durable: int = 0
    #: When the follower last held everything the leader had (Kafka's
    #: lastCaughtUpTime); starts at the leader's start, so a follower that
    #: never answers is removed after replica_lag_max.
    caught_up_at: float = 0.0
    #: The leader's log end and the time at this follower's previous ack.
    previous_log_end: int = 0
    previous_ack_at: float = 0.0


class LeaderIsr:
    """The ISR and HW of one partition while this node leads it at ``epoch``."""

    def __init__(
        self,
        leader: IsrEntry,
        epoch: int,
        replicas: Sequence[str],
        committed_isr: Iterable[IsrEntry],
        log_end: int,
        high_watermark: int,
        now: float,
        settings: IsrSettings = IsrSettings(),
    ) -> None:
        self.leader = leader
        self.epoch = epoch
        self.replicas = tuple(replicas)
        self.settings = settings
        self.committed_isr = tuple(committed_isr)
        if leader not in self.committed_isr:
            raise IsrRuleError(f"the leader {leader} is not in the ISR {self.committed_isr}")
        if not 0 <= high_watermark <= log_end:
            raise IsrRuleError(f"high watermark {high_watermark} outside 0..{log_end}")
        #: The leader's own log: written and fsynced ends.
        self.log_end = log_end
        self.leader_durable = log_end
        self.high_watermark = high_watermark
        #: The ISR change proposed to etcd and not yet answered.
        self.pending_isr: tuple[IsrEntry, ...] | None = None
        #: Per follower life, and the newest life seen of each node.
        self._followers: dict[IsrEntry, _Follower] = {}
        self._lives: dict[str, int] = {}
        #: The newest life ever seen of each node, kept when its follower is
        #: forgotten: a late ack of an older life must still be ignored then
        #: (else it would be taken for a new life with that life's data).
        self._newest_life: dict[str, int] = {}
        for entry in self.committed_isr:
            if entry != leader:
                # An ISR member had everything below the HW when it was added.
                self._followers[entry] = _Follower(high_watermark, now, log_end, now)
                self._lives[entry[0]] = entry[1]
                self._newest_life[entry[0]] = entry[1]
        self._waiting: deque[tuple[int, Acks, object]] = deque()

    # -- inputs ---------------------------------------------------------------

    def check_publish(self, acks: Acks) -> Outcome | None:
        """Before appending: NOT_ENOUGH_REPLICAS if ``acks`` cannot be met
        now, else None (go ahead)."""
        if acks is Acks.ALL and len(self.committed_isr) < self.settings.min_insync:
            return Outcome.NOT_ENOUGH_REPLICAS
        return None

    def appended(self, end: int, token: object, acks: Acks) -> None:
        """The leader wrote records up to ``end`` (exclusive); answer
        ``token`` when they are durable enough for ``acks``."""
        if end < self.log_end:
            raise IsrRuleError(f"log end went back from {self.log_end} to {end}")
        self.log_end = end
        self._waiting.append((end, acks, token))

    def synced(self, end: int) -> None:
        """The leader fsynced its log up to ``end``."""
        if not self.leader_durable <= end <= self.log_end:
            raise IsrRuleError(f"synced {end} outside {self.leader_durable}..{self.log_end}")
        self.leader_durable = end
        self._advance()

    def follower_ack(
        self, node: str, node_epoch: int, epoch: int, durable: int, now: float
    ) -> None:
        """Follower ``node`` (in life ``node_epoch``) has fsynced everything
        below ``durable``, replicating leader epoch ``epoch``. Acks of other
        epochs or lives, and of nodes that are not replicas, are ignored."""
        if epoch != self.epoch or node not in self.replicas or node == self.leader[0]:
            return
        durable = min(durable, self.log_end)  # a follower cannot hold more than we wrote
        if node_epoch < self._newest_life.get(node, node_epoch):
            return  # a late ack of a life that has ended
        entry = (node, node_epoch)
        follower = self._followers.get(entry)
        if follower is None:
            # A new life (or a replica not in the ISR): known from scratch.
            # The ISR entry of a previous life keeps what that life fsynced
            # but is never renewed, so propose() drops it.
            follower = _Follower(0, -float("inf"), self.log_end, now)
            self._followers[entry] = follower
            self._lives[node] = self._newest_life[node] = node_epoch
        # An ISR member's fsynced end only grows, so a late ack must not
        # lower it (the HW never goes back); outside the ISR the latest
        # report is the truth, even if lower (its copy was deleted).
        in_isr = entry in self.maximal_isr()
        follower.durable = max(follower.durable, durable) if in_isr else durable
        if follower.durable >= self.log_end:
            follower.caught_up_at = now
        elif follower.durable >= follower.previous_log_end:
            follower.caught_up_at = max(follower.caught_up_at, follower.previous_ack_at)
        follower.previous_log_end = self.log_end
        follower.previous_ack_at = now
        self._advance()

    def isr_committed(self, isr: Iterable[IsrEntry]) -> None:
        """etcd accepted the ISR change (the pending proposal)."""
        isr = tuple(isr)
        if self.leader not in isr:
            raise IsrRuleError(f"committed ISR {isr} lacks the leader {self.leader}")
        for entry in isr:
            if entry not in self.committed_isr and self.durable_of(entry) < self.high_watermark:
                raise IsrRuleError(f"{entry} joins the ISR without the data below the HW")
        for entry in self.committed_isr:
            if entry not in isr:
                self._forget(entry)
        self.committed_isr = isr
        self.pending_isr = None
        self._advance()

    def replicas_changed(self, replicas: Iterable[str]) -> None:
        """etcd's replica set changed (a move added or dropped replicas):
        acks from added ones count from now on; dropped ones that are not in
        the ISR any more are forgotten (rule 5)."""
        self.replicas = tuple(replicas)
        members = {node for node, _ in self.maximal_isr()}
        for entry in list(self._followers):
            if entry[0] not in self.replicas and entry[0] not in members:
                self._forget(entry)

    def _forget(self, entry: IsrEntry) -> None:
        self._followers.pop(entry, None)
        if self._lives.get(entry[0]) == entry[1]:
            del self._lives[entry[0]]

    def hold(self, entries: Iterable[IsrEntry]) -> None:
        """Count ``entries`` as pending additions (the HW waits for them)
        while another partition of the vbucket proposes them to etcd: the
        vbucket has one ISR, so each of its partitions must hold them back
        from its HW before etcd names them in sync (broky.replication.
        vbucket_isr). Each must hold everything below the HW already;
        ``isr_committed`` or ``isr_failed`` ends the hold."""
        added = tuple(entry for entry in entries if entry not in self.committed_isr)
        if added and self.pending_isr is not None:
            raise IsrRuleError("an ISR change is already pending")
        for entry in added:
            if self.durable_of(entry) < self.high_watermark:
                raise IsrRuleError(f"{entry} lacks data below the HW")
        if added:
            self.pending_isr = self.committed_isr + added
            self._advance()

    def narrow(self, proposal: Iterable[IsrEntry]) -> None:
        """Replace the pending proposal by ``proposal``, which drops some of
        its additions (another partition of the vbucket refused them); the
        HW can only go up."""
        pending = self.pending_isr
        proposal = tuple(proposal)
        if pending is None or not set(proposal) <= set(pending):
            raise IsrRuleError(f"{proposal} does not narrow the pending {pending}")
        self.pending_isr = proposal
        self._advance()

    def isr_failed(self) -> None:
        """The ISR change was not committed (a race, or this leader was
        fenced: then this instance must be dropped)."""
        self.pending_isr = None

    # -- outputs --------------------------------------------------------------

    def maximal_isr(self) -> tuple[IsrEntry, ...]:
        """The members the HW waits for: committed plus pending additions."""
        pending = self.pending_isr or ()
        return self.committed_isr + tuple(e for e in pending if e not in self.committed_isr)

    def propose(self, now: float) -> tuple[IsrEntry, ...] | None:
        """The ISR to write to etcd now (None: no change, or one is pending).
        The caller CASes it and reports ``isr_committed`` or ``isr_failed``."""
        if self.pending_isr is not None:
            return None
        proposal = self._candidate(now)
        if proposal is None:
            return None
        self.pending_isr = proposal
        self._advance()
        return proposal

    def steady(self, now: float) -> bool:
        """Whether ``propose(now)`` would propose nothing, without its side
        effects: a leader's periodic review asks this first and takes its
        vbucket's lock only for a change (broky.replication.service)."""
        return self.pending_isr is not None or self._candidate(now) is None

    def _candidate(self, now: float) -> tuple[IsrEntry, ...] | None:
        """The ISR the rules give now, None if it is the committed one."""
        lag_max = self.settings.replica_lag_max
        keep = [self.leader]
        for entry in self.committed_isr:
            if entry == self.leader:
                continue
            follower = self._followers.get(entry)
            if self._lives.get(entry[0]) != entry[1] or follower is None:
                continue  # that life ended: its acks no longer come
            if entry[0] not in self.replicas:
                continue  # dropped by a move
            lagging = follower.durable < self.log_end and now - follower.caught_up_at > lag_max
            if not lagging:
                keep.append(entry)
        members = {node for node, _ in keep}
        for node, life in sorted(self._lives.items()):
            entry = (node, life)
            follower = self._followers.get(entry)
            if follower is None:
                continue
            caught_up = follower.durable >= self.log_end or now - follower.caught_up_at <= lag_max
            if (
                node in self.replicas
                and node not in members
                and entry not in self.committed_isr
                and follower.durable >= self.high_watermark
                and caught_up
            ):
                keep.append(entry)
        proposal = tuple(keep)
        return None if set(proposal) == set(self.committed_isr) else proposal

    def answers(self) -> list[Answer]:
        """Publishes whose fate is now known, in log order (each once; an
        ``acks = "leader"`` publish behind an ``"all"`` one waits for it)."""
        done = []
        while self._waiting:
            end, acks, token = self._waiting[0]
            if acks is Acks.LEADER:
                if end > self.leader_durable:
                    break
                done.append(Answer(token, Outcome.ACKED))
            else:
                if end > self.high_watermark:
                    break
                enough = len(self.committed_isr) >= self.settings.min_insync
                outcome = Outcome.ACKED if enough else Outcome.NOT_ENOUGH_REPLICAS_AFTER_APPEND
                done.append(Answer(token, outcome))
            self._waiting.popleft()
        return done

    def follower_lags(self) -> dict[str, int]:
        """Messages each replica (the leader aside) is behind the leader's
        log end, by its newest life's fsynced end (a replica never heard
        from in this epoch: the whole log end). For metrics and status."""
        lags = {}
        for node in self.replicas:
            if node == self.leader[0]:
                continue
            life = self._lives.get(node)
            follower = None if life is None else self._followers.get((node, life))
            lags[node] = self.log_end - (0 if follower is None else follower.durable)
        return lags

    def durable_of(self, entry: IsrEntry) -> int:
        """What ``entry`` (a node in one life) is known to have fsynced."""
        if entry == self.leader:
            return self.leader_durable
        follower = self._followers.get(entry)
        return 0 if follower is None else follower.durable

    def _advance(self) -> None:
        # Never lower: every input that could lower the minimum is refused
        # (IsrRuleError) or cannot happen (durable offsets only grow; a
        # member joins only holding everything below the HW). The property
        # tests check that the minimum itself never goes back.
        self.high_watermark = min(self.durable_of(entry) for entry in self.maximal_isr())
