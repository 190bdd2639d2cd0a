"""A job-wide suffix cache and the proposer that drafts from it (SuffixDecoding, arXiv 2411.04975).

A batch job is one template over many rows, so its outputs repeat each other (keys, boilerplate,
labels). ``SuffixCache`` keeps, per worker process and job, the suffixes of the job's finished outputs
(and, if the caller adds them, its prompts) in a depth-bounded, path-compressed trie with a count per
node; a continuation's probability is estimated as count(child) / count(node). ``SuffixLookup`` is a
``Proposer``: each row's draft is the better-scored of two candidates, one from the row's own prompt
and output (prompt lookup) and one from the job's cache. The caller feeds the cache (``add_output``
when a row finishes); the proposer never decides what belongs to a job.
Must not know: the database, Celery, HTTP, the core; nor how the engine picks k or verifies drafts.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from genjob.generation.forward import to_device
from genjob.generation.proposers import BatchView, ModelFree, NgramIndex, Proposal, RowState
from genjob.generation.requests import Row

# 10^5 cached tokens take ≈ 18 MiB as template-like outputs, ≈ 21 MiB as random tokens (tracemalloc,
# bench/suffix_cache.py): under the 64 MiB per job at 10^5 tokens.
MAX_TOKENS = 100_000
# A node with more children keeps its most frequent child when an eviction decrements it (until a
# sibling's insertion overtakes it, or it goes): rescanning the thousands of values after a JSON key at
# each eviction cost milliseconds a round, for drafts far below min_prob anyway.
EXACT_FANOUT = 32
_COUNT = attrgetter("count")


@dataclass(frozen=True)
class Draft:
    """A candidate continuation: ``probs[i]`` is the estimated probability that tokens[: i + 1] all
    follow (the product of the conditional estimates), so ``score`` = Σ probs is the expected number
    of accepted tokens, SuffixDecoding's score. ``match`` is how many context tokens it matched."""

    tokens: list[int]
    probs: list[float]
    match: int

    def score(self, k: int) -> float:
        """The score of the draft's first k tokens."""
        return sum(self.probs[:k])


NO_DRAFT = Draft([], [], 0)


class _Node:
    """A trie node: the edge into it is ``length`` tokens at ``start`` (a global position in the cache's
    token buffer) — always the latest inserted suffix that passes through it, so FIFO eviction never
    leaves a live node pointing at evicted tokens. ``count``: suffixes through or ending at it."""

    __slots__ = ("best", "children", "count", "length", "start")

    def __init__(self, start: int, length: int, count: int) -> None:
        self.start, self.length, self.count = start, length, count
        self.children: dict[int, _Node] | None = None
        self.best: _Node | None = None  # the most frequent child; None: recompute when needed


class SuffixCache:
    """Every suffix (up to ``max_depth`` tokens) of each added sequence, in a compressed trie (at most
    two nodes per suffix: memory grows with the tokens, not tokens × depth) with counts per node.

    ``match(context, k)``: the longest suffix of ``context`` found (at most max_depth − k tokens, so
    the depth-bounded trie leaves room for k more), then the draft grows along the most frequent
    child while the product of the estimates stays ≥ ``min_prob``, at most
    ``max_spec_factor × match + max_spec_offset`` tokens and at most k (Arctic's rule; vLLM's
    defaults: depth 24, min token probability 0.1, factor 1). Sequences are kept in arrival order;
    past ``max_tokens`` cached tokens the oldest are evicted, their counts taken out of the trie.
    """

    def __init__(
        self,
        max_depth: int = 24,
        max_tokens: int = MAX_TOKENS,
        *,
        min_prob: float = 0.1,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
    ) -> None:
        if max_depth < 2 or max_tokens < 1 or not 0 <= min_prob <= 1 or max_spec_factor < 0:
            raise ValueError("need max_depth >= 2, max_tokens >= 1, 0 <= min_prob <= 1, factor >= 0")
        self.max_depth, self.max_tokens, self.min_prob = max_depth, max_tokens, min_prob
        self.max_spec_factor, self.max_spec_offset = max_spec_factor, max_spec_offset
        self._root = _Node(0, 0, 0)
        self._tokens: list[int] = []  # every cached sequence, oldest first; _tokens[0] is at _base
        self._base = 0
        self._lengths: deque[int] = deque()  # the cached sequences' lengths, oldest first

    @property
    def tokens(self) -> int:
        return len(self._tokens)

    @property
    def sequences(self) -> int:
        return len(self._lengths)

    def draft_limit(self, match: int, k: int) -> int:
        """How many tokens a match of ``match`` tokens may draft (factor × match + offset, ≤ k)."""
        return max(0, min(k, int(match * self.max_spec_factor + self.max_spec_offset + 1e-6)))

    # --- adding and evicting ---------------------------------------------------------------------------
    def add(self, tokens: Sequence[int]) -> None:
        """Cache a sequence (a finished output, or a prompt), evicting the oldest past ``max_tokens``;
        a sequence longer than that keeps its last ``max_tokens`` tokens."""
        tokens = list(tokens[-self.max_tokens :])
        if not tokens:
            return
        first = len(self._tokens)
        self._tokens.extend(tokens)
        self._lengths.append(len(tokens))
        end = len(self._tokens)
        known = 0
        for start in range(first, end):
            # what suffix ``start`` found before its insertion, suffix start + 1 finds but its first
            # token (Ukkonen's skip/count): those tokens need no comparing
            known = max(0, self._insert(start, min(self.max_depth, end - start), known) - 1)
        while len(self._tokens) > self.max_tokens:
            self._evict_oldest()

    def _insert(self, at: int, length: int, known: int) -> int:
        """The suffix _tokens[at : at + length], whose first ``known`` tokens are in the trie: counts up
        along its path, split where it leaves an edge or ends inside one (every suffix ends on a
        node), labels moved to it (the latest). Returns how many of its tokens were there before."""
        buf, base = self._tokens, self._base
        node = self._root
        node.count += 1
        i = 0
        while i < length:
            token = buf[at + i]
            if node.children is None:
                node.children = {}
            child = node.children.get(token)
            if child is None:
                node.children[token] = _Node(base + at + i, length - i, 1)
                return i
            edge = child.start - base - i  # buf[edge + j] is the edge's token facing buf[at + j]
            n = i + child.length if child.length < length - i else length
            same = known if known < n else n
            if same <= i:
                same = i + 1
            while same < n and buf[edge + same] == buf[at + same]:
                same += 1
            same -= i
            if same < child.length:  # split: the upper part becomes a node of its own
                upper = _Node(child.start, same, child.count)
                upper.children, upper.best = {buf[edge + i + same]: child}, child
                child.start += same
                child.length -= same
                node.children[token] = upper
                if node.best is child:
                    node.best = upper
                child = upper
            child.count += 1
            child.start = base + at + i
            best = node.best
            if best is not None and best is not child and child.count > best.count:
                node.best = child
            i += same
            node = child
        return length

    def _evict_oldest(self) -> None:
        """The oldest sequence: its suffixes' counts come off their paths (nodes at 0 go), its tokens
        leave the buffer. Every node left has a newer suffix through it, so its label is newer."""
        length = self._lengths.popleft()
        buf = self._tokens
        for at in range(length):
            depth = min(self.max_depth, length - at)
            parent, key, node = self._root, 0, self._root
            node.count -= 1
            i = 0
            while i < depth:
                token = buf[at + i]
                assert node.children is not None
                child = node.children[token]
                child.count -= 1
                if node.best is child and (child.count == 0 or len(node.children) <= EXACT_FANOUT):
                    node.best = None
                if child.count == 0:
                    del node.children[token]
                    break
                i += child.length
                parent, key, node = node, token, child
            if node is not self._root:
                _merge(parent, key, node)
        del buf[:length]
        self._base += length

    # --- matching ----------------------------------------------------------------------------------------
    def _locate(self, pattern: list[int]) -> tuple[_Node, int] | None:
        """Where ``pattern`` ends in the trie: (node, tokens of its edge consumed), or None."""
        buf, base = self._tokens, self._base
        node, i, n, used = self._root, 0, len(pattern), 0
        while i < n:
            child = node.children.get(pattern[i]) if node.children else None
            if child is None:
                return None
            used = min(child.length, n - i)
            edge = child.start - base
            if used > 1 and buf[edge + 1 : edge + used] != pattern[i + 1 : i + used]:
                return None
            i += used
            node = child
        return node, used

    def match(self, context: list[int], k: int) -> Draft:
        """Up to k tokens to follow ``context``, from its longest suffix found in the cache (at most
        max_depth − k tokens, and at least max_depth / 2 allowed)."""
        longest = min(len(context), max(self.max_depth - k, self.max_depth // 2))
        if k < 1 or longest < 1:
            return NO_DRAFT
        # a suffix found implies its own suffixes are (each starts a cached suffix): binary search
        found: tuple[_Node, int] | None = None
        low, high = 0, longest
        while low < high:
            mid = (low + high + 1) // 2
            where = self._locate(context[len(context) - mid :])
            if where is None:
                high = mid - 1
            else:
                found, low = where, mid
        if found is None:
            return NO_DRAFT
        return self._continue(*found, limit=self.draft_limit(low, k), match=low)

    def _continue(self, node: _Node, used: int, *, limit: int, match: int) -> Draft:
        buf, base = self._tokens, self._base
        tokens: list[int] = []
        probs: list[float] = []
        prob = 1.0
        while len(tokens) < limit:
            if used < node.length:  # the rest of this edge: no branch, no change in probability
                take = min(node.length - used, limit - len(tokens))
                edge = node.start - base + used
                tokens += buf[edge : edge + take]
                probs += [prob] * take
                used += take
                continue
            best = node.best
            if best is None and node.children:
                best = node.best = max(node.children.values(), key=_COUNT)
            if best is None:
                break
            prob *= best.count / node.count
            if prob < self.min_prob:
                break
            node, used = best, 0
        return Draft(tokens, probs, match)

    def node_count(self) -> int:
        """Nodes in the trie, the root included (a full walk: for tests and benchmarks)."""
        count, stack = 0, [self._root]
        while stack:
            node = stack.pop()
            count += 1
            if node.children:
                stack.extend(node.children.values())
        return count


def _merge(parent: _Node, key: int, node: _Node) -> None:
    """Where an evicted suffix's path stopped, ``node`` may be left with one child that every suffix
    through it goes on to (the only place eviction can leave one): fused, the trie stays compressed,
    at most two nodes a suffix. Both labels name the same latest suffix, so they are contiguous."""
    children = node.children
    if not children:
        node.children = None
        return
    if len(children) > 1:
        return
    (child,) = children.values()
    if child.count != node.count:
        return
    child.start -= node.length
    child.length += node.length
    assert parent.children is not None
    parent.children[key] = child
    if parent.best is node:
        parent.best = child


class SuffixLookup(ModelFree):
    """A ``Proposer``: per row, the better of two candidates, SuffixDecoding's way (the higher score,
    Σ of the per-token estimated probabilities, wins):
      - the row's own: what followed the latest earlier occurrence of its last n ≤ ``max_ngram`` tokens
        in its prompt and output (prompt lookup, the row's ``NgramIndex``, kept here per row), the match
        measured back from there (up to the cache's depth), its length by the same factor × match +
        offset rule.
        Each token scores 1.0, as a per-row suffix tree would estimate for a pattern seen once;
      - the job's: ``SuffixCache.match`` over the job's finished outputs, scored by its estimates.
    Ties go to the job's (Arctic keeps its per-request tree's): its 1.0s rest on counts over the job,
    the row's own on one occurrence (on the bench's synthetic extraction job, whose prompts list the
    keys in another syntax: 2.11 tokens a round against 1.98). Drafts are not sampled (one-hot q).

    The caller adds each finished row's output (``add_output``); the engine never does. Host time in
    ``available`` and ``propose`` (the round's share) adds up in ``host_seconds`` over ``calls``;
    ``add_seconds``: time caching outputs; ``chosen_row`` / ``chosen_job``: drafts from each side.
    """

    name = "suffix"

    def __init__(self, job_cache: SuffixCache | None = None, *, max_ngram: int = 3) -> None:
        self.job_cache = job_cache if job_cache is not None else SuffixCache()
        self.max_ngram = max_ngram
        self.host_seconds = self.add_seconds = 0.0
        self.calls = self.chosen_row = self.chosen_job = 0
        self.ngrams = RowState(lambda: NgramIndex(self.max_ngram))
        self._round: dict[Row, tuple[int, int, Draft, Draft]] = {}  # this round's (tokens, k, own, job's)

    def add_output(self, tokens: Sequence[int]) -> None:
        """A finished row's new tokens, for the rows that follow (the job's cache)."""
        started = time.perf_counter()
        self.job_cache.add(tokens)
        self.add_seconds += time.perf_counter() - started

    # --- the candidates ----------------------------------------------------------------------------------
    def _own(self, row: Row, context: list[int], k: int) -> Draft:
        index = self.ngrams(row)
        index.extend(context)
        end = len(context)
        for n in range(min(index.max_n, end), 0, -1):
            start = index.follower.get(tuple(context[end - n :]))
            if start is not None:
                break
        else:
            return NO_DRAFT
        match, depth = n, self.job_cache.max_depth
        while match < depth and start > match and context[start - match - 1] == context[end - match - 1]:
            match += 1
        tokens = context[start : start + self.job_cache.draft_limit(match, k)]
        return Draft(tokens, [1.0] * len(tokens), match)

    def _candidates(self, rows: list[Row], k: int) -> list[tuple[Draft, Draft]]:
        """Each row's (own, job's) candidates for up to k tokens, computed once a round."""
        out = []
        for row in rows:
            known = self._round.get(row)
            if known is not None and known[0] == len(row.tokens) and known[1] >= k:
                out.append((known[2], known[3]))
                continue
            context = row.context
            own, job = self._own(row, context, k), self.job_cache.match(context, k)
            self._round[row] = (len(row.tokens), k, own, job)
            out.append((own, job))
        return out

    @staticmethod
    def _pick(own: Draft, job: Draft, k: int) -> tuple[list[int], bool]:
        """The draft to propose for k tokens, and whether it is the job's."""
        if job.tokens and job.score(k) >= own.score(k):
            return job.tokens[:k], True
        return own.tokens[:k], False

    # --- the Proposer interface (no cache to reserve, fill or move: a row's prompt is indexed when it is
    # first asked for a draft, ``ModelFree``) -------------------------------------------------------------
    def available(self, rows: list[Row], k: int) -> list[int]:
        started = time.perf_counter()
        counts = [len(self._pick(own, job, k)[0]) for own, job in self._candidates(rows, k)]
        self.host_seconds += time.perf_counter() - started
        return counts

    def propose(self, view: BatchView, k: int) -> Proposal:
        started = time.perf_counter()
        guesses = []
        for own, job in self._candidates(view.rows, k):
            guess, from_job = self._pick(own, job, k)
            guesses.append(guess)
            if guess:
                self.chosen_job += from_job
                self.chosen_row += not from_job
        padded = [guess + [0] * (k - len(guess)) for guess in guesses]
        tokens = to_device(padded, view.pending.device).reshape(len(guesses), k)
        self.calls += 1
        self.host_seconds += time.perf_counter() - started
        return Proposal(tokens=tokens, counts=[len(g) for g in guesses], probs=None)

    def advance(
        self, rows: list[Row], old_lengths: list[int], accepted: list[int], k: int, drafted: list[int]
    ) -> None:
        self._round.clear()

    def release(self) -> None:
        self._round.clear()
