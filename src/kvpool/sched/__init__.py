"""sched: the scheduler shared by the reference engine and the simulator
(FCFS admission, chunked prefill, preemption by recompute or by suspension to a
cold tier, CUDA-graph padding).
NumPy-free; drives a `kvpool.cache.KVCacheManager`."""

from kvpool.sched.paged_cache import PagedCache
from kvpool.sched.runs import DecodeRun, advance_decodes, decode_run_limit
from kvpool.sched.scheduler import Scheduler
from kvpool.sched.sequence import SchedulerError, Sequence, Status
from kvpool.sched.session import Session, session
from kvpool.sched.step import Step

__all__ = [
    "DecodeRun",
    "PagedCache",
    "Scheduler",
    "SchedulerError",
    "Sequence",
    "Session",
    "Status",
    "Step",
    "advance_decodes",
    "decode_run_limit",
    "session",
]
