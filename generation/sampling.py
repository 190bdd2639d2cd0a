"""Token choice for every row of a batch: greedy or sampled, and the speculative acceptance rule.

Randomness is keyed, not drawn from a global generator: the uniform for (row seed, output position,
stream) is a counter-based hash, so a row's draws depend only on its own seed and positions, never
on which rows share its batch or in which order. Sampling uses the inverse CDF (one uniform per
token), on any device, with no host sync.

Acceptance (Leviathan et al. 2023; Chen et al. 2023), row i, drafts d_1..d_k from q, target p:
  accept d_j while u_j < p_j(d_j) / q_j(d_j) (u_j uniform);  a = accepted count, at most the row's
  limit; then one more token at position a+1: from normalize(max(0, p − q)) if d_{a+1} was
  rejected, else from p (all drafts accepted, or the row stopped at its limit). Greedy rows are the
  temperature → 0 case: p and q one-hot, so a draft is accepted iff it is the target's argmax and
  the next token is the argmax. Drafts that came from no distribution (prompt lookup) have a one-hot q.
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

M32 = 0xFFFFFFFF
# Streams keep the draws of one position apart: the draft's sample, the acceptance test, the target's.
DRAFT, ACCEPT, TARGET = 1, 2, 3


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32-like), on int64 tensors holding values in [0, 2^32).
    Multipliers below 2^31 keep every product under 2^63: no signed overflow."""
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & M32
    x = ((x ^ (x >> 15)) * 0x68E31DA5) & M32
    return x ^ (x >> 16)


def keyed_uniforms(seeds: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """Uniforms in (0, 1), float64, one per (row seed, output position): seeds (B,) int64 ≥ 0,
    positions (B, K) int64 → (B, K). The same key always gives the same number."""
    lo, hi = seeds & M32, (seeds >> 32) & M32
    h = _mix32(lo ^ _mix32(hi + 0x9E3779B9))[:, None]  # (B, 1)
    h = _mix32(h ^ _mix32((positions & M32) + stream * 0x632BE5AB))
    h = _mix32(h ^ _mix32((positions >> 32) + 0x85EBCA6B))
    return (h.to(torch.float64) + 0.5) / 4294967296.0


@dataclass(frozen=True)
class RowSampling:
    """Per-row sampling settings, as tensors on the batch's device (B,)."""

    temperature: torch.Tensor  # float; 0 = greedy
    top_p: torch.Tensor  # float in (0, 1]
    seeds: torch.Tensor  # int64
    # Known on the host (no device sync to find out): every row greedy (argmax only, no distributions),
    # some row greedy, some row with top_p < 1.
    all_greedy: bool = False
    any_greedy: bool = True
    any_top_p: bool = True

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature <= 0


def probabilities(logits: torch.Tensor, sampling: RowSampling) -> torch.Tensor:
    """The distribution each row samples from: logits (B, K, V) → probs (B, K, V), float32.

    Temperature, then nucleus (top-p) filtering; greedy rows get a one-hot at their argmax."""
    b, k, _v = logits.shape
    temperature = sampling.temperature.clamp(min=1e-5)[:, None, None].to(torch.float32)
    probs = torch.softmax(logits.to(torch.float32) / temperature, dim=-1)
    if sampling.any_top_p:
        probs = _top_p(probs, sampling.top_p[:, None].expand(b, k))
    greedy = sampling.greedy[:, None, None]
    if sampling.any_greedy:
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy, one_hot, probs)
    return probs


def _top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (the first always kept)."""
    ordered, order = probs.sort(dim=-1, descending=True)
    mass_before = ordered.cumsum(-1) - ordered
    ordered = torch.where(mass_before < top_p[..., None], ordered, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, ordered)
    return kept / kept.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: probs (..., V), uniforms (...) → tokens (...) int64."""
    cdf = probs.to(torch.float64).cumsum(-1)
    target = (uniforms * cdf[..., -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, target).squeeze(-1).clamp(max=probs.shape[-1] - 1)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one verification round, on the device: accepted counts (B,) and the next
    token (B,) of every row (the target's own token at position accepted + 1)."""

    accepted: torch.Tensor
    next_tokens: torch.Tensor
    rejected: torch.Tensor  # (B,) bool: the draft at position accepted + 1 was tested and refused


def verify_drafts(
    target_logits: torch.Tensor,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    limits: torch.Tensor,
    sampling: RowSampling,
    positions: torch.Tensor,
) -> Verdict:
    """Apply the acceptance rule to every row at once.

    target_logits (B, k+1, V): the target after [p, d_1..d_k]; drafts (B, k); draft_probs (B, k, V)
    the q each draft was sampled from, or None (drafts not sampled: one-hot q); limits (B,) how many
    drafts a row may accept (its own proposals, room before max_new_tokens); positions (B,) the
    output index of d_1 (uniforms are keyed by it)."""
    b, q_len, _ = target_logits.shape
    k = q_len - 1
    rows = torch.arange(b, device=target_logits.device)
    if sampling.all_greedy:  # p and q one-hot: accept while the draft is the target's argmax
        chosen = target_logits.argmax(-1)  # (B, k+1)
        raw = (drafts == chosen[:, :k]).long().cumprod(1).sum(1)
        accepted = torch.minimum(raw, limits)
        rejected = (accepted == raw) & (accepted < limits)
        return Verdict(
            accepted=accepted, next_tokens=chosen.gather(1, accepted[:, None])[:, 0], rejected=rejected
        )
    p = probabilities(target_logits, sampling)  # (B, k+1, V)
    index = positions[:, None] + torch.arange(q_len, device=positions.device)  # (B, k+1)
    if k:
        p_draft = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)  # p_j(d_j), (B, k)
        if draft_probs is None:
            q_draft = torch.ones_like(p_draft)
        else:
            q_draft = draft_probs.gather(-1, drafts[..., None]).squeeze(-1).clamp(min=1e-20)
        u = keyed_uniforms(sampling.seeds, index[:, :k], ACCEPT)
        passed = (u < (p_draft / q_draft).to(torch.float64)).long()
        raw = passed.cumprod(1).sum(1)  # drafts accepted before the first refusal
    else:
        raw = torch.zeros(b, dtype=torch.long, device=target_logits.device)
    accepted = torch.minimum(raw, limits)
    rejected = (accepted == raw) & (accepted < limits)
    p_next = p[rows, accepted]  # (B, V)
    if k:
        at = accepted.clamp(max=k - 1)
        if draft_probs is None:
            q_next = torch.zeros_like(p_next).scatter_(-1, drafts[rows, at][:, None], 1.0)
        else:
            q_next = draft_probs[rows, at]
        residual = (p_next - q_next).clamp(min=0)
        mass = residual.sum(-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp(min=1e-20), p_next)
        p_next = torch.where(rejected[:, None], residual, p_next)
    u_next = keyed_uniforms(sampling.seeds, index.gather(1, accepted[:, None]), TARGET)[:, 0]
    sampled = sample(p_next, u_next)
    greedy_next = target_logits[rows, accepted].argmax(-1)
    next_tokens = torch.where(sampling.greedy, greedy_next, sampled)
    return Verdict(accepted=accepted, next_tokens=next_tokens, rejected=rejected)


def first_tokens(logits: torch.Tensor, sampling: RowSampling, positions: torch.Tensor) -> torch.Tensor:
    """The token after a prefill: logits (B, V) → (B,), greedy or sampled at output ``positions`` (B,)."""
    if sampling.all_greedy:
        return logits.argmax(-1)
    probs = probabilities(logits[:, None], sampling)[:, 0]
    sampled = sample(probs, keyed_uniforms(sampling.seeds, positions[:, None], TARGET)[:, 0])
    return torch.where(sampling.greedy, logits.argmax(-1), sampled)


def sample_draft_token(
    logits: torch.Tensor, sampling: RowSampling, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A draft model's proposal at one position: logits (B, V) → (tokens (B,), q (B, V)).
    Greedy rows take the argmax (q one-hot), sampling rows sample from their processed q; with every
    row greedy q is not needed (None)."""
    if sampling.all_greedy:
        return logits.argmax(-1), None
    q = probabilities(logits[:, None], sampling)[:, 0]
    sampled = sample(q, keyed_uniforms(sampling.seeds, positions[:, None], DRAFT)[:, 0])
    return torch.where(sampling.greedy, logits.argmax(-1), sampled), q
