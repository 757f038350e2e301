"""Shared fixtures and helpers: the repo's venv executables and `main` in-process, a small pre-training corpus, the English
tokenizer, one short reference run (`MINI`) built once per worker, one torch thread, the headless browser."""
import os, sys, warnings
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def nl_embryo_cmd(*args):
    "The nl-embryo console script of this environment, with arguments."
    return [str(BIN/'nl-embryo'), *map(str, args)]


def cli(capsys, *args):
    "Run `nl-embryo ARGS` in this process (`nl_embryo.cli.main`): the return code and what it printed, stdout then stderr."
    from nl_embryo.cli import main
    rc = main([str(a) for a in args])
    got = capsys.readouterr()
    return rc, got.out + got.err


def fresh_fallback_site(docs: Path, pages, sources) -> bool:
    """Is `docs` a fallback build of `nl-embryo docs` (CI builds one just before pytest) that holds every page of `pages`
    (paths inside it) with the site's own navigation, and is newer than every file of `sources`?"""
    pages = [docs/p for p in pages]
    if not pages or not all(p.is_file() for p in pages): return False
    if not all('<nav class="nl-nav">' in p.read_text(encoding='utf-8') for p in pages): return False   # Quarto's site: not offline
    built = min(p.stat().st_mtime for p in pages)
    return all(s.exists() and s.stat().st_mtime <= built for s in sources)


def poison_mlm_loss(monkeypatch, at_call: int) -> None:
    "Make the MLM objective's loss NaN at its `at_call`-th call: a diverging step, injected."
    import nl_embryo.pretrain as P
    calls, real = {'n': 0}, P.OBJECTIVES['mlm']
    def poisoned(*a, **k):
        out = real(*a, **k); calls['n'] += 1
        if calls['n'] == at_call: out['loss'] = out['loss'] * float('nan')
        return out
    monkeypatch.setitem(P.OBJECTIVES, 'mlm', poisoned)


@pytest.fixture(scope='session')
def small_corpus():
    "A small nested-zipf corpus in the English id space (built once per cache)."
    from nl_embryo.corpora import build_corpus
    return build_corpus('nested-zipf', block_size=32, n_tokens=40_000, quiet=True)


@pytest.fixture(scope='session')
def english_tokenizer():
    "The English WordPiece tokenizer, loaded once per session (one per xdist worker). Tests must not change it."
    from nl_embryo.corpora import get_tokenizer
    return get_tokenizer('english')


MINI = dict(corpus='nested-zipf', block_size=32, corpus_tokens=40_000, batch_size=8, lr=2e-3, preset='mini', eval_batches=1)


def train(out, steps=4, checkpoints='0,2,4', resume=False, **kw):
    "Pre-train the `MINI` recipe (options in `kw` replace its own) into `out`, quietly; the run folder."
    from nl_embryo.pretrain import PretrainConfig, pretrain
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return pretrain(PretrainConfig(out=str(out), steps=steps, checkpoints=checkpoints, **dict(MINI, **kw)), resume=resume, quiet=True)


def weights(run, step):
    "The tensors of a run's checkpoint at `step`."
    from safetensors.torch import load_file
    return load_file(str(Path(run)/'checkpoints'/f'step{step}'/'model.safetensors'))


@pytest.fixture(scope='session')
def reference(tmp_path_factory, small_corpus):
    """An uninterrupted 4-step `MINI` run (checkpoints 0, 2, 4) on one torch thread, built once per session (one per xdist
    worker) and shared by several files: tests copy it before they change it, and write nothing into it but tables of
    their own under `analysis/`."""
    import torch
    n = torch.get_num_threads(); torch.set_num_threads(1)
    try: return train(tmp_path_factory.mktemp('ref')/'run')
    finally: torch.set_num_threads(n)


@pytest.fixture(scope='module')
def one_torch_thread():
    "Small models on 2 shared cores: one intra-op thread is several times faster than two that spin-wait (restored afterwards)."
    import torch
    n = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


CHROMIUM = os.environ.get('NL_EMBRYO_CHROMIUM', '/usr/bin/chromium')
FLAGS = ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
         '--disable-sync', '--no-first-run', '--disable-quic']


def require_browser():
    "Fail (not skip) when Playwright, Pillow or Debian's chromium is missing; NL_EMBRYO_SKIP_BROWSER=1 skips on purpose."
    if os.environ.get('NL_EMBRYO_SKIP_BROWSER') == '1': pytest.skip('NL_EMBRYO_SKIP_BROWSER=1')
    missing = []
    try: import playwright.sync_api  # noqa: F401
    except ImportError: missing.append('playwright (PyPI)')
    try: import PIL  # noqa: F401
    except ImportError: missing.append('pillow (PyPI)')
    if not os.access(CHROMIUM, os.X_OK): missing.append(f'{CHROMIUM} (Debian chromium)')
    if missing: pytest.fail(f"the browser tests need {', '.join(missing)}: run tools/browser-deps.sh (or set NL_EMBRYO_SKIP_BROWSER=1)")


@pytest.fixture(scope='module')
def browser():
    "Debian's headless chromium driven by Playwright, one per test module."
    require_browser()
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True, timeout=60_000)
        try: yield b
        finally: b.close()


# Worker seconds of each test file in a quiet run of the suite (2 workers, 2026-11-27; sums of --durations=0; cli,
# sources and bench lowered by what running some of their commands in the test's process saved afterwards). Two
# workers take whole files (`--dist loadfile`) in collection order, so the suite puts the longest files first: a
# long file started last would leave the other worker idle (the longest-first rule of scheduling). Files not listed
# (new ones) come after these, in their usual order; the figures only need to rank the files, not be exact.
# test_tutorials.py: the six tutorials' run time in the notebook step (2026-11-28), which it took over on 2026-12-07.
FILE_SECONDS = {'test_tutorials.py': 190, 'test_demo.py': 123, 'test_pretrain.py': 87, 'test_experiments.py': 87, 'test_sources.py': 80,
                'test_batch.py': 72, 'test_browser.py': 69, 'test_hostile.py': 65, 'test_cli.py': 60, 'test_scoring.py': 60,
                'test_docs.py': 47, 'test_probes.py': 37, 'test_attention.py': 35, 'test_causal.py': 23,
                'test_interventions.py': 19, 'test_analysis.py': 18, 'test_splits.py': 18, 'test_docs_site.py': 17,
                'test_finetune.py': 13, 'test_bench.py': 10, 'test_reconstruction.py': 10}


def pytest_collection_modifyitems(session, config, items):
    "Longest test files first (`FILE_SECONDS`); the tests of a file keep their order."
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 0))   # a stable sort: ties keep the collection order
