"""What the operator keeps, in three parts: its configuration (fixed at start), its runtime (the HTTP
session, the election, the context loops run in) and its caches (the watch cache, the departed
pods, the node index), and one `JobState` per job, keyed by (namespace, name), which `forget`
drops with everything else kept of that job.

Shared across handlers through kopf's memo (never module globals).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from psoperator.contract import DEFAULT_PROGRESS_PORT, RejectedReport
from psoperator.control.chief_client import Refusals
from psoperator.control.chief_key import ChiefKey
from psoperator.control.decision_cache import Settled
from psoperator.control.leader import Election, Elector
from psoperator.faults import Fault
from psoperator.kube import Kube
from psoperator.metrics.registry import Metrics
from psoperator.observe.cache import JobKey, WatchCache
from psoperator.observe.views import PodView
from psoperator.policies.planned_stop import CheckpointOutcome

DEPARTED_LIMIT = 4096


@dataclass(frozen=True)
class Config:
    """How the operator runs, from its command line."""

    cluster_domain: str = "cluster.local"
    operator_namespace: str | None = None  # the only one that may read the chiefs' progress port
    # The labels of the operator's own pods there, (name, value) sorted: the only ones that may.
    operator_pod_labels: tuple[tuple[str, str], ...] = ()
    resync_seconds: float = 10.0
    # The unwoken reconciles of all jobs together, at most, on average: when the jobs' resyncs would
    # come more often, every resync stretches by the same factor (1,000 running jobs at 20: every
    # 50 s; 100 running and 900 finished ones: still every 10 s, the finished ones costing 3 a
    # second). Events still wake a job at once; a plan's own timer (a TTL, a deadline) still comes
    # on time.
    resyncs_per_second: float = 20.0
    # Finished and suspended jobs: only their TTL and a resume need them, and both wake them.
    idle_resync_seconds: float = 300.0
    # The longest a job goes without a fresh read of its children (see observe/cache.py)...
    fresh_read_seconds: float = 600.0
    # ...unless the jobs' periodic fresh reads together would pass this many a second: then each
    # job's stretches to fit (1,000 jobs at 0.5: every 2,000 s). Each is 7 requests and a decision.
    # They go one at a time, this far apart at least, so jobs that came due together (read together
    # at a start) are read in turn, not in a burst; reading fresh before acting is not paced.
    fresh_reads_per_second: float = 0.5
    progress_port: int = DEFAULT_PROGRESS_PORT
    # The key the chiefs' tokens are derived from; None: no token is sent and no Secret made.
    chief_key: ChiefKey | None = None
    kueue: bool = True  # queue the jobs labelled for it where Kueue is installed (control/kueue.py)
    faults: frozenset[Fault] = frozenset()  # test hooks (faults.py); none in production

    def fresh_read_interval(self, jobs: int) -> float:
        """How long each of `jobs` jobs goes before its periodic fresh read is due."""
        return max(self.fresh_read_seconds, jobs / self.fresh_reads_per_second)


@dataclass
class JobState:
    """All the operator keeps of one job besides the watch cache's copy of its objects."""

    # The job handler's logger. Without leader election, or while this replica leads, the job has
    # a loop; the others keep the job (with its logger) to start its loop when they take over.
    logger: Any
    loop: asyncio.Task[None] | None = None
    wakeup: asyncio.Event | None = None  # set by the watches to reconcile now
    idle: bool = False  # the last reconcile found it finished or suspended
    # The inputs with which its children were last found as rendered (control/reconciler.py), or as
    # near as they can be: what is left conflicts or was refused, and was told.
    in_sync: tuple[Any, ...] | None = None
    # The NameConflict and ChildRejected warnings its last changes told, by child ("Kind/name"), as
    # (reason, message): each is told once while it lasts, not at every resync; the next plan says
    # with them why a NetworkPolicy is missing.
    unmade: dict[str, tuple[str, str]] = field(default_factory=dict)
    refusals: Refusals | None = None  # its chief's refusals of the progress port in a row
    # Its chief's latest rejected report, told once while the chief keeps giving it.
    rejected: RejectedReport | None = None
    # Its last status write was refused (409): the job changed since the version it was decided
    # from, and its next reconcile reads it fresh before deciding.
    stale: bool = False
    # The chief's answer to the latest checkpoint asked before a planned stop, for the next reconcile.
    checkpoint_outcome: CheckpointOutcome | None = None
    # Its last decision if it changed nothing: it stands while nothing it was decided from changes.
    settled: Settled | None = None
    # When (time.monotonic()) its reconciles last began a full read of it (None: none yet, a new
    # loop; -inf: one is due, at its turn), began a read of its pods, and wrote its status.
    read_at: float | None = None
    pods_read_at: float = -math.inf
    written_at: float = -math.inf


@dataclass
class OperatorState:
    kube: Kube
    metrics: Metrics
    config: Config = field(default_factory=Config)
    # --- runtime
    session: aiohttp.ClientSession | None = None
    # With leader election (several replicas), only the Lease's holder runs the jobs' loops.
    election: Election | None = None
    elector: Elector | None = None
    trim_task: asyncio.Task[None] | None = None  # control/memory_trim.py
    # The context every loop runs in: a copy of the first job handler's, where kopf keeps its event
    # posting (the operator's one queue; a loop without it fails at its first event). Not each job
    # handler's own: that holds the event's whole job for as long as the loop runs.
    context: contextvars.Context | None = None
    # --- caches
    cache: WatchCache = field(default_factory=WatchCache)
    # Node name -> its Ready condition, from kopf's node index (a watch, no reads per reconcile);
    # None until kopf hands the index over: an empty index would make every node look deleted.
    nodes: Mapping[str, Any] | None = None
    # Last state of pods that ended, as the watch showed it (uid -> view), newest last.
    departed: OrderedDict[str, PodView] = field(default_factory=OrderedDict)
    # Last state the watch showed of pods a fresh read found gone before the watch said how they
    # ended (uid -> view): what a reconcile goes by once it has waited for the watch (observe).
    vanished: OrderedDict[str, PodView] = field(default_factory=OrderedDict)
    # Whether Kueue's Workload API is served (control/kueue.py), and when that was last asked.
    kueue_served: bool = False
    kueue_checked_at: float = -math.inf
    # --- the jobs
    jobs: dict[JobKey, JobState] = field(default_factory=dict)
    # The resyncs' stretch as last counted (control/loop.pace_stretch): (jobs then, when, stretch).
    pace: tuple[int, float, float] = (0, -math.inf, 1.0)
    # When the next periodic fresh read may go (may_read_periodically).
    next_periodic_read: float = -math.inf

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.leading

    def may_act(self) -> bool:
        """Whether a loop may act now: no election, or the Lease renewed within its renew deadline."""
        return self.elector is None or self.elector.holds()

    def job(self, key: JobKey, logger: Any) -> JobState:
        """The job's state, made at its first sight."""
        return self.jobs.setdefault(key, JobState(logger))

    def fresh_read_interval(self) -> float:
        """How long a job goes before its periodic fresh read is due now (Config.fresh_reads_per_second)."""
        return self.config.fresh_read_interval(len(self.jobs))

    def may_read_periodically(self, now: float) -> bool:
        """Whether a job due for its periodic fresh read may have it at `now`, taking the turn if so:
        those reads go at least 1 / Config.fresh_reads_per_second apart. A job refused stays due
        and asks again at its next reconcile."""
        if now < self.next_periodic_read:
            return False
        self.next_periodic_read = now + 1 / self.config.fresh_reads_per_second
        return True

    def looping(self) -> list[JobState]:
        """The jobs whose loop runs."""
        return [job for job in self.jobs.values() if job.loop is not None]

    def forget(self, key: JobKey) -> None:
        """The job is gone: nothing of it stays, neither its state, its cached objects nor its series.
        Its loop, if any, is stopped by whoever calls this (or is the caller)."""
        self.jobs.pop(key, None)
        self.cache.forget(key)
        self.metrics.forget(*key)
        self.metrics.jobs_managed.set(len(self.looping()))

    def remember_departed(self, view: PodView) -> None:
        _remember(self.departed, view)

    def remember_vanished(self, views: list[PodView]) -> None:
        for view in views:
            _remember(self.vanished, view)


def _remember(store: OrderedDict[str, PodView], view: PodView) -> None:
    """Keep the view under its uid, newest last, at most DEPARTED_LIMIT of them."""
    store[view.uid] = view
    store.move_to_end(view.uid)
    while len(store) > DEPARTED_LIMIT:
        store.popitem(last=False)
