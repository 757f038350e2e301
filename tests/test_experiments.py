"""The experiment notebooks run through papermill with tiny parameters and write their results table (long frame and
the transfer table) with one row per L1 / intervention."""
import time
from pathlib import Path

import pandas as pd
import pytest

from nl_embryo.batch import IpcKernelManager   # the kernels talk over Unix sockets: no port race with the other worker's kernels

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = {'task', 'kind', 'seed', 'split', 'metric', 'value', 'primary', 'n_train', 'n_eval'}
TINY = dict(pretrain_steps=2, pretrain_batch_size=2, max_train=16, max_eval=8, finetune_steps=2, finetune_batch_size=4,
            seeds=[0, 1])      # two seeds: the smallest that gives an interval and a verdict per ordering
VERDICTS = {'holds', 'fails', 'within noise'}
INTERVENTION_ROWS = ['original', 'reversed', 'shuffled', 'clean embeddings', 'oracle', 'rescaled (variance)', 'rescaled (magnitude)',
                     'last half removed', 'every 2nd removed', 'clean', 'turkish', 'turkish + English embeddings',
                     'turkish, clean English embeddings', 'majority']


@pytest.mark.parametrize('name, row, parameters, rows', [
    ('l1_transfer', 'l1',
     dict(l1s=['none', 'nested-zipf-50', 'code', 'english'], substitute=['nested-zipf-50'], adapt=['code'], adapt_steps=1),
     ['none', 'nested-zipf-50', 'nested-zipf-50 (substitute)', 'code', 'code (adapted)', 'english', 'majority']),
    ('interventions', 'intervention', {}, INTERVENTION_ROWS),
])
def test_experiment_notebook_runs_with_papermill(tmp_path, monkeypatch, name, row, parameters, rows):
    import papermill as pm
    monkeypatch.setenv('OMP_NUM_THREADS', '1')          # the kernel inherits it: tiny models, and a CPU shared with others
    out_dir = tmp_path/'out'
    t0 = time.perf_counter()
    pm.execute_notebook(str(ROOT/'nbs'/'experiments'/f'{name}.ipynb'), str(tmp_path/f'{name}.ipynb'),
                        parameters=dict(TINY, out_dir=str(out_dir), **parameters), kernel_name='python3', progress_bar=False,
                        cwd=str(tmp_path), kernel_manager_class=IpcKernelManager)
    seconds = time.perf_counter() - t0
    results = pd.read_parquet(out_dir/'results.parquet')
    assert COLUMNS | {row} <= set(results.columns)
    assert list(dict.fromkeys(results[row])) == rows and set(results['split']) == {'dev', 'test'}
    assert set(results['task']) == {'sentiment', 'word-order'} and set(results['n_train']) <= {16}
    assert results['value'].notna().all() and results['value'].between(-1, 1).all()
    table = pd.read_csv(out_dir/'table.csv', index_col=0)
    assert list(table.index) == rows and list(table.columns) == ['sentiment', 'word-order', 'avg']
    assert (table['avg'] - table[['sentiment', 'word-order']].mean(axis=1)).abs().max() < 1e-9
    test = results[(results['split'] == 'test') & results['primary']].groupby([row, 'task'])['value'].mean().unstack()
    pd.testing.assert_frame_equal(test.loc[rows, ['sentiment', 'word-order']], table[['sentiment', 'word-order']],
                                  check_names=False, check_index_type=False)
    assert any((out_dir/'runs').iterdir())                   # out_dir given: the pre-training runs are kept
    summary = pd.read_csv(out_dir/'summary.csv')
    assert set(summary[row]) == set(rows) and (summary.loc[summary[row] != 'majority', 'n_seeds'] == 2).all()   # majority: one, seedless
    assert (summary['lo'].isna() | (summary['lo'] <= summary['mean'])).all()
    orderings = pd.read_csv(out_dir/'orderings.csv')
    assert len(orderings) and set(orderings['verdict']) <= VERDICTS
    print(f"{name}: {seconds:.0f} s")


def test_objectives_notebook_compares_at_equal_flops(tmp_path, monkeypatch):
    "BERT, ELECTRA, ALE and SCRIPT get the training FLOPs of the reference's steps: the logged FLOPs agree, the table has a row each."
    import json
    import papermill as pm
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    out_dir = tmp_path/'out'
    pm.execute_notebook(str(ROOT/'nbs'/'experiments'/'objectives.ipynb'), str(tmp_path/'objectives.ipynb'),
                        parameters=dict(reference_steps=6, batch_size=2, block_size=32, max_train=16, max_eval=8, finetune_steps=2,
                                        finetune_batch_size=4, seeds=[0, 1], out_dir=str(out_dir)),
                        kernel_name='python3', progress_bar=False, cwd=str(tmp_path), kernel_manager_class=IpcKernelManager)
    budget = pd.read_csv(out_dir/'budget.csv', index_col=0)
    assert list(budget.index) == ['bert', 'electra', 'ale', 'script']
    assert budget.loc['bert', 'steps'] == 6 and budget.loc['script', 'steps'] < budget.loc['bert', 'steps']   # two passes a step
    assert budget.loc['ale', 'parameters'] < budget.loc['electra', 'parameters']                             # shared layers
    for arch in budget.index:                                   # what the training loop logged is the budget
        rows = [json.loads(l) for l in (out_dir/'runs'/arch/'metrics.jsonl').read_text().splitlines()]
        logged = max(r.get('flops', 0) for r in rows)
        assert abs(logged - budget.loc[arch, 'training_flops']) <= 1e-6 * logged
        assert abs(logged / budget.loc['bert', 'training_flops'] - 1) <= 0.5 / (budget.loc[arch, 'steps'] - 0.5) + 1e-9   # half a step
    results = pd.read_parquet(out_dir/'results.parquet')
    assert list(dict.fromkeys(results['arch'])) == ['bert', 'electra', 'ale', 'script', 'majority']
    assert results['value'].notna().all() and set(results['split']) == {'dev', 'test'}
    table = pd.read_csv(out_dir/'table.csv', index_col=0)
    assert list(table.index) == ['bert', 'electra', 'ale', 'script', 'majority']
    assert list(table.columns) == ['sentiment', 'word-order', 'avg']
    assert set(pd.read_csv(out_dir/'orderings.csv')['verdict']) <= VERDICTS


@pytest.mark.parametrize('folder, notebook, row', [('interventions-cpu', 'interventions', 'intervention'),
                                                  ('l1-transfer-cpu', 'l1_transfer', 'l1'),
                                                  ('objectives-cpu', 'objectives', 'arch')])
def test_recorded_cpu_runs_agree_with_their_tables(folder, notebook, row):
    """The committed CPU runs of the experiment notebooks (nbs/data/experiments/*-cpu): every verdict in orderings.csv
    and the smallest difference the design detects follow from the per-seed values in summary.csv, each row has 3 seeds,
    and the notebook and the results summary quote both."""
    import json
    from nl_embryo.finetune import compare_rows
    d = ROOT/'nbs'/'data'/'experiments'/folder
    summary = pd.read_csv(d/'summary.csv')
    summary['values'] = summary['values'].map(json.loads)          # written as a list: [0.536, 0.566, 0.522]
    assert (summary.loc[summary[row] != 'majority', 'n_seeds'] == 3).all()     # 3 seeds per row
    recorded = pd.read_csv(d/'orderings.csv')
    assert len(recorded) and set(recorded['verdict']) <= VERDICTS
    pairs = [tuple(c.split(' > ')) for c in recorded['claim']]
    again = compare_rows(summary, pairs, row=row)
    assert list(again['verdict']) == list(recorded['verdict'])
    assert (again['difference'] - recorded['difference']).abs().max() < 1e-3
    assert (again['detectable'] - recorded['detectable']).abs().max() < 1e-9       # the smallest difference detectable at 80% power
    table = pd.read_csv(d/'table.csv', index_col=0)
    avg = summary[summary['task'] == 'avg'].set_index(row)['mean']
    assert (table['avg'] - avg.reindex(table.index)).abs().max() < 1e-3
    sources = {n: ''.join(''.join(c['source']) for c in json.loads((ROOT/'nbs'/'experiments'/f'{n}.ipynb').read_text())['cells'])
               for n in (notebook, 'results')}
    for r in recorded.itertuples():
        num = lambda x: f"{x:+.3f}".replace('-', '−')                      # the tables print a minus sign
        line = f"{r.claim} | {num(r.difference)} ({num(r.lo)}, {num(r.hi)}) | {r.verdict} | {r.detectable:.3f} |"
        assert line in sources[notebook], line
        assert line in sources['results'], line


def _parameter_cells():
    "(notebook, its parameters cell) for every notebook under nbs/ that papermill can run with parameters."
    import json
    for p in sorted((ROOT/'nbs').rglob('*.ipynb')):
        if '.ipynb_checkpoints' in p.parts: continue
        cells = [c for c in json.loads(p.read_text())['cells'] if 'parameters' in c.get('metadata', {}).get('tags', [])]
        if cells: yield p.relative_to(ROOT/'nbs').as_posix(), ''.join(cells[0]['source'])


PARAMETER_CELLS = dict(_parameter_cells())


def test_the_experiment_notebooks_take_parameters():
    assert {f'experiments/{n}.ipynb' for n in ('embryology', 'interventions', 'l1_transfer', 'objectives')} <= set(PARAMETER_CELLS)


@pytest.mark.parametrize('nb', sorted(PARAMETER_CELLS))
def test_papermill_reads_every_parameter(nb):
    """Every name the parameters cell assigns is one papermill can read (`papermill --help-notebook` lists it, and a sweep
    can pass it): a comment papermill cannot parse (an '=' or a quote in it) hides its line."""
    import ast, papermill as pm
    assigned = {t.id for node in ast.parse(PARAMETER_CELLS[nb]).body if isinstance(node, ast.Assign) for t in node.targets}
    read = set(pm.inspect_notebook(str(ROOT/'nbs'/nb)))
    assert assigned and assigned == read, f"papermill misses {sorted(assigned - read)}"


SEEDED = {   # the experiments over pre-training seeds: {the notebook stating them: their orderings}, and their arms
    'l1-seeds-cpu': ({'l1_transfer': [('english', 'nested-zipf'), ('nested-zipf', 'random'), ('random', 'none'),
                                      ('nested-zipf', 'none'), ('english', 'random')]}, {'english', 'nested-zipf', 'random', 'none'}),
    'l1-vocab-seeds-cpu': ({'l1_transfer': [('nested-zipf', 'zipf'), ('zipf', 'none'), ('nested-zipf-5000', 'nested-zipf-50'),
                                            ('nested-zipf-50 (substitute)', 'nested-zipf-50')]},
                           {'nested-zipf', 'zipf', 'nested-zipf-50', 'nested-zipf-50 (substitute)', 'nested-zipf-5000', 'none'}),
    'foreign-seeds-cpu': ({'l1_transfer': [('code (adapted)', 'code'), ('code', 'none'), ('english', 'code')],
                           'interventions': [('talmud', 'none'), ('talmud, clean English embeddings', 'none'),
                                             ('talmud + English embeddings', 'talmud, clean English embeddings'),
                                             ('english', 'talmud, clean English embeddings')]},
                          {'english', 'none', 'code', 'code (adapted)', 'talmud', 'talmud + English embeddings', 'talmud, clean English embeddings'}),
    'interventions-seeds-cpu': ({'interventions': [('original', 'reversed'), ('reversed', 'clean'), ('original', 'shuffled'),
                                                   ('shuffled', 'clean embeddings'), ('shuffled', 'clean'),
                                                   ('original', 'clean embeddings'), ('original', 'clean')]},
                                {'original', 'reversed', 'shuffled', 'clean embeddings', 'clean'}),
    'interventions-init-seeds-cpu': ({'interventions': [('oracle', 'clean'), ('oracle', 'rescaled (variance)'), ('oracle', 'rescaled (magnitude)'),
                                                        ('last half removed', 'clean'), ('original', 'last half removed')]},
                                     {'original', 'oracle', 'rescaled (variance)', 'rescaled (magnitude)', 'last half removed', 'clean'}),
    'objectives-seeds-cpu': ({'objectives': [('electra', 'bert'), ('ale', 'bert'), ('script', 'bert'), ('electra', 'ale'),
                                             ('electra', 'none'), ('ale', 'none'), ('script', 'none')]},
                             {'bert', 'electra', 'ale', 'script', 'none'}),
}


@pytest.mark.parametrize('folder', sorted(SEEDED))
def test_seeded_experiments_are_stated_as_their_data_say(folder):
    """The CPU experiments over 3 pre-training seeds: each arm has 3 pre-training seeds x 3 fine-tuning seeds on the same
    test items, every ordering's line in the notebook and in results.ipynb is what `compare_seeded` computes from the
    stored per-seed results, and its run record gives the time it took."""
    import json
    from nl_embryo.finetune import compare_seeded, seeded_arms, seeded_markdown
    stated, names = SEEDED[folder]
    arms = seeded_arms(ROOT/'nbs'/'data'/'experiments'/folder)      # as run.json names them: its own and the reused arms
    assert set(arms['arm']) == names
    test = arms[(arms.split == 'test') & arms.primary]
    assert (test.groupby('arm')[['pretrain_seed', 'seed']].nunique() == 3).all().all()
    assert test.groupby('arm')['n_eval'].nunique().eq(1).all() and test['n_eval'].nunique() == 1    # the same items in every arm
    info = json.loads((ROOT/'nbs'/'data'/'experiments'/folder/'run.json').read_text())
    assert 0 < info['minutes'] <= 60 and info['design']
    family = [o for orderings in stated.values() for o in orderings]    # the experiment's orderings: one Holm family
    for notebook, orderings in stated.items():
        seeded = compare_seeded(arms, orderings, family=family)
        assert (seeded['level_holm'] >= 0.95).all() and (seeded['adj_t_lo'] <= seeded['t_lo'] + 1e-12).all()
        assert not ((seeded['verdict'] != 'within noise') & (seeded['raw_verdict'] == 'within noise')).any()   # adjusting only withdraws verdicts
        for notebook_name in (notebook, 'results'):
            nb = json.loads((ROOT/'nbs'/'experiments'/f'{notebook_name}.ipynb').read_text())
            shown = ''.join(''.join(o.get('data', {}).get('text/markdown', '')) for c in nb['cells'] if c['cell_type'] == 'code'
                            for o in c.get('outputs', []))
            for line in seeded_markdown(seeded).splitlines()[2:]:          # raw and Holm-adjusted intervals and verdicts
                assert line in shown, (notebook_name, line)


def test_the_readme_counts_the_verdicts_that_holm_s_adjustment_withdraws():
    "The README's count of verdicts that hold (or fail) alone and are within noise after the Holm adjustment, recomputed."
    from nl_embryo.finetune import compare_seeded, seeded_arms
    withdrawn = {'holds': 0, 'fails': 0}
    for folder, (stated, _) in SEEDED.items():
        s = compare_seeded(seeded_arms(ROOT/'nbs'/'data'/'experiments'/folder), [o for os in stated.values() for o in os])
        assert (s.loc[s['raw_verdict'] != s['verdict'], 'verdict'] == 'within noise').all()
        for v in ('holds', 'fails'): withdrawn[v] += int(((s['raw_verdict'] == v) & (s['verdict'] == 'within noise')).sum())
    words = dict(enumerate(['no', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine']))
    readme = ' '.join((ROOT/'README.md').read_text().split())
    assert (f"({words[withdrawn['holds']]} that hold alone, and {words[withdrawn['fails']]} that fails alone, are within noise "
            "after it)") in readme, withdrawn


def test_english_vs_none_outcomes_are_stated_as_their_data_say():
    """English against no pre-training on more outcomes than POS tagging (english-vs-none-cpu/outcomes.py): two more
    fine-tuning tasks and the minimal pairs per phenomenon, 3 pre-training seeds each, one Holm family; the table the L1
    transfer notebook shows is what `compare_seeded` computes from the stored files, and the re-made runs are the stored
    runs' recipe (their last eval loss within 0.05 nat of the committed runs')."""
    import json
    import pandas as pd
    from nl_embryo.finetune import compare_seeded, seeded_markdown
    d = ROOT/'nbs'/'data'/'experiments'/'english-vs-none-cpu'
    ft, mp = pd.read_parquet(d/'outcomes.parquet'), pd.read_parquet(d/'minimal_pairs.parquet')
    test = ft[(ft.split == 'test') & ft.primary]
    assert set(test['task']) == {'brown-pos', 'sentiment', 'bbc-topic'} and set(test['step']) == {0, 900}
    assert (test.groupby(['task', 'step'])[['pretrain_seed', 'seed']].nunique() == 3).all().all()
    assert test.groupby('task')['n_eval'].nunique().eq(1).all()                      # the same test items in both arms
    assert mp.groupby(['phenomenon', 'step'])['pretrain_seed'].nunique().eq(3).all() and mp['phenomenon'].nunique() >= 3
    checks = pd.read_csv(d/'pretrain_check.csv')
    assert len(checks) == 3 and (checks['eval_mlm_loss'] - checks['stored']).abs().max() < 0.05
    pairs = mp.assign(arm=mp['step'].map({900: 'english', 0: 'none'}), seed=0, split='test', primary=True, task='pairs: ' + mp['phenomenon'])
    outcomes = pd.concat([ft.assign(arm=ft['step'].map({900: 'english', 0: 'none'})), pairs], ignore_index=True)
    tasks = ['brown-pos', 'sentiment', 'bbc-topic', *sorted(pairs['task'].unique())]
    oc = compare_seeded(outcomes, [('english', 'none')], task=tasks)
    assert len(oc) == len(tasks) and oc['level_holm'].max() > 0.99                    # one family over every outcome
    nb = json.loads((ROOT/'nbs'/'experiments'/'l1_transfer.ipynb').read_text())
    shown = ''.join(''.join(o.get('data', {}).get('text/markdown', '')) for c in nb['cells'] if c['cell_type'] == 'code'
                    for o in c.get('outputs', []))
    for line in seeded_markdown(oc, first='task').splitlines()[2:]:
        assert line in shown, line


def test_the_readme_states_the_outcomes_beyond_pos_as_their_data_say():
    "The README's sentence on English against no pre-training beyond POS tagging: the family's size and what holds, recomputed."
    import pandas as pd
    from nl_embryo.acquisition import acquisition_findings
    from nl_embryo.finetune import compare_seeded, seeded_outcomes
    from nl_embryo.stats import t_interval
    d = ROOT/'nbs'/'data'/'experiments'/'english-vs-none-cpu'
    outs, names = seeded_outcomes(d)
    oc = compare_seeded(outs, [('english', 'none')], task=names)
    holds = list(oc.loc[oc['verdict'] == 'holds', 'task'])
    words = dict(enumerate(['no', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine', 'ten']))
    pairs = sum(n.startswith('pairs: ') for n in names)
    readme = ' '.join((ROOT/'README.md').read_text().split())
    assert f"on sentiment, news topic and {words[pairs]} minimal-pair phenomena" in readme
    assert f"over those {words[len(names)]} outcomes it holds on {' and '.join(holds)} only" in readme, holds
    found = pd.DataFrame([acquisition_findings(g) for _, g in pd.read_parquet(d/'acquisition.parquet').groupby('pretrain_seed')])
    assert (found['diff_hi'] < 0).all() and t_interval(found['diff'])[2] < 0       # "before content words in every seed"
    assert "function words are acquired before content words in every seed" in readme


def test_l1_outcomes_are_stated_as_their_data_say():
    """English, nested-Zipf, random and no pre-training on the outcomes beyond POS tagging (l1-seeds-cpu/outcomes.py
    with english-vs-none-cpu's): every arm on the same tasks, test items and phenomena with 3 pre-training seeds, the
    five orderings on the nine outcomes one Holm family; the tables the L1 transfer notebook shows are what
    `compare_seeded` computes from the stored files."""
    import json
    from nl_embryo.finetune import compare_seeded, seeded_markdown, seeded_outcomes
    d = ROOT/'nbs'/'data'/'experiments'
    l1, tasks = seeded_outcomes(d/'l1-seeds-cpu', column='l1')
    ev, ev_tasks = seeded_outcomes(d/'english-vs-none-cpu')
    assert tasks == ev_tasks and set(l1['arm']) == {'nested-zipf', 'random'}
    both = pd.concat([l1, ev], ignore_index=True)
    test = both[(both.split == 'test') & both.primary]
    assert (test.groupby(['task', 'arm'])['pretrain_seed'].nunique() == 3).all() and test.groupby(['task', 'arm']).ngroups == 4 * len(tasks)
    assert test[~test.task.str.startswith('pairs: ')].groupby('task')['n_eval'].nunique().eq(1).all()   # the same test items in every arm
    mp = pd.concat([pd.read_parquet(d/'l1-seeds-cpu'/'minimal_pairs.parquet'), pd.read_parquet(d/'english-vs-none-cpu'/'minimal_pairs.parquet')])
    assert mp.groupby('phenomenon')['n'].nunique().eq(1).all()                                           # the same pairs in every arm
    checks = pd.read_csv(d/'l1-seeds-cpu'/'pretrain_check.csv')
    assert len(checks) == 6 and set(checks['l1']) == {'nested-zipf', 'random'} and checks['eval_mlm_loss'].notna().all()
    family = [('english', 'nested-zipf'), ('nested-zipf', 'random'), ('random', 'none'), ('nested-zipf', 'none'), ('english', 'random')]
    oc = compare_seeded(both, family, task=tasks)
    assert len(oc) == len(family) * len(tasks) and oc['level_holm'].max() > 1 - 0.05 / len(oc) - 1e-9   # one family of 45
    nb = json.loads((ROOT/'nbs'/'experiments'/'l1_transfer.ipynb').read_text())
    shown = ''.join(''.join(o.get('data', {}).get('text/markdown', '')) for c in nb['cells'] if c['cell_type'] == 'code'
                    for o in c.get('outputs', []))
    for line in seeded_markdown(oc, first='task').splitlines()[2:]:
        assert line in shown, line


def test_the_readme_states_the_l1_outcomes_as_their_data_say():
    "The README's sentence on the L1 experiment's orderings beyond POS tagging: the family's size and the one claim left, recomputed."
    from nl_embryo.finetune import compare_seeded, seeded_outcomes
    d = ROOT/'nbs'/'data'/'experiments'
    l1, tasks = seeded_outcomes(d/'l1-seeds-cpu', column='l1')
    family = [('english', 'nested-zipf'), ('nested-zipf', 'random'), ('random', 'none'), ('nested-zipf', 'none'), ('english', 'random')]
    oc = compare_seeded(pd.concat([l1, seeded_outcomes(d/'english-vs-none-cpu')[0]], ignore_index=True), family, task=tasks)
    left = oc[oc['verdict'] != 'within noise']
    assert list(zip(left['claim'], left['task'], left['verdict'])) == [('english > nested-zipf', 'pairs: irregular_past_participle', 'holds')]
    readme = ' '.join((ROOT/'README.md').read_text().split())
    assert (f"the five orderings of the L1 experiment on the same {len(tasks)} outcomes are a family of {len(oc)} claims"
            .replace(f" {len(tasks)} ", ' nine ') in readme)
    assert "one is left after the adjustment, English above nested-Zipf on irregular past participles" in readme
