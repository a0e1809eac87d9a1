"""One request as the scheduler sees it."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from kvpool.cache.checks import check_few_tokens, check_tokens
from kvpool.cache.events import CacheUsageError
from kvpool.errors import KvpoolError


class SchedulerError(KvpoolError, ValueError):
    """A request or a step result the scheduler cannot accept."""


class Status(Enum):
    WAITING = "waiting"  # queued (new, or preempted and waiting to be recomputed)
    RUNNING = "running"  # admitted: holds pages in the manager
    FINISHED = "finished"  # max_new_tokens reached, EOS, or max_seq_len reached
    REJECTED = "rejected"  # can never fit: prompt too long, or pages even when alone


@dataclass(eq=False)
class Sequence:
    """A request: its prompt, what it generated so far, and how far its KV is computed.

    `num_computed` is the history: positions whose KV is written. Tokens
    `all_ids[num_computed:]` are pending; a running request with output and one
    pending token is decoding, otherwise it is (re)filling its prompt. Times
    (`arrival_s`, `first_token_s`, `finish_s`) belong to the caller (engine or
    simulator); the scheduler never reads a clock.
    """

    rid: int
    prompt_ids: list[int] | array[int]  # a list, or int64 ids packed (`array("q")`) and never changed after
    max_new_tokens: int
    eos_token_id: int | tuple[int, ...] | None = None  # one stop id or several (Llama 3 lists 3)
    arrival_s: float = 0.0
    salt: int | None = None
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached: int = 0  # tokens reused from the prefix cache at the last admission
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "length", "stop", "max_seq_len", or why it was rejected
    num_preemptions: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None
    prompt_len: int = field(init=False, repr=False)  # len(prompt_ids); the prompt never changes
    stop_ids: frozenset[int] = field(init=False, repr=False)  # eos_token_id as a set
    # `token_ids`, packed once and extended as output grows, and the output list it was extended from
    _ids: array[int] | None = field(default=None, init=False, repr=False)
    _ids_of: list[int] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.prompt_len = len(self.prompt_ids)
        eos = self.eos_token_id
        self.stop_ids = frozenset(() if eos is None else (eos,) if isinstance(eos, int) else eos)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens so far."""
        return self.prompt_len + len(self.output_ids)

    @property
    def all_ids(self) -> list[int]:
        """Prompt then output token ids, a new list (`token_ids` is the same
        ids kept packed)."""
        return [*self.prompt_ids, *self.output_ids]

    @property
    def token_ids(self) -> array[int]:
        """`all_ids` as one int64 array, kept between calls (read it, never
        write it): the prompt is packed and checked once, on the first call
        (`Scheduler.add` makes it); later calls extend the same array by the
        outputs appended since, so a step costs what it adds, not the
        request's length. A prompt given packed (`array("q")`) is that array
        itself until outputs extend it: copied then, so that the prompt stays
        the prompt (a long prompt's copy is most of what packing costs, and
        most requests are not asked for their ids again once they have
        output). Raises `CacheUsageError` for ids that are not integers in
        [0, 2**63)."""
        ids, out = self._ids, self.output_ids
        if ids is None or self._ids_of is not out or len(ids) > self.prompt_len + len(out):  # first, or output reset
            ids = self._ids = check_tokens(self.prompt_ids, "prompt ids", copy=False, rid=self.rid)
            self._ids_of = out
        done = len(ids) - self.prompt_len
        if done < len(out):
            if ids is self.prompt_ids:  # the caller's packed prompt: extended in a copy
                ids = self._ids = ids[:]
            ids.extend(check_few_tokens(out[done:], "output ids", rid=self.rid))
        return ids

    @property
    def num_pending(self) -> int:
        """Tokens whose KV is not written yet (1 for a decoding request)."""
        return self.num_tokens - self.num_computed

    @property
    def is_decoding(self) -> bool:
        """Whether it is running a decode step: output so far and one pending token (`decoding_of`)."""
        return bool(decoding_of((self,)))


def decoding_of(seqs: Iterable[Sequence]) -> list[Sequence]:
    """The requests of `seqs` that decode (`Sequence.is_decoding`, which asks
    this), in order: one pass, for the scheduler's per-step scan of its
    running requests (a property read per request costs a call from C)."""
    return [s for s in seqs if (out := len(s.output_ids)) and s.num_computed == s.prompt_len + out - 1]


def append_tokens(seq: Sequence, tokens: list[int], max_seq_len: int) -> bool:
    """Append sampled tokens to `seq` up to a stop id, `max_new_tokens` or
    `max_seq_len`; True (and `seq` marked finished, with its reason) when it ended."""
    out = seq.output_ids
    if len(tokens) == 1 and tokens[0] not in seq.stop_ids:  # the common decode step
        out.append(tokens[0])
        n = len(out)
        if n < seq.max_new_tokens and seq.prompt_len + n < max_seq_len:
            return False
        out.pop()
    room = min(seq.max_new_tokens - len(out), max_seq_len - seq.prompt_len - len(out))  # (num_tokens, unread)
    reason = None
    taken = tokens[:room]
    stop = seq.stop_ids
    # a run of decode steps' tokens is appended at once (`isdisjoint` reads every token, even against no stop id)
    if not stop or stop.isdisjoint(taken):
        out += taken
    else:
        for t in taken:
            out.append(t)
            if t in seq.stop_ids:
                reason = "stop"
                break
    if reason is None:
        if len(out) >= seq.max_new_tokens:
            reason = "length"
        elif seq.prompt_len + len(out) >= max_seq_len:
            reason = "max_seq_len"
        else:
            return False
    seq.status, seq.finish_reason = Status.FINISHED, reason
    return True


def check_sampled(seq: Sequence, tokens: list[int]) -> None:
    """SchedulerError, before `seq` changes, unless `tokens` (sampled for
    `seq`) are token ids: ints in [0, 2**63). Checked here, where they come
    in, so that the pages they fill take them as they are."""
    try:
        check_few_tokens(tokens, "sampled ids", rid=seq.rid)
    except CacheUsageError as e:
        raise SchedulerError(str(e)) from None


def check_request(seq: Sequence, max_seq_len: int) -> None:
    """SchedulerError for an empty prompt, a prompt of at least `max_seq_len`
    tokens (no room to generate) or `max_new_tokens` below 1."""
    if not seq.prompt_ids:
        raise SchedulerError(f"request {seq.rid}: empty prompt")
    if len(seq.prompt_ids) >= max_seq_len:
        raise SchedulerError(
            f"request {seq.rid}: prompt of {len(seq.prompt_ids)} tokens leaves no room to "
            f"generate within max_seq_len {max_seq_len}"
        )
    if seq.max_new_tokens < 1:
        raise SchedulerError(f"request {seq.rid}: max_new_tokens must be at least 1")
    try:
        seq.token_ids  # noqa: B018 - packed and checked here, at the boundary, once
    except CacheUsageError as e:
        raise SchedulerError(str(e)) from None
