"""The measured speedup compares rounds of the same row count (issue 42): a ragged tail's plain round of
one row is not set against drafted rounds of eight, and below a minimum there is no figure, with a note."""

from __future__ import annotations

from genjob.generation.engine_stats import EngineStats
from genjob.stats import MIN_PLAIN_ROUNDS, speedup_by_rows
from genjob.tables import Job

# a CPU-like plain pace: a round of B rows takes 10 + B ms, one token per row
PLAIN_ROUND_S = {b: (10 + b) / 1000 for b in range(1, 65)}


def plain_round(stats: EngineStats, rows: int, *, twins: int = 0) -> None:
    stats.round(
        batch=rows,
        k=0,
        probe=True,
        tokens=rows,
        seconds=PLAIN_ROUND_S[rows],
        proposed=0,
        accepted=0,
        rejections=rows,
        drafts=[0] * rows,
        check_tokens=twins,
    )


def drafted_round(stats: EngineStats, rows: int, *, tokens_per_row: float, twins: int = 0) -> None:
    """A drafted round costs 1.5 plain rounds and makes ``tokens_per_row`` tokens a row."""
    stats.round(
        batch=rows,
        k=4,
        probe=False,
        tokens=round(rows * tokens_per_row),
        seconds=1.5 * PLAIN_ROUND_S[rows],
        proposed=4 * rows,
        accepted=0,
        rejections=0,
        drafts=[4] * rows,
        check_tokens=twins,
    )


def job_from(stats: EngineStats, overhead_s: float = 0.0) -> Job:
    return Job(
        rounds_by_rows=dict(stats.by_rows),
        busy_seconds=stats.seconds + overhead_s,
        decode_seconds=stats.seconds,
        decode_rounds=stats.rounds,
        decode_rows=stats.rows_sum,
        spec={},
    )


def truth(stats: EngineStats, *, tokens: dict[int, float]) -> float:
    """What plain decoding of the same output tokens would take, over what the rounds took."""
    plain = sum(n * PLAIN_ROUND_S[b] / b for b, n in tokens.items())
    return plain / stats.seconds


def test_a_tail_probe_of_one_row_is_not_set_against_rounds_of_eight() -> None:
    """The issue's 8-item job: rounds of 8 rows, one probe of a leftover row. The old derivation made
    the B = 1 seconds per token the plain pace of every token (2.43× for a job running ~1×)."""
    stats = EngineStats()
    for _ in range(30):
        drafted_round(stats, 8, tokens_per_row=1.5)
    plain_round(stats, 1)
    measured = speedup_by_rows(job_from(stats))
    assert measured.speedup is None and measured.note is not None and "too few probe rounds" in measured.note


def test_each_row_count_is_set_against_plain_rounds_of_its_own() -> None:
    stats = EngineStats()
    tokens: dict[int, float] = {}
    for rows, n in ((8, 40), (5, 6), (2, 4), (1, 3)):
        for i in range(n):
            if i % 5 == 0:
                plain_round(stats, rows)
            else:
                drafted_round(stats, rows, tokens_per_row=2.0)
    for key, value in stats.by_rows.items():
        rows, _, name = key.partition(":")
        if name == "tokens":
            tokens[int(rows)] = value
    measured = speedup_by_rows(job_from(stats))
    assert measured.speedup is not None
    assert abs(measured.speedup / truth(stats, tokens=tokens) - 1) < 0.01
    # the plain rounds of each row count are alike: a narrow interval around it
    assert measured.low is not None and measured.high is not None
    assert measured.low <= measured.speedup <= measured.high


def test_a_row_count_without_plain_rounds_takes_its_bins() -> None:
    """Rounds of 7 rows, plain rounds of 6 (and of 2) only: the bin [4, 7] gives their pace, moved
    from 6 rows to 7 along the line fitted to the plain rounds."""
    stats = EngineStats()
    for _ in range(MIN_PLAIN_ROUNDS):
        plain_round(stats, 6)
        plain_round(stats, 2)
    for _ in range(20):
        drafted_round(stats, 7, tokens_per_row=3.0)
    measured = speedup_by_rows(job_from(stats))
    assert measured.speedup is not None
    tokens = {6: 6.0 * MIN_PLAIN_ROUNDS, 2: 2.0 * MIN_PLAIN_ROUNDS, 7: 20 * 21.0}
    assert abs(measured.speedup / truth(stats, tokens=tokens) - 1) < 0.01


def test_rows_far_from_any_plain_round_give_no_figure_when_they_are_most_of_the_time() -> None:
    stats = EngineStats()
    for _ in range(MIN_PLAIN_ROUNDS):
        plain_round(stats, 1)
    for _ in range(50):
        drafted_round(stats, 16, tokens_per_row=2.0)
    assert speedup_by_rows(job_from(stats)).speedup is None
    assert speedup_by_rows(job_from(stats)).note == "too few probe rounds at the job's batch sizes"


def test_a_lossless_checks_twin_tokens_and_speculations_own_costs_count_against_it() -> None:
    """All plain rounds, one row of eight a plain twin: the job made 7/8 of the tokens plain would
    have needed for 8 rows' time, so it runs 7/8 of plain; what only speculation spent lowers it."""
    stats = EngineStats()
    for _ in range(20):
        plain_round(stats, 8, twins=1)
    job = job_from(stats)
    measured = speedup_by_rows(job)
    assert measured.speedup is not None and abs(measured.speedup - 7 / 8) < 1e-9
    job.decode_seconds += 0.1  # measuring costs: decode time plain would not have spent
    job.busy_seconds += 0.1
    slower = speedup_by_rows(job).speedup
    assert slower is not None and slower < measured.speedup


def test_jobs_recorded_before_have_no_figure() -> None:
    job = Job(rounds_by_rows=None, busy_seconds=3.0, decode_seconds=2.0, decode_rounds=10, spec={})
    assert speedup_by_rows(job).speedup is None


def test_engine_stats_by_rows_split_plain_and_drafted_and_reset_on_take() -> None:
    stats = EngineStats()
    plain_round(stats, 3, twins=1)
    drafted_round(stats, 3, tokens_per_row=2.0)
    taken = stats.take()
    assert taken.by_rows["3:rounds"] == 2 and taken.by_rows["3:plain_rounds"] == 1
    assert taken.by_rows["3:tokens"] == 2 + 6 and taken.by_rows["3:plain_tokens"] == 3
    assert stats.by_rows == {}


def test_a_single_plain_round_caught_in_a_load_spike_does_not_set_its_row_counts_pace() -> None:
    """Rows of 6 with one plain round of their own, three times as slow as it should be (the machine
    was busy): fewer than 3 rounds set no pace; the line through every plain round does."""
    stats = EngineStats()
    for _ in range(10):
        plain_round(stats, 8)
        plain_round(stats, 1)
    stats.round(
        batch=6,
        k=0,
        probe=True,
        tokens=6,
        seconds=3 * PLAIN_ROUND_S[6],
        proposed=0,
        accepted=0,
        rejections=6,
        drafts=[0] * 6,
    )
    for _ in range(10):
        drafted_round(stats, 6, tokens_per_row=2.0)
    for _ in range(30):
        drafted_round(stats, 8, tokens_per_row=2.0)
    measured = speedup_by_rows(job_from(stats))
    assert measured.speedup is not None
    tokens = {8: 8.0 * 10 + 30 * 16, 1: 10.0, 6: 6.0 + 10 * 12}
    assert abs(measured.speedup / truth(stats, tokens=tokens) - 1) < 0.05
