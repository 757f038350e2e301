"""MultiBERTs as published: checkpoints of class `BertForPreTraining` (an MLM head beside the next-sentence head) get
every analysis that reads a masked-LM head, through that head: the same numbers as the same weights read as a
`BertForMaskedLM`. ELECTRA's `*ForPreTraining`, a discriminator, is still refused by name."""
import json, shutil, warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from nl_embryo.core import NlEmbryoError
from nl_embryo.timeline import Run

pytestmark = pytest.mark.usefixtures('one_torch_thread')
STEPS = (0, 20)


@pytest.fixture(scope='module')
def suites(tmp_path_factory, english_tokenizer):
    "Two step-folder suites of the same weights: as published (BertForPreTraining), and relabelled BertForMaskedLM."
    from transformers import BertConfig, BertForPreTraining
    from nl_embryo.models import quiet_transformers
    root = tmp_path_factory.mktemp('multiberts')
    tok = english_tokenizer
    for s in STEPS:
        torch.manual_seed(s)
        with quiet_transformers():
            m = BertForPreTraining(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                              max_position_embeddings=128, architectures=['BertForPreTraining']))
        m.save_pretrained(root/'published'/f'step{s}'); tok.save_pretrained(root/'published'/f'step{s}')
    shutil.copytree(root/'published', root/'relabelled')
    for s in STEPS:
        cfg = root/'relabelled'/f'step{s}'/'config.json'
        cfg.write_text(json.dumps(dict(json.loads(cfg.read_text()), architectures=['BertForMaskedLM'])))
    notes = root/'eval.txt'
    notes.write_text('\n'.join(["The cat sat on the mat and looked at the birds outside.", "She walked to the market to buy fresh bread.",
                                "They have been working on the new bridge for two years."] * 60) + '\n')
    return root, notes


OPTIONS = dict(reconstruction=dict(per_group=12), knowledge=dict(), surgery=dict(surgeries='identity,reverse', eval_batches=2, batch_size=4, probe=False))


@pytest.mark.parametrize('name', list(OPTIONS))
def test_a_bert_for_pretraining_suite_is_read_through_its_mlm_head(tmp_path, suites, name):
    from nl_embryo.analysis import analyze
    root, notes = suites
    got = {}
    for kind in ('published', 'relabelled'):
        run = Run(root/kind, out=tmp_path/kind, eval_text=notes)
        assert run.model_config()['architectures'] == ['BertForPreTraining' if kind == 'published' else 'BertForMaskedLM']
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            got[kind] = analyze(run, name, progress=False, charts=False, **OPTIONS[name])
    a, b = (got[k].drop(columns=[c for c in ('options',) if c in got[k]]).reset_index(drop=True) for k in ('published', 'relabelled'))
    assert sorted(set(a['step'])) == list(STEPS) and len(a) == len(b) > 0
    pd.testing.assert_frame_equal(a, b)                                  # the MLM head of BertForPreTraining is BertForMaskedLM's


def test_pseudo_log_likelihood_of_a_bert_for_pretraining(suites):
    from nl_embryo.scoring import score_sentences
    root, _ = suites
    m, tok = Run(root/'published').load(20)
    assert type(m).__name__ == 'BertForPreTraining'
    mm, _ = Run(root/'relabelled').load(20)
    s = ['The cat sat on the mat.', 'She walked to the market.']
    a, b = score_sentences(m, tok, s), score_sentences(mm, tok, s)
    assert len(a) and np.allclose(a['score'], b['score'], atol=1e-5) and (a['score'] < 0).all()


def test_electra_s_discriminator_is_still_refused(tmp_path, english_tokenizer):
    from transformers import ElectraConfig, ElectraForPreTraining
    from nl_embryo.models import quiet_transformers
    from nl_embryo.registry import check_needs
    with quiet_transformers():
        ElectraForPreTraining(ElectraConfig(vocab_size=len(english_tokenizer), embedding_size=16, hidden_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, intermediate_size=64)).save_pretrained(tmp_path/'suite'/'step5')
    english_tokenizer.save_pretrained(tmp_path/'suite'/'step5')
    with pytest.raises(NlEmbryoError, match='ElectraForPreTraining without a masked-LM head'):
        check_needs(('mlm_head',), Run(tmp_path/'suite', out=tmp_path/'A'), 'reconstruction')


@pytest.fixture(scope='module')
def seed_layouts(tmp_path_factory, english_tokenizer):
    "Two seeds x steps 0 and 20k of BertForPreTraining, in MultiBERTs' two layouts: seed_K/step_Nk folders, and flat multiberts-seed_K-step_Nk ones."
    from transformers import BertConfig, BertForPreTraining
    from nl_embryo.models import quiet_transformers
    root, tok = tmp_path_factory.mktemp('multiberts-seeds'), english_tokenizer
    for seed in (0, 1):
        for k in (0, 20):
            torch.manual_seed(100 * seed + k)
            with quiet_transformers():
                m = BertForPreTraining(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                                  max_position_embeddings=128, architectures=['BertForPreTraining']))
            for d in (root/'nested'/f'seed_{seed}'/f'step_{k}k', root/'flat'/f'multiberts-seed_{seed}-step_{k}k'):
                m.save_pretrained(d); tok.save_pretrained(d)
    return root


@pytest.mark.parametrize('layout', ['nested', 'flat', 'named'])
def test_multiberts_seed_layouts_give_one_table_with_intervals_over_seeds(tmp_path, capsys, seed_layouts, layout):
    from conftest import cli
    from nl_embryo.registry import seed_branches, seed_runs
    nested = seed_layouts/'nested'
    args = {'nested': [nested], 'flat': [seed_layouts/'flat'], 'named': [nested/'seed_0', nested/'seed_1']}[layout]
    assert (seed_runs(nested) == [nested/'seed_0', nested/'seed_1'] and seed_runs(nested/'seed_0') == []
            and seed_branches(seed_layouts/'flat') == ['seed0', 'seed1'] and seed_branches(nested/'seed_0') == [])
    rc, said = cli(capsys, 'analyze', *args, '--out', tmp_path/'A', '--probes', 'pos', '--quiet')
    assert rc == 0 and '2 runs' in said and 'pooled over 2 pre-training seeds' in said, said[-2000:]
    df = pd.read_parquet(tmp_path/'A'/'analysis'/'probes.parquet')                    # the set's table, written
    runs = {'nested': ['seed_0', 'seed_1'], 'flat': ['seed0', 'seed1'], 'named': ['seed_0', 'seed_1']}[layout]
    group = ('flat' if layout == 'flat' else 'nested') + ' (2 seeds)'
    assert list(df['run'].unique()) == [*runs, group]
    pooled = df[df['run'] == group]
    acc = pooled[(pooled.metric == 'accuracy') & (pooled.task == 'pos')]
    assert (acc['n_seeds'] == 2).all() and sorted(set(acc['step'])) == [0, 20000]
    per_seed = df[df['run'].isin(runs) & (df.metric == 'accuracy') & (df.task == 'pos')].groupby(['step', 'layer'])['value'].mean()
    mean = acc.set_index(['step', 'layer'])['value']
    assert np.allclose(mean.sort_index(), per_seed.sort_index())                        # the pooled row: the mean over seeds
    assert (acc['lo'] <= acc['value']).all() and (acc['value'] <= acc['hi']).all() and (acc['hi'] > acc['lo']).all()


def hub_root_of(tmp_path, layouts) -> Path:
    "A hub cache root as downloading google/multiberts-seed_K-step_Nk leaves it: one repository per checkpoint, snapshots linked into blobs/."
    import hashlib
    hub = tmp_path/'hub'
    for ck in sorted((layouts/'flat').iterdir()):
        repo = hub/f'models--google--{ck.name}'
        commit = hashlib.sha1(ck.name.encode()).hexdigest()
        for f in ck.iterdir():
            blob = hashlib.sha256(f.read_bytes()).hexdigest()
            (repo/'blobs').mkdir(parents=True, exist_ok=True); shutil.copy(f, repo/'blobs'/blob)
            (repo/'snapshots'/commit).mkdir(parents=True, exist_ok=True)
            (repo/'snapshots'/commit/f.name).symlink_to(Path('..')/'..'/'blobs'/blob)
        (repo/'refs').mkdir(); (repo/'refs'/'main').write_text(commit)
    return hub


def test_a_hub_root_of_one_repository_per_step_is_one_timeline_per_seed(tmp_path, capsys, seed_layouts):
    from conftest import cli
    from nl_embryo.sources import read_source
    hub = hub_root_of(tmp_path, seed_layouts)
    src = read_source(hub)
    assert src.kind == 'hub cache' and sorted(src.branches) == ['seed0', 'seed1'] and src.branch is None
    assert sorted(read_source(hub, branch='seed1').checkpoints) == [0, 20000] and Run(hub, branch='seed0', out=tmp_path/'one').steps() == [0, 20000]
    rc, said = cli(capsys, 'analyze', hub, '--out', tmp_path/'A', '--probes', 'pos', '--quiet')
    assert rc == 0 and 'pooled over 2 pre-training seeds' in said, said[-2000:]
    df = pd.read_parquet(tmp_path/'A'/'analysis'/'probes.parquet')
    assert list(df['run'].unique()) == ['seed0', 'seed1', 'hub (2 seeds)']
    flat = pd.read_parquet(next((tmp_path/'A').glob('0-seed0'))/'analysis'/'probes.parquet')
    assert sorted(set(flat['step'])) == [0, 20000]
