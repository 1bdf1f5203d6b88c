#!/bin/bash
# The GPU check in one device call of at most 9 minutes: the CUDA tests, eager against graphs (training, the recipe
# from process start to its test score, greedy and beam search, back-translating the task-2 captions), trainings
# side by side on one card, then the attention study in the time left; at most 8 files come back in $OUT.
#
# From the project root on the GPU machine (docs/development/benchmarking.md), with the project's packages and the
# corpus mirror on PYTHONPATH / NMT_DATA_MIRROR where it has no package registry:
#   OUT=gpu_out bash scripts/gpu_device_run.sh                                    # 540 s, every part
#   OUT=gpu_out bash scripts/gpu_device_run.sh --parts study --budget-seconds 480  # gpu_check.py options pass through
# The commit it records: NMT_GIT_COMMIT, else the first line of .gpu-site/commit, else git describe.
# Without a CUDA device it says so in one line (exit status 2) before any work. A SIGTERM or Ctrl-C (a timeout
# around it) stops the running command once it saved, keeps the parts done and exits 143 or 130.
# Writes its runs under $GPU_CHECK_WORK (default /tmp/gpu_check), then packs them into $OUT.
set -euo pipefail
: "${OUT:?set OUT to the folder whose files come back}"
if [ -z "${NMT_GIT_COMMIT:-}" ] && [ -s .gpu-site/commit ]; then
    NMT_GIT_COMMIT=$(head -n 1 .gpu-site/commit)
    export NMT_GIT_COMMIT
fi
work=${GPU_CHECK_WORK:-/tmp/gpu_check}
exec "${PYTHON:-python3}" scripts/gpu_check.py --device-run --out "$work" --pack "$OUT" "$@"
