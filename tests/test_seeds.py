"""Pre-training seeds in every interval: `nl-embryo pretrain --seeds` writes one run per seed, `nl-embryo analyze OUT`
reads them as one set, and the set's table gains rows whose interval is over the seeds and the evaluation items."""
import json

import numpy as np
import pandas as pd
import pytest

from conftest import MINI, cli, weights

N_IDS = 16   # token ids per checkpoint: the rows of the toy analysis (each over the 128 dimensions of its embedding)


def embedding_means_checkpoint(model, tokenizer, data):
    "Per token id: the mean of its embedding's coordinates, with a bootstrap interval over the coordinates (the items)."
    from nl_embryo.stats import cluster_bootstrap
    w = model.get_input_embeddings().weight.detach().numpy()
    rows = []
    for k in range(5, 5 + data['n_ids']):
        est, lo, hi = cluster_bootstrap(w[k], seed=k)
        rows.append(dict(token=k, value=est, lo=lo, hi=hi))
    return pd.DataFrame(rows)


@pytest.fixture
def embedding_means():
    "A cheap registered analysis (no data to build), removed afterwards."
    from nl_embryo.registry import ANALYSES, Analysis, register
    a = register(Analysis('embedding_means', 'Embedding means', embedding_means_checkpoint, lambda run, n_ids: [dict(n_ids=n_ids)],
                          defaults=dict(n_ids=N_IDS), data_options=('n_ids',), key=('token',)), replace=True)
    yield a
    ANALYSES.pop('embedding_means', None)


def pretrain_flags(out):
    "The `MINI` recipe of conftest.py as `nl-embryo pretrain` flags: 4 steps, checkpoints 0 and 4."
    flags = ['--preset', MINI['preset'], '--corpus', MINI['corpus'], '--block-size', MINI['block_size'], '--corpus-tokens', MINI['corpus_tokens'],
             '--batch-size', MINI['batch_size'], '--lr', MINI['lr'], '--eval-batches', MINI['eval_batches']]
    return ['pretrain', *flags, '--steps', 4, '--checkpoints', '0,4', '--out', out]


def test_seeds_pretrain_analyze_and_pool(tmp_path, capsys, small_corpus, one_torch_thread, embedding_means):
    out = tmp_path/'seeds'
    rc, text = cli(capsys, *pretrain_flags(out), '--seeds', '0,1', '--quiet')
    assert rc == 0, text
    assert (out/'seed0').is_dir() and (out/'seed1').is_dir() and not (out/'checkpoints').exists()
    c0, c1 = (json.loads((out/f'seed{s}'/'config.json').read_text())['config'] for s in (0, 1))
    assert (c0['seed'], c1['seed']) == (0, 1) and {k for k in c0 if c0[k] != c1[k]} == {'seed', 'out'}
    w0, w1 = weights(out/'seed0', 4), weights(out/'seed1', 4)
    assert any(not np.array_equal(w0[k].numpy(), w1[k].numpy()) for k in w0)

    rc, text = cli(capsys, *pretrain_flags(out), '--seeds', '0,1', '--resume')     # resumable: complete runs are left as they are
    assert rc == 0 and 'seed 0 (1/2)' in text and 'seed 1 (2/2)' in text, text
    assert all(np.array_equal(w0[k].numpy(), weights(out/'seed0', 4)[k].numpy()) for k in w0)

    rc, text = cli(capsys, 'analyze', out, '--embedding_means', '--quiet')
    assert rc == 0 and 'pooled over 2 pre-training seeds' in text, text
    table = pd.read_parquet(out/'analysis'/'embedding_means.parquet')
    pooled, own = table[table['n_seeds'] > 1], table[table['n_seeds'] == 1]
    assert set(own['run']) == {'seed0', 'seed1'} and (pooled['n_seeds'] == 2).all() and len(pooled) == 2 * N_IDS
    assert set(pooled['run']) == {'seeds (2 seeds)'}
    key = ['step', 'token']
    m = pooled.merge(own[own['run'] == 'seed0'][key + ['value', 'lo', 'hi']], on=key, suffixes=('', '_0')) \
              .merge(own[own['run'] == 'seed1'][key + ['value', 'lo', 'hi']], on=key, suffixes=('', '_1'))
    width, w_0, w_1 = m['hi'] - m['lo'], m['hi_0'] - m['lo_0'], m['hi_1'] - m['lo_1']
    assert np.allclose(m['value'], (m['value_0'] + m['value_1']) / 2)
    # at least as wide as either seed's item-only interval where the seeds differ; where they agree, as wide within resampling noise
    apart = (m['value_0'] - m['value_1']).abs() > np.maximum(w_0, w_1) / 2
    assert apart.sum() >= 3, m[key + ['value_0', 'value_1']]
    assert (width[apart] >= np.maximum(w_0, w_1)[apart]).all()
    assert (width >= 0.97 * (w_0 + w_1) / 2).all()
    assert (m['lo'] <= np.minimum(m['value_0'], m['value_1'])).all() and (m['hi'] >= np.maximum(m['value_0'], m['value_1'])).all()


def test_one_seed_says_so(tmp_path, capsys, small_corpus, one_torch_thread, embedding_means):
    from nl_embryo.registry import analyze_runs, runs_chart
    out = tmp_path/'one'
    rc, text = cli(capsys, *pretrain_flags(out), '--seeds', '3', '--steps', 1, '--checkpoints', '0,1', '--quiet')
    assert rc == 0 and (out/'seed3'/'config.json').exists(), text
    df = analyze_runs(out, 'embedding_means', progress=False)
    assert set(df['run']) == {'seed3'} and (df['n_seeds'] == 1).all()
    assert 'one pre-training seed' in runs_chart(df[df['token'] == 5]).to_dict()['title']
    rc, text = cli(capsys, *pretrain_flags(out), '--seeds', '3,4', '--steps', 1, '--checkpoints', '0,1', '--resume', '--quiet')
    assert rc == 0 and (out/'seed4'/'checkpoints'/'step1').is_dir(), text          # --resume starts a seed not yet begun
    rc, text = cli(capsys, *pretrain_flags(tmp_path/'bad'), '--seeds', '1,1')
    assert rc == 2 and 'distinct seeds' in text
