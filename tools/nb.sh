#!/usr/bin/env bash
# Developer helper: turn percent-format sources into nbs/ notebooks, execute them in place (outputs are
# the docs), export the library and clean the notebooks.
#   tools/nb.sh SRC.py [SRC.py ...]   (each SRC.py becomes nbs/<relative name>.ipynb)
set -euo pipefail
cd "$(dirname "$0")/.."
B=.venv/bin
for src in "$@"; do
  name=$(basename "${src%.py}")
  dest=${NB_DEST:-nbs}/$name.ipynb
  $B/jupytext --quiet --to notebook --set-kernel python3 --output "$dest" "$src"
  (cd "$(dirname "$dest")" && ../$B/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=1200 "$(basename "$dest")" 2>&1 | grep -v -E '^\[NbConvertApp\] (Converting|Writing)' || true)
done
$B/nbdev_export
$B/nbdev_clean
