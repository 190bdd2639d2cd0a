#!/usr/bin/env bash
# A real demo end to end on a fresh machine, embedded mode (no broker, SQLite ./genjob.db): the example
# prompts (held out from the demo pair's training) as two jobs on the demo target + draft, one greedy and
# one sampled (T=0.8), a few outputs of each, then the stats of both side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
unset GENJOB_BROKER_URL GENJOB_DATABASE_URL
genjob=.venv/bin/genjob
pair=(--model models/demo/target --assistant models/demo/draft --batch-size 8)
submit() {
  $genjob submit examples/prompts.jsonl "${pair[@]}" --max-new-tokens 64 --baseline-fraction 0.25 "$@" --wait
}
greedy=$(submit --name demo-greedy)
sampled=$(submit --name demo-sampled --temperature 0.8 --seed 1)
show() {
  echo
  echo "==> $1: the first outputs of job $2 (genjob results $2)"
  $genjob results "$2" | .venv/bin/python -c '
import json, sys
for number, line in enumerate(sys.stdin):
    if number == 3:
        break
    r = json.loads(line)
    print("--- %s (%s, %s new tokens, %s rounds)" % (r["id"] or r["index"], r["status"], r["new_tokens"], r["target_rounds"]))
    print(r["output"] if r["output"] is not None else r["error"])
'
}
show "greedy" "$greedy"
show "sampled, T=0.8" "$sampled"
echo
echo "==> stats side by side (genjob stats $greedy; genjob stats $sampled)"
.venv/bin/python - "$greedy" "$sampled" <<'EOF'
import subprocess, sys
left, right = (subprocess.run([".venv/bin/genjob", "stats", job], capture_output=True, text=True, check=True)
               .stdout.splitlines() for job in sys.argv[1:])
rows = [(a.partition(":")[0], a.partition(":")[2].strip(), b.partition(":")[2].strip()) for a, b in zip(left, right)]
rows = [row for row in rows if row[0] not in ("costs",)]  # long lines: see genjob stats
print(f"{'':<24} {'greedy':<40} sampled, T=0.8")
for label, a, b in rows:
    print(f"{label + ':':<24} {a:<40} {b}")
EOF
echo
echo "Measured speedup: the job's tokens/s over plain decoding's at the same batch size, from its own probe"
echo "rounds. With 12 items it is a noisy figure; it counts everything the job paid, the quick cost prior"
echo "a fresh process measures before its first round included (later jobs read what was kept)."
echo "Expected speedup is the steady state; docs/benchmarks.md has the engine's speedups at each batch size."
