"""`nl-embryo analyze` and `nl-embryo sweep` end to end through the console script (subprocesses, as a user runs them)."""
import subprocess

import pandas as pd
import pytest

from conftest import nl_embryo_cmd


def run_cli(*args, check=True, timeout=600):
    r = subprocess.run(nl_embryo_cmd(*args), capture_output=True, text=True, timeout=timeout)
    if check: assert r.returncode == 0, f"nl-embryo {' '.join(map(str, args))} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory, small_corpus):
    "A tiny BERT pre-trained for 4 steps on the small nested-zipf corpus, checkpoints at steps 0 and 4."
    from nl_embryo.pretrain import PretrainConfig, pretrain
    out = tmp_path_factory.mktemp('cli')/'run'
    return pretrain(PretrainConfig(out=str(out), arch='bert', preset='tiny', corpus='nested-zipf', block_size=32,
                                   steps=4, batch_size=4, checkpoints='0,4', corpus_tokens=40_000), quiet=True)


def test_analyze_writes_every_table(tiny_run):
    r = run_cli('analyze', tiny_run, '--probes', 'pos', '--reconstruction', '--attention', '--knowledge', '--quiet')
    for name in ('probes', 'reconstruction', 'attention', 'knowledge'):
        path = tiny_run/'analysis'/f'{name}.parquet'
        assert path.exists(), f"{name}.parquet missing; output:\n{r.stdout}"
        df = pd.read_parquet(path)
        assert len(df) > 0 and set(df['step']) == {0, 4}, (name, sorted(set(df['step'])))
        assert f"{name}:" in r.stdout
    probes = pd.read_parquet(tiny_run/'analysis'/'probes.parquet')
    assert {'layer', 'task', 'metric', 'value'} <= set(probes.columns)
    assert set(probes['layer']) == set(range(5))          # embeddings + 4 layers of the tiny preset
    attention = pd.read_parquet(tiny_run/'analysis'/'attention.parquet')
    assert {'layer', 'head', 'pattern', 'value'} <= set(attention.columns)


def test_analyze_only_some_steps_keeps_the_others(tiny_run):
    before = pd.read_parquet(tiny_run/'analysis'/'attention.parquet')
    run_cli('analyze', tiny_run, '--attention', '--steps', '4', '--quiet')
    df = pd.read_parquet(tiny_run/'analysis'/'attention.parquet')
    assert set(df['step']) == {0, 4} and len(df) == len(before)          # step 4 recomputed (from the cache), step 0 kept


def test_analyze_bad_input(tmp_path, tiny_run):
    r = run_cli('analyze', tmp_path/'no-such-run', '--attention', check=False)
    assert r.returncode == 2 and 'no-such-run' in r.stderr and 'Traceback' not in r.stderr
    r = run_cli('analyze', tiny_run, '--attention', '--steps', '5', check=False)
    assert r.returncode == 2 and '5' in r.stderr and 'Traceback' not in r.stderr


def test_sweep_command_needs_a_grid(tmp_path):
    r = run_cli('sweep', '--out', tmp_path/'s', check=False)
    assert r.returncode == 2 and '--grid' in r.stderr and 'Traceback' not in r.stderr
