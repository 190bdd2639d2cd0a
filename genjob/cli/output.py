"""Plain-text rendering of jobs and their stats for the CLI (stable, testable output)."""

from __future__ import annotations

from datetime import datetime

from genjob.stats import job_stats
from genjob.tables import Job


def fmt_time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def fmt_float(value: float | None, pattern: str = "{:.3f}") -> str:
    return "-" if value is None else pattern.format(value)


def job_summary_lines(job: Job) -> list[str]:
    elapsed = "-"
    if job.started_at and job.finished_at:
        elapsed = f"{(job.finished_at - job.started_at).total_seconds():.1f} s"
    lines = [
        f"job:       {job.id}" + (f"  ({job.name})" if job.name else ""),
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
        lines.append(f"error:     {job.error}")
    return lines


def job_stats_lines(job: Job) -> list[str]:
    stats = job_stats(job)
    lines = [
        f"job:                     {job.id}  ({job.status}, {job.done}/{job.total} done)",
        f"mode:                    {job.mode}",
        f"new tokens:              {job.new_tokens}",
        f"target rounds:           {job.target_rounds}",
        f"draft proposed/accepted: {job.draft_proposed}/{job.draft_accepted}",
        f"acceptance rate α:       {fmt_float(stats.acceptance_rate)}",
        f"mean accepted per round: {fmt_float(stats.mean_accepted_per_round, '{:.2f}')}",
        f"tokens/s:                {fmt_float(stats.tokens_per_second, '{:.1f}')}",
        f"draft length γ:          {job.draft_tokens if job.draft_tokens is not None else '-'}",
        f"cost ratio c:            {fmt_float(job.cost_ratio)}",
        f"expected speedup:        {fmt_float(stats.expected_speedup, '{:.2f}x')}",
        f"measured speedup:        {fmt_float(stats.measured_speedup, '{:.2f}x')}"
        + (f"  (A/B on {job.baseline_items} items)" if job.baseline_items else ""),
        f"lossless rate:           {fmt_float(stats.lossless_rate, '{:.1%}')}",
    ]
    if job.guard_tripped:
        lines.append(f"speedup guard:           tripped: {job.guard_reason}")
    return lines


def job_row(job: Job) -> str:
    name = (job.name or "")[:24]
    return f"{job.id}  {job.status:<9}  {job.done:>6}/{job.total:<6}  {fmt_time(job.created_at)}  {name}"


JOBS_HEADER = f"{'id':<12}  {'status':<9}  {'done/total':^13}  {'created':<19}  name"
