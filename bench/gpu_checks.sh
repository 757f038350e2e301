#!/usr/bin/env bash
# The GPU measurements behind the pretrain chapter's GPU figures and the causal chapter's induction budget, in one call,
# each stage under its own time limit, so that a GPU lent for a few minutes gives every figure it can:
#
#   bash bench/gpu_checks.sh OUT_DIR [STAGES]      run STAGES (comma-separated; default: all, in the order below)
#   bash bench/gpu_checks.sh --list                 print each stage's limit and command, run nothing
#   bash bench/gpu_checks.sh --prepare              build here (on any machine) the corpora the stages read, and name the
#                                                   folders of the data cache to copy to an offline GPU server
#
# Stages (seconds):
#   mfu        150  nl_embryo's loop against the Trainer and the matmul peak: `base`, bf16, 256 x 128 (MFU; goal 40%)
#   weights    120  bf16 weights against autocast, `base`, 256 x 128 (does a bf16 weight copy lift the MFU?)
#   profile     90  where one `base` step's time goes (torch.profiler groups, kernel time, the host's waits)
#   ttl        150  time to 0.5 nat below the unigram entropy: `tiny`, 128 x 128, against the Trainer
#   induction  420  the causal `tiny` (gpt-neox) on English blocks of 1,024 for INDUCTION_MINUTES (default 5): when, in
#                   tokens, an induction head clears its bar
# All five take up to 15.5 minutes: where one call may run at most 10, run mfu,weights,profile,ttl (510 s), then induction.
# Each stage writes OUT_DIR/STAGE.log (and its JSON or CSV); one that fails or reaches its limit is named at the end and
# does not stop the next. Needs a CUDA GPU, and PYTHON (default: .venv/bin/python, else python3) with nl_embryo importable.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
STAGES_ALL=mfu,weights,profile,ttl,induction
declare -A LIMIT=([mfu]=150 [weights]=120 [profile]=90 [ttl]=150 [induction]=420)

stage_cmd() {   # the command of stage $1, writing its files into $2
  case $1 in
    mfu) echo "$PY bench/pretrain_throughput.py --presets base --precisions bf16 --roofline-presets base --objectives '' --batch-size 256 --block-size 128 --rounds 3 --save $2/mfu_base.json" ;;
    weights) echo "$PY bench/precision.py --weights --presets base --batch-size 256 --block-size 128 --rounds 3 --save $2/bf16_weights_base.json" ;;
    profile) echo "$PY bench/profile_step.py --preset base --precision bf16 --batch-size 256 --block-size 128 --save $2/profile_base.csv" ;;
    ttl) echo "$PY bench/time_to_loss.py --preset tiny --batch-size 128 --block-size 128 --steps 700 --hf-steps 3000 --rounds 4" ;;
    induction) echo "$PY bench/induction_budget.py --arch gpt-neox --preset tiny --corpus english --block-size 1024 --batch-size 32 --steps 20000 --checkpoints log:512:1000 --minutes ${INDUCTION_MINUTES:-5} --save $2/induction_scores.csv --save-metrics $2/induction_metrics.jsonl" ;;
    *) return 1 ;;
  esac
}

if [ "${1:-}" = --list ]; then
  for s in ${STAGES_ALL//,/ }; do printf '%-10s %4s s  %s\n' "$s" "${LIMIT[$s]}" "$(stage_cmd "$s" OUT_DIR)"; done
  exit 0
fi
if [ "${1:-}" = --prepare ]; then   # the stages read the English tokenizer and the English corpus in blocks of 128 and 1,024
  $PY - <<'EOF' || exit 1
from nl_embryo.corpora import build_corpus, corpus_dir, tokenizer_dir
from nl_embryo.core import data_dir
paths = [tokenizer_dir('english', 8000)]
for block in (128, 1024):
    build_corpus('english', block_size=block, quiet=True); paths.append(corpus_dir('english', block, 8000, None, 0))
print(f"built; copy these folders of the data cache ({data_dir()}) to the same places on the GPU server, or set NL_EMBRYO_DATA there:")
for p in paths: print(' ', p.relative_to(data_dir()))
EOF
  exit 0
fi
OUT=${1:?"usage: bash bench/gpu_checks.sh OUT_DIR [STAGES]   (or --list, --prepare)"}
STAGES=${2:-$STAGES_ALL}
for s in ${STAGES//,/ }; do
  stage_cmd "$s" x >/dev/null || { echo "unknown stage '$s'"; echo "fix: choose from $STAGES_ALL"; exit 2; }
done
if ! $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "no CUDA GPU here (torch.cuda.is_available() is False, or $PY has no torch): these stages measure a GPU"
  echo "fix: run it on a machine with a CUDA GPU; on a CPU the benches run on their own (see each one's --help)"
  exit 2
fi
mkdir -p "$OUT"
{ date -u +%Y-%m-%dT%H:%M:%SZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  $PY -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'; } | tee "$OUT/machine.log"
failed=()
for s in ${STAGES//,/ }; do
  cmd=$(stage_cmd "$s" "$OUT")
  echo; echo "== $s (limit ${LIMIT[$s]} s): $cmd"
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout --kill-after=10 "${LIMIT[$s]}" bash -c "$cmd" 2>&1 | tee "$OUT/$s.log"
  rc=${PIPESTATUS[0]}
  echo "== $s: exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/$s.log"
  [ "$rc" = 0 ] || failed+=("$s (exit $rc$( [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo ': its time limit'))")
done
echo
if [ ${#failed[@]} -gt 0 ]; then echo "did not finish: ${failed[*]}"; exit 1; fi
echo "every stage finished: $OUT"
