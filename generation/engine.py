"""The one decoding loop: every batch size, every mode (plain, draft model, prompt lookup), greedy or
sampled, rows joining as others leave (continuous batching). Token ids in, token ids out.

A round, for the B rows in the batch (gpt-fast's ``speculative_decode``, batched):
  1. choose k (``choose_draft_length``: the most expected tokens per second from the costs at this B
     and each row's acceptance, in mode auto with its proposer, ``Proposer.row_acceptance``; 0 = plain);
  2. the proposer guesses up to k tokens per row (none when k = 0); each row's cap (its room before
     max_new_tokens, its draft_limit) is decided here once: the drafts verified are min(k, count, cap);
  3. the target verifies [pending, d_1..d_k] of every row in one forward, (B, k+1) → logits;
  4. ``verify_drafts`` keeps a_r drafts and one target token per row (the round's one host sync); the
     proposer advances with them and with each row's capped drafts (``Proposer.advance``);
  5. rows that hit an EOS id, a stop sequence or max_new_tokens leave; queued requests are prefilled
     together (ragged, right-padded) into the freed slots at the next step.
Every ``probe_every``-th round decodes plainly (k = 0): those rounds time plain decoding at the same
batch size and rows, for the measured speedup (``EngineStats``).
Memory (``kv_budget``): rows are admitted while the K/V caches fit GENJOB_KV_CACHE_BYTES and, on CUDA,
the device's room. An out-of-memory error halves the batch (rows go back to the queue with their tokens,
nothing fails); it grows back as rows leave. ``release`` gives the caches back (a chunk's end).
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator

import torch
from transformers import PreTrainedModel

from genjob.generation.context_fit import context_problem
from genjob.generation.cost_timing import measure_grid
from genjob.generation.costs import CostModel, choose_draft_length
from genjob.generation.engine_stats import EngineStats, acceptance_estimates
from genjob.generation.forward import cache_shapes, forward_rows, max_positions, to_device
from genjob.generation.kv_budget import Admission, BatchRoom, Held, device_room, give_back, plan_admission
from genjob.generation.proposers import BatchView, Proposer
from genjob.generation.requests import Finished, Request, Row, RowStats
from genjob.generation.sampling import RowSampling, first_tokens, verify_drafts
from genjob.generation.slot_cache import SlotCache

log = logging.getLogger(__name__)

# While k = 0 pays best, every 16th such round still tries k = 1 to keep the estimates fresh. Counted
# apart from the probe rounds: counting every round, a probe every 4th, 8th or 16th round (a
# baseline fraction of 1/4, 1/8, 1/16) fell on each 16th round and no round ever explored.
EXPLORE_EVERY = 16


class Engine:
    """Decodes ``Request``s with ``target`` and an optional ``proposer``, up to ``max_rows`` at a time.

    ``k_max`` bounds the draft length; ``fixed_k`` pins it (a constant γ: seeded sampled rows then
    repeat exactly at any batch size). ``costs`` drives the choice of k: a proposer's engine measures
    the thorough grid if none is given; plain decoding needs none.
    ``kv_budget_bytes`` bounds the K/V caches (on CUDA the device's room too, ``room``): see kv_budget.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        proposer: Proposer | None = None,
        *,
        max_rows: int = 16,
        k_max: int = 8,
        fixed_k: int | None = None,
        costs: CostModel | None = None,
        probe_every: int = 0,
        kv_budget_bytes: int | None = None,
    ) -> None:
        if max_rows < 1 or k_max < 0 or (fixed_k is not None and not 0 <= fixed_k <= k_max):
            raise ValueError(
                f"need max_rows >= 1 and 0 <= fixed_k <= k_max, got {max_rows}, {fixed_k}, {k_max}"
            )
        self.target, self.proposer = target, proposer
        self.k_max = k_max if proposer is not None else 0
        self.fixed_k = fixed_k if proposer is not None else 0
        self.max_rows, self.probe_every = max_rows, probe_every if proposer is not None else 0
        if costs is None and proposer is not None:
            costs = measure_grid(target, proposer.model, max_batch=max_rows, max_query=self.k_max + 1)
        self.costs = costs
        self.cache = SlotCache(cache_shapes(target), dtype=target.dtype, device=target.device)
        self.room = BatchRoom(kv_budget_bytes)
        self._at_risk = 0  # rows in the forward under way (what an out-of-memory error halves)
        self.context_limit = max_positions(target)
        self.rows: list[Row] = []
        self.waiting: deque[Row] = deque()  # admitted by the caller, not yet prefilled
        self.stats = EngineStats()
        self.k = 0 if self.fixed_k is None else self.fixed_k
        self._round = 0
        self._plain_streak = 0  # rounds in a row that chose k = 0 (probe rounds aside)

    # --- the caller's side ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def busy(self) -> int:
        return len(self.rows) + len(self.waiting)

    @property
    def row_limit(self) -> int:
        """Rows the batch may hold now: ``max_rows``, or fewer since an out-of-memory error."""
        return self.room.limit(self.max_rows)

    @property
    def free_rows(self) -> int:
        """How many more requests to add now (the batch's room, bounded by the K/V budget)."""
        room, budget = self.row_limit, self.room.budget
        if budget is not None and self.busy:
            longest = max(self._capacity_for(row.request) for row in (*self.rows, *self.waiting))
            per_row = self._bytes_per_token() * max(longest, self.cache.capacity)
            room = min(room, max(1, budget // per_row))
        return max(0, room - self.busy)

    def add(self, requests: Iterable[Request]) -> None:
        for request in requests:
            too_long = context_problem(len(request.input_ids), request.max_new_tokens, self.context_limit)
            if too_long is not None:  # a guard: the worker refuses such an item before it is a request
                raise ValueError(f"request {request.key}: {too_long}")
            stats = RowStats(prompt_tokens=len(request.input_ids))
            self.waiting.append(Row(request=request, stats=stats, admitted=time.perf_counter()))

    def step(self) -> list[Finished]:
        """Admit what waits (up to the room), then one round; returns the rows that finished."""
        try:
            finished = self._admit()
            if self.rows:
                finished += self._round_of_decoding()
        except torch.OutOfMemoryError:
            self._halve_after_oom()
            return []
        return finished

    def generate(self, requests: Iterable[Request]) -> Iterator[Finished]:
        """Decode ``requests`` (pulled lazily, one whenever a row is free), yielding rows as they finish."""
        queue, exhausted = iter(requests), False
        while True:
            while not exhausted and self.free_rows:
                request = next(queue, None)
                if request is None:
                    exhausted = True
                else:
                    self.add([request])
            if exhausted and not self.busy:
                return
            yield from self.step()

    def abandon(self) -> list[int]:
        """Drop every row and waiting request (after a failed round): their keys, to be run again."""
        keys = [row.request.key for row in (*self.rows, *self.waiting)]
        self.rows, self.waiting = [], deque()
        return keys

    def release(self) -> None:
        """Give the K/V caches back (the target's and the proposer's, to the device or system): rows in
        the batch wait again with their tokens (their caches recomputed when they are admitted again)."""
        self.waiting.extendleft(reversed(self.rows))
        self.rows = []
        self._drop_caches()
        give_back(self.device)

    def _drop_caches(self) -> None:
        self.cache.release()
        if self.proposer is not None:
            self.proposer.release()

    # --- admission: ragged prefill of the waiting rows into the slots after the last row -------------
    def _capacity_for(self, request: Request) -> int:
        return len(request.input_ids) + request.max_new_tokens + self.k_max + 1

    def _bytes_per_token(self) -> int:
        draft = self.proposer.cache if self.proposer is not None else None
        return self.cache.bytes_per_token() + (draft.bytes_per_token() if draft is not None else 0)

    def _admissible(self) -> Admission:
        """The waiting rows to admit now: up to the row limit, within the K/V budget."""
        if not self.cache.slots:  # the caches are empty: what the device can give them now
            self.room.device_room = device_room(self.device)
        return plan_admission(
            Held(self.cache.slots, self.cache.capacity, len(self.rows)),
            [self._capacity_for(row.request) for row in self.rows],
            [self._capacity_for(row.request) for row in self.waiting],
            limit=self.row_limit,
            budget=self.room.budget,
            per_token=self._bytes_per_token(),
        )

    @torch.inference_mode()
    def _admit(self) -> list[Finished]:
        plan = self._admissible()
        new = [self.waiting.popleft() for _ in range(plan.rows)]
        if not new:
            return []
        started, start = time.perf_counter(), len(self.rows)
        self._at_risk = start + len(new)
        if plan.fresh:  # no row to keep: new buffers, not a copy of the old ones
            self._drop_caches()
        self.cache.reserve(plan.slots, plan.capacity)
        if self.proposer is not None:
            self.proposer.reserve(plan.slots, plan.capacity)
        fresh = [not row.tokens for row in new]
        inputs = [
            row.request.input_ids if is_fresh else row.context[:-1]
            for row, is_fresh in zip(new, fresh, strict=True)
        ]
        width = max(len(ids) for ids in inputs)
        ids = to_device([x + [0] * (width - len(x)) for x in inputs], self.device)
        lengths = to_device([len(x) for x in inputs], self.device)
        zero = [0] * len(new)
        self.rows.extend(new)
        try:
            logits = forward_rows(
                self.target, self.cache, (start, start + len(new)), zero, ids, last=lengths - 1
            )
            sampling = self._sampling(new)
            first = first_tokens(
                logits, sampling, torch.zeros_like(lengths)
            ).tolist()  # the prefill's host sync
            for row, is_fresh, token in zip(new, fresh, first, strict=True):
                if is_fresh:
                    row.stats.target_rounds += 1
                    self._extend(row, [int(token)])
            if self.proposer is not None:
                self.proposer.admit(start, new, ids, lengths)
        except BaseException:
            del self.rows[start:]
            self.waiting.extendleft(reversed(new))
            raise
        seconds = time.perf_counter() - started
        prefilled = sum(len(x) for x in inputs)  # counted on the host: no device read
        self.stats.prefill(rows=len(new), tokens=prefilled, seconds=seconds)
        for row in new:
            row.stats.latency_s += seconds / len(new)
        return self._remove_finished()

    # --- one round -------------------------------------------------------------------------------------
    def _sampling(self, rows: list[Row]) -> RowSampling:
        device = self.device
        return RowSampling(
            temperature=to_device([row.request.temperature for row in rows], device, torch.float32),
            top_p=to_device([row.request.top_p for row in rows], device, torch.float32),
            seeds=to_device([row.request.seed for row in rows], device),
            all_greedy=all(row.request.greedy for row in rows),
            any_greedy=any(row.request.greedy for row in rows),
            any_top_p=any(row.request.top_p < 1 for row in rows),
        )

    def _choose_k(self, room: list[int], cached: float) -> tuple[int, bool]:
        """(k for this round, whether it is a plain probe round); ``cached``: the rows' longest cached
        length (every row attends that wide), which the costs are priced at."""
        self._round += 1
        if self.proposer is None or self.k_max == 0:
            return 0, False
        if self.probe_every and self._round % self.probe_every == 0:
            return 0, True
        if self.fixed_k is not None:
            return self.fixed_k, False
        if not any(room):
            return 0, False
        assert self.costs is not None  # an engine with a proposer has them
        estimates = acceptance_estimates(self.rows, self.stats)
        own = self.proposer.row_acceptance(self.rows)  # mode auto: the chosen proposer's rate
        estimates = [mine if mine is not None else e for e, mine in zip(estimates, own, strict=True)]
        self.k = choose_draft_length(
            self.costs, estimates, room, k_max=self.k_max, current=self.k, context=cached
        )
        self._plain_streak = self._plain_streak + 1 if self.k == 0 else 0
        if self._plain_streak >= EXPLORE_EVERY:  # counted apart from probe rounds, which never explore
            self._plain_streak = 0
            return 1, False
        return self.k, False

    @torch.inference_mode()
    def _round_of_decoding(self) -> list[Finished]:
        started = time.perf_counter()
        rows, device = self.rows, self.device
        b = self._at_risk = len(rows)
        caps = [row.remaining - 1 for row in rows]
        caps = [
            c if row.request.draft_limit is None else min(c, row.request.draft_limit)
            for c, row in zip(caps, rows, strict=True)
        ]
        available = self.proposer.available(rows, self.k_max) if self.proposer is not None else [0] * b
        old_lengths = [len(row.context) - 1 for row in rows]
        cached = max(old_lengths)  # the forward's attention spans the longest row for every row
        k, probe = self._choose_k([min(a, c) for a, c in zip(available, caps, strict=True)], cached)
        pending = to_device([row.tokens[-1] for row in rows], device)
        positions = to_device([len(row.tokens) for row in rows], device)
        sampling = self._sampling(rows)
        drafts, counts, probs = pending.new_zeros(b, 0), [0] * b, None
        if k and self.proposer is not None:
            view = BatchView(rows, pending, sampling, positions)
            proposal = self.proposer.propose(view, k)
            drafts, counts, probs = proposal.tokens, proposal.counts, proposal.probs
        limits = [min(k, n, c) for n, c in zip(counts, caps, strict=True)]
        inputs = torch.cat([pending[:, None], drafts], 1)  # (B, k+1)
        logits = forward_rows(self.target, self.cache, (0, b), old_lengths, inputs)
        verdict = verify_drafts(logits, drafts, probs, to_device(limits, device), sampling, positions)
        host = torch.cat(  # the round's one host sync
            [
                verdict.accepted[:, None],
                verdict.next_tokens[:, None],
                verdict.rejected[:, None].long(),
                drafts,
            ],
            1,
        ).tolist()
        accepted = [line[0] for line in host]
        if self.proposer is not None:
            self.proposer.advance(rows, old_lengths, accepted, k, limits)
        seconds = time.perf_counter() - started
        new_tokens = round_accepted = round_rejections = check_tokens = 0
        for row, line, limit in zip(rows, host, limits, strict=True):
            a, token, rejected, guesses = line[0], line[1], line[2], line[3:]
            new = [*guesses[:a], token]
            row.successes += a
            row.failures += rejected
            round_accepted += a
            round_rejections += rejected
            stats = row.stats
            stats.target_rounds += 1
            stats.draft_proposed += limit
            stats.draft_rejections += rejected
            stats.gamma_sum += k
            stats.latency_s += seconds / b
            gained = self._extend(row, new)
            stats.draft_accepted += max(0, gained - 1)
            new_tokens += max(0, gained)
            if row.request.draft_limit == 0 and self.proposer is not None:  # a plain twin, a check
                check_tokens += max(0, gained)
        self.stats.round(
            batch=b,
            k=k,
            probe=probe,
            tokens=new_tokens,
            seconds=seconds,
            proposed=sum(limits),
            accepted=round_accepted,
            rejections=round_rejections,
            drafts=limits,
            check_tokens=check_tokens,
        )
        if not probe and self.costs is not None:
            self.costs.observe(b, k, seconds, cached)
        return self._remove_finished()

    def _extend(self, row: Row, new: list[int]) -> int:
        """Append ``new`` to the row, cut after an EOS id or where a stop sequence ends it; mark the
        row finished then or once it has max_new_tokens. Returns how many tokens it gained."""
        request, stats = row.request, row.stats
        done = False
        for i, token in enumerate(new):
            if token in request.eos_ids:
                new, done = new[: i + 1], True
                break
        before = len(row.tokens)
        row.tokens.extend(new)
        if request.stop is not None:
            keep = request.stop(row.tokens)
            if keep is not None:
                del row.tokens[keep:]
                done = True
        stats.new_tokens = len(row.tokens)
        if done:
            stats.finish_reason = "stop"
        row.finished = done or row.remaining <= 0
        return len(row.tokens) - before

    def _remove_finished(self) -> list[Finished]:
        """Take finished rows out, keeping slots dense: the last row moves into each freed slot."""
        finished = []
        slot = 0
        while slot < len(self.rows):
            row = self.rows[slot]
            if not row.finished:
                slot += 1
                continue
            row.stats.wall_s = time.perf_counter() - row.admitted
            finished.append(Finished(key=row.request.key, token_ids=row.tokens, stats=row.stats))
            self.room.row_left(self.max_rows)
            last = len(self.rows) - 1
            if slot != last:
                moved = self.rows[last]
                columns = len(moved.context)
                self.cache.move(last, slot, columns)
                if self.proposer is not None:
                    self.proposer.move(last, slot, columns)
                self.rows[slot] = moved
            self.rows.pop()
        return finished

    def _halve_after_oom(self) -> None:
        """Out of device memory: every row waits again (tokens kept, caches dropped), the batch halved."""
        rows = self.room.halve(self._at_risk, self.max_rows)
        self.release()
        self.stats.oom_events += 1
        log.warning("out of memory: batch halved to %d rows, %d rows resume", rows, len(self.waiting))
