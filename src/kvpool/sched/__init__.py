"""sched: the scheduler shared by the reference engine and the simulator
(FCFS admission, chunked prefill, preemption by recompute, CUDA-graph padding).
NumPy-free; drives a `kvpool.cache.KVCacheManager`."""

from kvpool.sched.scheduler import PagedCache, Scheduler, SchedulerError
from kvpool.sched.sequence import Sequence, Status
from kvpool.sched.step import Step

__all__ = ["PagedCache", "Scheduler", "SchedulerError", "Sequence", "Status", "Step"]
