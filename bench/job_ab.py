"""A job's reported speedup against the job-to-job truth: the same prompts, once plainly, once speculatively.

Each pair of jobs goes through the real CLI (``genjob submit --wait``, embedded mode, a fresh SQLite
database, one torch thread) at the same batch size; the truth is the plain job's elapsed time
(started → finished) over the draft job's: the median of the ``--repeats`` plain jobs at that batch
size over each draft job's (a single plain job of a few seconds moves by a third from run to run; the
pair's own ratio is printed too). The draft job's own ``measured speedup`` (its plain rounds set against
its drafted rounds of the same row count) must land within ±20 % of it, or be absent (``too few probe
rounds``, printed). Runs alternate plain / draft, so drift hits both alike.

Workers keep the forward costs they measured and learnt (GENJOB_COST_CACHE_DIR, here a scratch
directory). ``--cache`` says what each job starts from: ``cold``, an empty cost cache for every job (a
fresh worker on a fresh machine: the draft job pays its quick prior); ``warm``, the cache as earlier jobs
left it (one untimed draft job fills it first); ``calibrated``, ``genjob calibrate`` first, as an operator
may do.

    taskset -c 1 .venv/bin/python bench/job_ab.py [--n 64] [--new 64] [--batches 1,8] [--repeats 2] \
        [--cache cold|warm|calibrated]

The demo pair with its draft by default; ``--task rewrite`` (any of ``bench/task_prompts.TASKS``) runs the
real model (``smollm2``) on that task's held-out chat lines (OpenAI batch lines, as a user submits them),
prompt lookup against plain: ``taskset -c 1 .venv/bin/python bench/job_ab.py --task rewrite --n 8
--new 96 --batches 1,8 --repeats 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import task_prompts

from genjob.db import session_scope
from genjob.stats import job_stats
from genjob.tables import Job

ROOT = Path(__file__).resolve().parents[1]
GENJOB = str(Path(sys.executable).with_name("genjob"))
HELD_OUT = ROOT / "bench" / "prompts" / "heldout.jsonl"


def job_env(database: str, costs: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENJOB_")}
    env.update(
        GENJOB_DATABASE_URL=database,
        GENJOB_COST_CACHE_DIR=costs,
        GENJOB_TORCH_THREADS="1",
        OMP_NUM_THREADS="1",
    )
    return env


def model_options(mode: str, task: str | None) -> list[str]:
    """The submit options of one job: the demo pair (draft) or smollm2 on a task's lines (prompt lookup)."""
    if task is not None:
        return [
            "--input-format",
            "openai",
            "-m",
            "smollm2",
            "--mode",
            "none" if mode == "none" else "prompt-lookup",
        ]
    target = ["-m", str(ROOT / "models/demo/target")]
    return [*target, "--mode", "none"] if mode == "none" else [*target, "-a", str(ROOT / "models/demo/draft")]


def calibrate(*, batch: int, database: str, costs: str) -> str:
    """``genjob calibrate`` for the draft job at this batch size; its last line (measured, kept or not)."""
    argv = [
        GENJOB,
        "calibrate",
        "-m",
        str(ROOT / "models/demo/target"),
        "-a",
        str(ROOT / "models/demo/draft"),
    ]
    argv += ["--batch-size", str(batch)]
    done = subprocess.run(argv, env=job_env(database, costs), capture_output=True, text=True, check=True)
    return done.stdout.splitlines()[-1]


def run_job(
    prompts: Path, *, mode: str, batch: int, new: int, database: str, costs: str, task: str | None = None
) -> tuple[float, float | None, str]:
    """(elapsed seconds, reported measured speedup, job id) of one embedded job."""
    argv = [
        GENJOB,
        "submit",
        str(prompts),
        *model_options(mode, task),
        "--max-new-tokens",
        str(new),
        "--batch-size",
        str(batch),
        "--chunk-size",
        "10000",
        "--wait",
    ]
    done = subprocess.run(argv, env=job_env(database, costs), capture_output=True, text=True, check=True)
    job_id = done.stdout.split()[0]
    with session_scope(database) as session:
        job = session.get_one(Job, job_id)
        assert job.started_at and job.finished_at
        elapsed = (job.finished_at - job.started_at).total_seconds()
        stats = job_stats(job)
        if stats.measured_speedup is None and stats.measured_speedup_note:
            print(f"# {job_id}: no measured speedup: {stats.measured_speedup_note}", flush=True)
        if mode != "none":
            print(f"# {job_id}: {probe_only(job)}", flush=True)
        return elapsed, stats.measured_speedup, job_id


def probe_only(job: Job) -> str:
    """What the derivation before issue 42 reported: every token at the probe rounds' pace, whatever
    their row count (for comparison), and the job's share of plain rounds."""
    rounds = job.rounds_by_rows or {}
    plain = sum(v for k, v in rounds.items() if k.endswith(":plain_rounds"))
    share = f"{plain / max(job.decode_rounds, 1):.0%} of {job.decode_rounds} rounds plain"
    if not job.probe_tokens or not job.busy_seconds:
        return f"{share}; {job.probe_rounds} probe rounds: no probe-only figure"
    pace = job.probe_seconds / job.probe_tokens
    legacy = (job.busy_seconds - job.decode_seconds + job.decode_tokens * pace) / job.busy_seconds
    return f"{share}; {job.probe_rounds} probe rounds: the probe-only derivation would say {legacy:.2f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--prompts", type=Path, default=HELD_OUT if HELD_OUT.exists() else ROOT / "examples/prompts.jsonl"
    )
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache", choices=("cold", "warm", "calibrated"), default="cold")
    parser.add_argument("--task", choices=task_prompts.TASKS, help="the real model on this task's lines")
    parser.add_argument("--keep", type=Path, help="a directory to keep the jobs' database in (to inspect)")
    args = parser.parse_args()
    if args.task and args.cache == "calibrated":
        parser.error("--cache calibrated runs the demo pair only")
    with tempfile.TemporaryDirectory() as temporary:
        scratch = str(args.keep) if args.keep else temporary
        Path(scratch).mkdir(parents=True, exist_ok=True)
        lines = [json.loads(line) for line in args.prompts.read_text(encoding="utf-8").splitlines()]
        short = [{"prompt": line["prompt"]} for line in lines if len(line["prompt"]) < 600]
        short = (short * -(-args.n // len(short)))[: args.n]  # past the file's prompts, they repeat
        if args.task:
            short = task_prompts.chat_lines(
                args.task, task_prompts.HELDOUT_PACKAGES, args.n, max_tokens=args.new
            )
        prompts = Path(scratch) / "prompts.jsonl"
        prompts.write_text("".join(json.dumps(line) + "\n" for line in short))
        database, shared = f"sqlite:///{scratch}/ab.db", f"{scratch}/costs"
        fresh = iter(range(10**6))

        def costs() -> str:  # the cost cache a job starts from
            return f"{scratch}/costs-{next(fresh)}" if args.cache == "cold" else shared

        warmth = {
            "cold": "an empty cost cache for every job",
            "warm": "the cost cache as earlier jobs left it",
            "calibrated": "genjob calibrate first",
        }[args.cache]
        what = (
            f"smollm2 on {args.task} chat lines, prompt lookup" if args.task else "the demo pair, its draft"
        )
        print(
            f"# {what}: {len(short)} prompts, {args.new} new tokens, embedded jobs, 1 torch thread, {warmth}"
        )
        print(
            "| B | plain job s | speculative job s | pair | truth (median plain) | reported measured "
            "| reported / truth |"
        )
        print("|---|---|---|---|---|---|---|")
        worst, slowest = 0.0, float("inf")
        for batch in [int(b) for b in args.batches.split(",")]:
            if args.cache == "calibrated":
                kept = calibrate(batch=batch, database=database, costs=shared)
                print(f"# B={batch}: genjob calibrate: {kept}")
            elif args.cache == "warm":
                run_job(
                    prompts,
                    mode="draft",
                    batch=batch,
                    new=args.new,
                    database=database,
                    costs=shared,
                    task=args.task,
                )
            pairs = []
            for _ in range(args.repeats):
                job = {"batch": batch, "new": args.new, "database": database, "task": args.task}
                plain, _, _ = run_job(prompts, mode="none", costs=costs(), **job)
                spec, reported, _ = run_job(prompts, mode="draft", costs=costs(), **job)
                pairs.append((plain, spec, reported))
            typical = statistics.median(plain for plain, _, _ in pairs)
            for plain, spec, reported in pairs:
                # the truth of each speculative job: the plain jobs' median over its elapsed (one plain
                # job of a few seconds moves by a third from run to run, which no report can follow)
                truth = typical / spec
                slowest = min(slowest, truth)
                # no figure ("too few probe rounds") is honest: it is no deviation
                ratio = reported / truth if reported is not None else None
                worst = max(worst, abs(ratio - 1)) if ratio is not None else worst
                shown = f"{reported:.2f}x" if reported is not None else "- (too few probes)"
                cells = [f"{batch}", f"{plain:.1f}", f"{spec:.1f}", f"{plain / spec:.2f}x", f"{truth:.2f}x"]
                print("| " + " | ".join([*cells, shown, f"{ratio:.2f}" if ratio else "-"]) + " |", flush=True)
        print(
            f"# largest deviation of the reported speedup from the job-to-job truth: {worst:.0%} "
            f"(goal ≤ 20%); slowest speculative job against its plain job: {slowest:.2f}x (goal ≥ 0.95x)"
        )
        return 0 if worst <= 0.2 and slowest >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
