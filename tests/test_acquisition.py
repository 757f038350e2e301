"Words' age of acquisition, minimal pairs (and syntactic heads) over real timelines: nl_embryo's own seeds (masked), their exposure counts, the CLI over a folder of seeds."
import json
import warnings

import numpy as np
import pandas as pd
import pytest

from conftest import cli
from nl_embryo.timeline import Run

SMALL = dict(max_words=30)     # 30 words, 16 contexts each: seconds per checkpoint of a mini model (the CLI's --acquisition 30 reuses them)


@pytest.fixture(scope='module')
def en_seeds(tmp_path_factory):
    "Two seeds of a mini BERT on English, 16 steps, five checkpoints (four after step 0: the fewest a sigmoid is fitted to)."
    import torch
    from nl_embryo.pretrain import PretrainConfig, pretrain_seeds
    out = tmp_path_factory.mktemp('acq')/'en-seeds'
    n = torch.get_num_threads(); torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', message='.*unigram plateau')
            pretrain_seeds(PretrainConfig(out=str(out), arch='bert', preset='mini', corpus='english', steps=16, batch_size=8, block_size=64,
                                          checkpoints='0,2,4,8,16', lr=3e-3, eval_batches=1), seeds=(0, 1), quiet=True)
    finally: torch.set_num_threads(n)
    return out


def test_exposures_count_every_token_the_run_read(reference):
    "Over every piece id, the exposures before step s add up to the tokens the run's log says it had read by then."
    from nl_embryo.acquisition import exposure_counts
    run = Run(reference)
    V = len(run.tokenizer())
    seen = {s: exposure_counts(run, {i: i for i in range(V)}, {i: s for i in range(V)}) for s in (2, 4)}
    tokens = {r['step']: r['tokens_seen'] for r in map(json.loads, (reference/'metrics.jsonl').read_text().splitlines()) if 'tokens_seen' in r}
    assert sum(seen[2].values()) == tokens[2] and sum(seen[4].values()) == tokens[4] > tokens[2]
    assert all(seen[4][i] >= seen[2][i] for i in range(V))


def test_acquisition_on_a_masked_run_gives_ages_exposures_charts_and_a_section(en_seeds):
    from nl_embryo.analysis import analyze, report_section
    from nl_embryo.acquisition import acquisition_findings
    run = Run(en_seeds/'seed0')
    curves = analyze(run, 'acquisition', progress=False, **SMALL)
    assert set(curves['step']) == {0, 2, 4, 8, 16} and (curves['prediction'] == 'masked').all()
    assert curves.groupby('step')['word'].nunique().eq(curves['word'].nunique()).all() and (curves['n'] == 16).all()
    aoa = run.table('acquisition')
    assert aoa['word'].is_unique and set(aoa['word']) == set(curves['word'])
    assert {'word', 'aoa', 'lo', 'hi', 'pos', 'frequency', 'n_contexts', 'upper', 'lower', 'xmid', 'scale', 'r2', 'acquired', 'exposures'} <= set(aoa)
    fitted = aoa[aoa['aoa'].notna()]
    assert len(fitted) and (fitted['aoa'] <= np.log10(16) + 1e-9).all() and (aoa['value'].fillna(-1) == aoa['aoa'].fillna(-1)).all()
    got = aoa[aoa['acquired']]
    tokens = 16 * 8 * 64
    assert got['exposures'].notna().all() and (got['exposures'] >= 0).all() and (got['exposures'] <= tokens).all()
    assert aoa.loc[~aoa['acquired'], 'exposures'].isna().all()
    f = acquisition_findings(aoa)
    assert f['n_words'] == len(fitted[fitted['frequency'] > 0]) and (np.isnan(f['rho']) or f['rho_lo'] <= f['rho_hi'])
    assert (run.path/'analysis'/'acquisition_frequency.png').read_bytes()[:4] == b'\x89PNG'
    s = report_section(run, 'acquisition')
    assert any(isinstance(p, str) and 'Spearman' in p and 'Chang and Bergen' in p for p in s.parts), s.markdown()
    again = analyze(run, 'acquisition', progress=False, **SMALL)         # cached per checkpoint: the same rows, the summary rebuilt alike
    pd.testing.assert_frame_equal(again.sort_values(['step', 'word']).reset_index(drop=True)[['step', 'word', 'value']],
                                  curves.sort_values(['step', 'word']).reset_index(drop=True)[['step', 'word', 'value']])
    assert len(run.table('acquisition')) == len(aoa)


def test_analyze_a_folder_of_seeds_pools_the_ages(en_seeds, capsys):
    rc, text = cli(capsys, 'analyze', en_seeds, '--acquisition', '30', '--quiet')
    assert rc == 0 and 'acquisition: ' in text and 'pooled over 2 pre-training seeds' in text, text
    table = pd.read_parquet(en_seeds/'analysis'/'acquisition.parquet')
    own, pooled = table[table['n_seeds'] == 1], table[table['n_seeds'] > 1]
    assert set(own['run']) == {'seed0', 'seed1'} and len(pooled) == pooled['word'].nunique() > 0
    both = own.pivot_table(index='word', columns='run', values='value')
    m = pooled.set_index('word')[['value', 'lo', 'hi']].join(both, how='inner').dropna()
    assert len(m) and np.allclose(m['value'], (m['seed0'] + m['seed1']) / 2)
    assert (m['lo'] <= m[['seed0', 'seed1']].min(axis=1) + 1e-9).all() and (m['hi'] >= m[['seed0', 'seed1']].max(axis=1) - 1e-9).all()
    from nl_embryo.cli import make_parser
    helptext = make_parser()._subparsers._group_actions[0].choices['analyze'].format_help()
    assert '--acquisition' in helptext and 'age of acquisition' in helptext and '--syntax_heads' in helptext
    rc, text = cli(capsys, 'analyze', en_seeds, '--syntax_heads', '--steps', '0,16', '--quiet')     # the syntactic heads over seeds too
    assert rc == 0 and 'syntax_heads: ' in text and 'pooled over 2 pre-training seeds' in text, text
    sh = pd.read_parquet(en_seeds/'analysis'/'syntax_heads.parquet')
    pooled = sh[sh['n_seeds'] > 1]
    assert len(pooled) == sh[sh['run'] == 'seed0'].shape[0] and (pooled['lo'] <= pooled['hi']).all() and set(pooled['step']) == {0, 16}


def test_minimal_pairs_on_a_masked_run_give_accuracies_baselines_onsets_and_a_section(en_seeds):
    "Per phenomenon and step, accuracy with its interval beside the unigram baseline and the step-0 network; onsets among the phases; cached."
    from nl_embryo.analysis import analyze, report_section
    from nl_embryo.minimal_pairs import PHENOMENA, with_step0
    run = Run(en_seeds/'seed0')
    df = analyze(run, 'minimal_pairs', max_pairs=8, progress=False)
    assert set(df['step']) == {0, 2, 4, 8, 16} and set(df['phenomenon']) == set(PHENOMENA) and (df['n'] == 8).all()
    assert ((df['lo'] <= df['value']) & (df['value'] <= df['hi'])).all() and df['value'].between(0, 1).all()
    assert (df['scorer'] == 'pseudo-log-likelihood').all() and 'untrained' not in df          # step 0 is the step-0 network
    assert df.groupby('phenomenon')['unigram'].nunique().eq(1).all()                           # the same pairs at every step
    b = with_step0(df)
    zero = df[df['step'] == 0].set_index('phenomenon')['value']
    assert np.allclose(b['step0'], b['phenomenon'].map(zero)) and (b['baseline_hi'] >= 0.5).all()
    phases = [p for p in run.phases().to_dict('records') if p['source'] == 'minimal_pairs']
    assert {p['phase'] for p in phases} == {f'minimal pairs: {ph}' for ph in PHENOMENA}
    for p in phases: assert p['step'] is None or pd.isna(p['step']) or p['lo'] > p['reference']
    assert (run.path/'analysis'/'minimal_pairs.png').read_bytes()[:4] == b'\x89PNG'
    s = report_section(run, 'minimal_pairs')
    assert any(isinstance(p, str) and 'unigram model of word frequencies' in p for p in s.parts), s.markdown()
    again = analyze(run, 'minimal_pairs', max_pairs=8, progress=False)
    pd.testing.assert_frame_equal(again.sort_values(['step', 'phenomenon']).reset_index(drop=True)[['step', 'phenomenon', 'value', 'lo']],
                                  df.sort_values(['step', 'phenomenon']).reset_index(drop=True)[['step', 'phenomenon', 'value', 'lo']])


def test_analyze_a_folder_of_seeds_pools_the_minimal_pairs(en_seeds, capsys):
    rc, text = cli(capsys, 'analyze', en_seeds, '--minimal-pairs', '8', '--steps', '0,16', '--quiet')
    assert rc == 0 and 'minimal_pairs: ' in text and 'pooled over 2 pre-training seeds' in text, text
    t = pd.read_parquet(en_seeds/'analysis'/'minimal_pairs.parquet')
    own, pooled = t[t['n_seeds'] == 1], t[t['n_seeds'] > 1]
    assert set(own['run']) == {'seed0', 'seed1'} and len(pooled) == 2 * 6 and set(pooled['step']) == {0, 16}
    both = own.pivot_table(index=['phenomenon', 'step'], columns='run', values='value')
    m = pooled.set_index(['phenomenon', 'step'])[['value']].join(both)
    assert np.allclose(m['value'], (m['seed0'] + m['seed1']) / 2) and (pooled['lo'] <= pooled['hi']).all()
    rc, text = cli(capsys, 'analyze', en_seeds/'seed0', '--syntax-heads', '--steps', '16', '--quiet')   # the hyphenated flags work alike
    assert rc == 0 and 'syntax_heads: ' in text, text


def test_a_folder_of_seeds_gets_the_model_intrinsic_analyses_with_seeds_compared(en_seeds, capsys):
    "ICL pooled over seeds, similarity between the seeds at each step, and a stage table per seed."
    rc, text = cli(capsys, 'analyze', en_seeds, '--icl', '8', '--similarity', '128', '--essential-dynamics', '8', '--steps', '0,8,16', '--quiet')
    assert rc == 0 and 'icl: ' in text and 'similarity_seeds: ' in text and 'essential_dynamics' in text, text
    for seed in ('seed0', 'seed1'):                                    # each seed's own output path over the three steps
        ed = pd.read_parquet(en_seeds/seed/'analysis'/'essential_dynamics.parquet')
        assert list(ed['step']) == [0, 8, 16] and ed['angle'].notna().sum() == 1 and (ed['n_tokens'] > 10).all()
    icl = pd.read_parquet(en_seeds/'analysis'/'icl.parquet')
    assert (icl['n_seeds'] == 2).any() and set(icl['run']) >= {'seed0', 'seed1'}
    seeds = pd.read_parquet(en_seeds/'analysis'/'similarity_seeds.parquet')
    assert set(seeds['step']) == {0, 8, 16} and set(zip(seeds['run_a'], seeds['run_b'])) == {('seed0', 'seed1')} and seeds['value'].between(0, 1).all()
    run = Run(en_seeds/'seed0')
    assert set(run.table('similarity')['step']) == {0, 8, 16}
    from nl_embryo.stages import STAGE_COLUMNS, stages_section
    st = run.stages()                                                  # 16 steps: perhaps no event, but every reached phase is one
    assert list(st.columns) == STAGE_COLUMNS and set(st['kind']) <= {'onset', 'boundary'} and st['step'].is_monotonic_increasing
    assert (st['kind'] == 'onset').sum() == run.phases()['step'].notna().sum()
    parts = stages_section(run)
    assert parts[0].startswith(f"{(st['kind'] == 'onset').sum()} behavioural onset(s) and {(st['kind'] == 'boundary').sum()} model-intrinsic")
    from nl_embryo.cli import make_parser
    helptext = make_parser()._subparsers._group_actions[0].choices['analyze'].format_help()
    assert all(f in helptext for f in ('--icl', '--similarity', '--essential-dynamics', '--llc', '--minimal-pairs', '--syntax-heads'))
