#!/usr/bin/env bash
# Developer helper: turn percent-format sources into nbs/ notebooks, export them, execute them in place (outputs are
# the docs; no widget state is stored: it took the attention explorer past its size limit), then export the library again and
# clean the notebooks.
#   tools/nb.sh SRC.py [SRC.py ...]   (each SRC.py becomes nbs/<name>.ipynb; NB_DEST=nbs/experiments for experiments)
set -euo pipefail
cd "$(dirname "$0")/.."
B=$PWD/.venv/bin
dests=()
for src in "$@"; do
  name=$(basename "${src%.py}")
  dest=${NB_DEST:-nbs}/$name.ipynb
  $B/jupytext --quiet --to notebook --set-kernel python3 --output "$dest" "$src"
  dests+=("$dest")
done
$B/nbdev_export
for dest in "${dests[@]}"; do
  (cd "$(dirname "$dest")" && $B/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=1200 --ExecutePreprocessor.store_widget_state=False "$(basename "$dest")" 2>&1 \
     | grep -v -E '^\[NbConvertApp\] (Converting|Writing)|TCP without encryption' || true)
done
$B/nbdev_export
$B/nbdev_clean
