"""Shared fixtures: the repo's venv executables and small pre-training corpora."""
import os, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def nl_embryo_cmd(*args):
    "The nl-embryo console script of this environment, with arguments."
    return [str(BIN/'nl-embryo'), *map(str, args)]


@pytest.fixture(scope='session')
def small_corpus():
    "A small nested-zipf corpus in the English id space (built once per cache)."
    from nl_embryo.corpora import build_corpus
    return build_corpus('nested-zipf', block_size=32, n_tokens=40_000, quiet=True)
