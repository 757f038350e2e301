"""A timeline's own defects, named from its weights' bytes: step folders made from a real run's checkpoints with two
consecutive identical steps, a middle step holding the final step's weights and a sharded step whose first shard comes
from another step are each reported, `timeline --check` exits 1, and a genuine suite of the same layout (sharded step
included) reports nothing and exits 0; nothing is written into either source, and a second listing reads no weight
file. A suite of several branches (OLMo-2's stages and ingredients) lists every checkpoint with its branch, as a hub
cache and as step folders alike, and is analysed one branch at a time."""
import hashlib, json, os, shutil
from pathlib import Path

import pytest
import torch

from conftest import cli, train

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def cli_exit(capsys, *args):
    try: return cli(capsys, *args)
    except SystemExit as e:
        got = capsys.readouterr(); return e.code, got.out + got.err


def tree(root) -> dict:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(root).rglob('*')) if p.is_file()}


def as_model_folder(ck: Path, dest: Path, shards: bool = False) -> Path:
    "A checkpoint of nl_embryo's as a plain model folder (config, tokenizer, weights; sharded in two when `shards`)."
    from nl_embryo.models import load_model, quiet_transformers
    dest.mkdir(parents=True)
    for f in ck.iterdir():
        if f.suffix == '.json' and f.name not in ('manifest.json', 'trainer_state.json') or f.name == 'vocab.txt': shutil.copy(f, dest/f.name)
    if shards:
        with quiet_transformers(): load_model(ck).save_pretrained(dest, max_shard_size='3MB')
        assert (dest/'model.safetensors.index.json').exists()
    else: shutil.copy(ck/'model.safetensors', dest/'model.safetensors')
    return dest


@pytest.fixture(scope='module')
def suites(tmp_path_factory, small_corpus):
    "A genuine suite of step folders from a real run (step 4 sharded), and a damaged copy of it."
    base = tmp_path_factory.mktemp('integrity')
    run = train(base/'run', steps=8, checkpoints='0,1,2,4,6,8')
    ck = lambda s: run/'checkpoints'/f'step{s}'
    good = base/'good'
    for s in (0, 1, 2, 4, 6, 8): as_model_folder(ck(s), good/f'step{s}', shards=(s in (4, 8)))
    bad = base/'bad'; shutil.copytree(good, bad)
    shutil.rmtree(bad/'step1'); shutil.copytree(bad/'step0', bad/'step1')                           # (a) step 1 = step 0
    shutil.rmtree(bad/'step2'); as_model_folder(ck(8), bad/'step2')                                 # (b) a middle step holds the final weights
    first = sorted((bad/'step4').glob('model-00001-*.safetensors'))[0]                              # (c) step 4's first shard from step 8
    shutil.copy(bad/'step8'/first.name, first)
    return run, good, bad


def test_a_damaged_suite_names_each_anomaly_and_a_genuine_one_none(tmp_path, capsys, suites):
    run, good, bad = suites
    before = {k: tree(p) for k, p in (('good', good), ('bad', bad))}
    rc, said = cli_exit(capsys, 'timeline', good, '--out', tmp_path/'g', '--check')
    assert rc in (0, None) and 'none found' in said, said
    rc, said = cli_exit(capsys, 'timeline', bad, '--out', tmp_path/'b', '--check')
    assert rc == 1, said
    assert 'identical: steps 0 and 1 hold identical weights' in said
    assert 'duplicate: step 2 holds the same weights as step 8' in said
    assert 'mixed: step 4: its shard model-00001-of-' in said and "identical to step 8's" in said, said
    assert before == {k: tree(p) for k, p in (('good', good), ('bad', bad))}                         # nothing written into either source
    from nl_embryo.timeline import Run
    assert Run(run).integrity().empty                                                                # the run itself: its manifests, no anomaly


def test_a_second_listing_reads_no_weight_file(tmp_path, suites):
    from nl_embryo.integrity import DigestCache, integrity_table
    from nl_embryo.sources import read_source
    _, good, _ = suites
    cks = {s: c.path for s, c in read_source(good).checkpoints.items()}
    first = DigestCache(tmp_path); integrity_table(cks, first)
    again = DigestCache(tmp_path); integrity_table(cks, again)
    assert first.read == sum(len(list(p.glob('*.safetensors'))) for p in cks.values()) and again.read == 0
    assert first.embedding_reads == len(cks) and again.embedding_reads == 0         # the distances of the misplaced rule are kept too


def test_branches_are_listed_every_one_and_analysed_one_at_a_time(tmp_path, capsys, suites):
    run, good, _ = suites
    names = ['stage1-step1000-tokens4B', 'stage1-step2000-tokens8B', 'stage2-ingredient1-step500-tokens2B',
             'stage2-ingredient1-step1000-tokens4B', 'stage2-ingredient2-step500-tokens2B']
    dirs = tmp_path/'olmo'; hub = tmp_path/'hub'/'models--allenai--olmo-mini'; (hub/'refs').mkdir(parents=True)
    for k, n in enumerate(names):
        src = good/f'step{(0, 1, 2, 4, 6)[k]}'
        shutil.copytree(src, dirs/n)
        commit = hashlib.sha1(n.encode()).hexdigest(); shutil.copytree(src, hub/'snapshots'/commit); (hub/'refs'/n).write_text(commit)
    for where in (dirs, hub):
        rc, said = cli_exit(capsys, 'timeline', where, '--out', tmp_path/'o')
        assert rc in (0, None) and '3 branches' in said and all(b in said for b in ('stage1', 'stage2-ingredient1', 'stage2-ingredient2')), said
        assert said.count('safetensors') >= 5 and '--branch NAME' in said
        rc, said = cli_exit(capsys, 'analyze', where, '--out', tmp_path/'o2', '--attention', '--quiet')
        assert rc == 2 and 'holds 3 branches' in said and '--branch NAME' in said, said
    rc, said = cli_exit(capsys, 'timeline', hub, '--branch', 'stage2-ingredient1', '--out', tmp_path/'o3', '--no-record')
    assert rc in (0, None) and '2 checkpoint(s) to analyse' in said and '4000000000' in said, said


def test_analyze_names_the_anomalies_marks_the_steps_and_can_leave_them_out(tmp_path, capsys, suites):
    "analyze on the damaged suite: the anomalies printed and recorded, the steps marked in the tables and chart, --skip-suspect drops them."
    import pandas as pd
    from nl_embryo.timeline import Run
    _, _, bad = suites
    before = tree(bad)
    rc, said = cli_exit(capsys, 'analyze', bad, '--out', tmp_path/'a', '--weights', '--quiet')
    assert rc in (0, None), said
    assert '3 integrity anomalies' in said and 'duplicate: step 2 holds the same weights as step 8' in said and 'suspect step(s) 1, 2, 4' in said, said
    r = Run(bad, out=tmp_path/'a')
    assert r.table('integrity')[['kind', 'step']].values.tolist() == [['identical', 1], ['duplicate', 2], ['mixed', 4]]
    w = r.table('weights')
    assert sorted(w[w['suspect']]['step'].unique()) == [1, 2, 4] and not w[~w['step'].isin([1, 2, 4])]['suspect'].any()
    tok = w[(w.group == 'token embeddings') & (w.metric == 'dist_prev')].set_index('step')['value']
    assert tok[1] == 0 and tok[2] > tok[6]                      # the copy has not moved; the final weights at step 2 jump
    assert 'suspect checkpoint(s) at step 1, 2, 4' in r.chart_path('weights').with_suffix('.html').read_text()   # the chart's subtitle
    assert r.suspect_steps() == [1, 2, 4]
    rc, said = cli_exit(capsys, 'analyze', bad, '--out', tmp_path/'s', '--weights', '--skip-suspect', '--quiet')
    assert rc in (0, None) and 'leaving out the suspect step(s) 1, 2, 4' in said, said
    assert sorted(Run(bad, out=tmp_path/'s').table('weights')['step'].unique()) == [0, 6, 8]
    assert tree(bad) == before                                  # nothing written into the source


@pytest.mark.parametrize('name', ['demo', 'demo-gpt-neox', *(f'l1-seeds-{c}-seed{s}' for c in ('nested-zipf', 'random') for s in (0, 1, 2))])
def test_the_misplaced_rule_raises_nothing_on_nl_embryos_own_runs_and_names_a_swap(name):
    "The stored distance series of the demo, the causal demo and the L1 experiment's seeded runs (nbs/data/integrity): no false alarm; two checkpoints swapped: named."
    import pandas as pd
    from nl_embryo.integrity import misplaced_steps
    t = pd.read_csv(Path(__file__).resolve().parents[1]/'nbs'/'data'/'integrity'/f'{name}.csv')
    d0 = t[t.metric == 'dist_first'].set_index('step')['value'].to_dict()
    assert len(d0) >= 10 and d0[min(d0)] == 0
    assert misplaced_steps(d0) == []                                             # 0 false alarms over the run's interior steps
    steps = sorted(d0); a, b = steps[3], steps[-3]                              # an early checkpoint served a late one's weights
    swapped = {**d0, a: d0[b], b: d0[a]}
    assert {r['step'] for r in misplaced_steps(swapped)} & {a, b}
