"""Rendering of jobs and their stats for the CLI: stable, testable text, and JSON as the API has it.

Text that users supplied (names, errors quoting ids) is printed with control characters escaped.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from genjob.cli.errors import printable
from genjob.constants import DecodingMode
from genjob.stats import JobStats, job_stats, plain_rounds
from genjob.tables import Job


def job_json(job: Job) -> dict[str, Any]:
    """The job as ``GET /v1/jobs/{id}`` answers it."""
    from genjob.api.schemas import JobOut  # pydantic and the API's models: only for --json

    return _models_as_given(job, JobOut.of(job).model_dump(mode="json"))


def _models_as_given(job: Job, data: dict[str, Any]) -> dict[str, Any]:
    """A model given as a path named by the whole path (``genjob.formats.openai_output.job_model``):
    the API's JobOut names it by its last part, and two models called ``target`` look alike."""
    if job.model_name is None:
        data["model"] = data["spec"]["model"] = job.model
    if job.assistant is not None and job.assistant_name is None:
        data["assistant"] = data["spec"]["assistant"] = job.assistant
    return data


def job_stats_json(job: Job) -> dict[str, Any]:
    """The job's stats (figures and the sums they come from), with its id and state."""
    from genjob.api.schemas import JobOut

    out = JobOut.of(job)
    stats = job_stats(job)
    return {
        "id": out.id,
        "status": out.status.value,
        "done": out.done,
        "total": out.total,
        **out.stats.model_dump(),
        "elapsed_seconds": stats.elapsed_seconds,
        "elapsed_tokens_per_second": stats.elapsed_tokens_per_second,
    }


def counted(count: int, noun: str) -> str:
    """``1 chunk``, ``3 chunks``: ``noun`` in the singular, an s added for any count but one."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def fmt_time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def fmt_float(value: float | None, pattern: str = "{:.3f}") -> str:
    return "-" if value is None else pattern.format(value)


def job_summary_lines(job: Job) -> list[str]:
    elapsed = "-"
    if job.started_at and job.finished_at:
        elapsed = f"{(job.finished_at - job.started_at).total_seconds():.1f} s"
    lines = [
        f"job:       {job.id}" + (f"  ({printable(job.name)})" if job.name else ""),
        f"status:    {job.status}",
        f"items:     {job.total} total, {job.done} done, {job.failed} failed",
        f"model:     {job.model}",
        f"assistant: {job.assistant or '-'}  (mode {job.mode})",
        f"queue:     {job.queue}",
        f"created:   {fmt_time(job.created_at)}",
        f"started:   {fmt_time(job.started_at)}",
        f"finished:  {fmt_time(job.finished_at)}  (elapsed {elapsed})",
    ]
    if job.error:
        lines.append(f"error:     {printable(job.error)}")
    return lines


def _histogram(stored: dict[str, int] | None) -> str:
    hist = {int(k): n for k, n in (stored or {}).items()}
    total = sum(hist.values())
    if not total:
        return "-"
    return "  ".join(f"{k}:{n / total:.0%}" for k, n in sorted(hist.items()))


def _measured(job: Job, stats: JobStats) -> str:
    text = fmt_float(stats.measured_speedup, "{:.2f}x")
    if stats.measured_speedup is None:
        return text + (f"  ({stats.measured_speedup_note})" if stats.measured_speedup_note else "")
    if stats.measured_speedup_low is not None and stats.measured_speedup_high is not None:
        text += f" (95% {stats.measured_speedup_low:.2f}-{stats.measured_speedup_high:.2f})"
    return text + (
        f"  vs plain rounds of the same row count: {plain_rounds(job)} plain rounds"
        f" ({job.probe_rounds} plain probe rounds)"
    )


def _lossless(job: Job, stats: JobStats) -> str:
    """The rate and its items; where a job too short for its sampling checked none, why."""
    rate = fmt_float(stats.lossless_rate, "{:.1%}")
    if job.lossless_checked:
        return f"{rate}  ({job.lossless_matches}/{job.lossless_checked} items)"
    if job.mode == DecodingMode.NONE:  # nothing to check
        return rate
    from genjob.options import JobSpec  # pydantic, on first use: reading jobs loads no option schema

    every = JobSpec.model_validate(job.spec).lossless_every
    if not 0 < job.total < every:
        return rate
    return f"{rate}  (no item checked: 1 in {every} is, and the job has {job.total})"


def _costs(job: Job) -> str:
    at = (job.costs or {}).get("at_batch")
    if not at:
        return "-"
    verify = ", ".join(f"k={k} {ms:.2f}" for k, ms in at["verify_ms"].items())
    return (
        f"plain step {at['plain_ms']:.2f} ms, draft step {at['draft_step_ms']:.2f} ms, "
        f"verify k+1 tokens: {verify} ms (batch {at['batch']})"
    )


def _elapsed(stats: JobStats) -> str:
    return "-" if stats.elapsed_seconds is None else f"{stats.elapsed_seconds:.1f} s"


def _proposers(stats: JobStats) -> list[str]:
    """Mode auto: a line per proposer (what it drafted for the job's rows, and how much was kept)."""
    lines = []
    for name, tally in (stats.proposers or {}).items():
        share = f"{tally.accepted / tally.proposed:.1%}" if tally.proposed else "-"
        lines.append(
            f"  {name + ':':<22}{tally.rounds} row-rounds, {tally.proposed} proposed, "
            f"{tally.accepted} accepted ({share}), {tally.rejections} rejections"
        )
    return ["by proposer:", *lines] if lines else []


def job_stats_lines(job: Job) -> list[str]:
    stats = job_stats(job)
    return [
        f"job:                     {job.id}  ({job.status}, {job.done}/{job.total} done)",
        f"mode:                    {job.mode}",
        f"new tokens:              {job.new_tokens}",
        f"target rounds:           {job.target_rounds}",
        f"draft proposed/accepted: {job.draft_proposed}/{job.draft_accepted}"
        f"  ({job.draft_rejections} rejections)",
        f"acceptance rate:         {fmt_float(stats.acceptance_rate)}  (accepted / proposed)",
        f"per-token α:             {fmt_float(stats.alpha)}  (accepted / (accepted + rejections))",
        f"mean accepted per round: {fmt_float(stats.mean_accepted_per_round, '{:.2f}')}",
        f"draft length γ:          {_histogram(job.gamma_hist)}  (rounds by k)",
        f"drafts per row:          {_histogram(job.drafts_hist)}  (row-rounds by drafts the row had)",
        f"mean batch size:         {fmt_float(stats.mean_batch_size, '{:.1f}')}",
        f"tokens/s wall-clock:     {fmt_float(stats.elapsed_tokens_per_second, '{:.1f}')}"
        f"  (new tokens / {_elapsed(stats)} from start to end)",
        f"tokens/s decoding:       {fmt_float(stats.tokens_per_second, '{:.1f}')}"
        f"  (new tokens / the items' {job.generate_seconds:.1f} s of decoding)",
        f"costs:                   {_costs(job)}",
        f"cost ratio c:            {fmt_float(job.cost_ratio)}",
        f"expected speedup:        {fmt_float(stats.expected_speedup, '{:.2f}x')}",
        f"measured speedup:        {_measured(job, stats)}",
        f"lossless rate:           {_lossless(job, stats)}",
        *_proposers(stats),
    ]


def job_row(job: Job) -> str:
    name = printable(job.name or "", keep_newlines=False)[:24]
    return f"{job.id}  {job.status:<9}  {job.done:>6}/{job.total:<6}  {fmt_time(job.created_at)}  {name}"


JOBS_HEADER = f"{'id':<12}  {'status':<9}  {'done/total':^13}  {'created':<19}  name"
