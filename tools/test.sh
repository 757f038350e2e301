#!/usr/bin/env bash
# The whole test suite (what `make test` and CI run). Assumes `make env` has set up .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
B=.venv/bin
# every temporary folder of the run (the notebooks' pre-training runs, pytest's tmp_path) lives in one folder that is
# removed at the end, pass or fail: left behind, they filled the disk of a shared CI machine (several GB per run)
export TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/nl-embryo-test.XXXXXX")
trap 'rm -rf "$TMPDIR"' EXIT
t0=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - t0 )) s)"; }

step "fetch the data the tests need"
$B/nl-embryo data fetch                                                   # the default set
$B/nl-embryo data fetch minilm spacy-en sentiment bbc-news antiberty talmud mathjax widgets-embed   # the other sources the notebooks, tests and docs site use

step "nbdev_export leaves the library in step with the notebooks"
before=$(git status --porcelain -- nl_embryo nbs | md5sum)
$B/nbdev_export
if [ "$(git status --porcelain -- nl_embryo nbs | md5sum)" != "$before" ]; then
  echo "nbdev_export changed nl_embryo/: export the notebooks and commit the result"; git status --short -- nl_embryo; exit 1
fi

step "nbdev_clean leaves the notebooks clean"
$B/nbdev_clean
if [ "$(git status --porcelain -- nl_embryo nbs | md5sum)" != "$before" ]; then
  echo "nbdev_clean changed nbs/: run nbdev_clean and commit the result"; git status --short -- nbs; exit 1
fi

step "byte-compile the library once"
# where PYTHONDONTWRITEBYTECODE is set (as on the CI machine) nothing caches the compiled library, so every process that
# imports it (the test workers, each papermill kernel and each command-line test) compiled it again: 0.3 s of CPU each
$B/python -m compileall -q nl_embryo

step "nbdev_test (notebook cells, slow ones included; NBDEV_TEST_FLAGS= skips them; the longest notebooks first)"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} $B/python tools/nbtest.py --n_workers 2 --timing ${NBDEV_TEST_FLAGS---flags slow}


step "docs build"
$B/nl-embryo docs

step "browser test dependencies (Debian chromium, Playwright)"
bash tools/browser-deps.sh

step "pytest (integration, CLI, fault and browser tests)"
echo "(all earlier checks passed in $(( $(date +%s) - t0 )) s)"
# two workers (pytest-xdist), a test file per worker at a time: each test runs torch on one thread (conftest.py); the files
# go in the order conftest.py gives them, longest first (--no-loadscope-reorder: not by their number of tests); every test
# phase of 5 s or more is listed with its seconds, to keep conftest.py's order and the suite's time in view
$B/python -m pytest tests -q -p no:cacheprovider -o tmp_path_retention_policy=failed -n 2 --dist loadfile --no-loadscope-reorder --durations=0 --durations-min=5

