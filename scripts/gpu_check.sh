#!/usr/bin/env bash
# The GPU check, ready for a machine with an NVIDIA GPU (none has run it yet where this was written):
#   1. a real `genjob worker` with GENJOB_DEVICE=cuda, prefork as compose runs it (default settings
#      otherwise), and a small draft job of the demo pair through Redis and Postgres (started if absent);
#   2. the engine benchmark at B = 1, 8, 64 in bfloat16 on the GPU.
# Prints one table (worker check, then the engine's rows) and exits non-zero if the job did not complete.
#   scripts/gpu_check.sh            # ~3-5 minutes on a fresh machine (venv and install included)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/services.sh
.venv/bin/python -c 'import torch; assert torch.cuda.is_available(), "no CUDA device: nothing to check"'
work=$(mktemp -d)
db=genjob_gpu_check_$$
psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE $db" postgres
export GENJOB_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/$db
export GENJOB_BROKER_URL=redis://127.0.0.1:6379/7 GENJOB_QUEUE=gpu-check-$$ GENJOB_DEVICE=cuda
export GENJOB_COST_CACHE_DIR=$work/costs
genjob=.venv/bin/genjob
$genjob db upgrade > /dev/null
$genjob worker -Q "$GENJOB_QUEUE" -c 1 > "$work/worker.log" 2>&1 &
worker=$!
cleanup() {
  kill "$worker" 2>/dev/null || true
  wait "$worker" 2>/dev/null || true
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" postgres || true
}
trap cleanup EXIT
SECONDS=0
set +e
job=$(timeout 600 $genjob submit examples/prompts.jsonl -m models/demo/target -a models/demo/draft \
  --max-new-tokens 64 --wait 2> "$work/submit.err")
code=$?
set -e
took=$SECONDS
echo "| check | result |"
echo "|---|---|"
echo "| genjob worker, GENJOB_DEVICE=cuda, prefork, demo draft job of 12 items | exit $code in $took s: $(tail -n 1 "$work/submit.err") |"
if [ "$code" = 0 ]; then
  $genjob stats "$job" | sed 's/^/| stats | /; s/$/ |/'
else
  echo "--- worker log" >&2
  tail -n 40 "$work/worker.log" >&2
fi
grep -E "torch threads|cost model: a prior|ran in a process of its own" "$work/worker.log" | sed 's/^/| worker log | /; s/$/ |/' || true
echo
.venv/bin/python bench/engine.py --device cuda --dtype bfloat16 --batches 1,8,64 --n 64
exit "$code"
