#!/usr/bin/env bash
# A real demo job end to end on a fresh machine, embedded mode (no broker, SQLite ./genjob.db):
# submit the example prompts to the demo target + draft, follow the progress, print results and stats.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
unset GENJOB_BROKER_URL GENJOB_DATABASE_URL
genjob=.venv/bin/genjob
job=$($genjob submit examples/prompts.jsonl --model models/demo/target --assistant models/demo/draft \
  --max-new-tokens 64 --baseline-fraction 0.25 --name demo --wait)
echo
echo "==> results of job $job (genjob results $job)"
$genjob results "$job" | .venv/bin/python -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    name = r["id"] or r["index"]
    print("--- %s (%s, %s new tokens, %s rounds)" % (name, r["status"], r["new_tokens"], r["target_rounds"]))
    print(r["output"] if r["output"] is not None else r["error"])
'
echo
echo "==> stats (genjob stats $job)"
$genjob stats "$job"
