"""The analysis contract (`nl_embryo.registry`, the built-in list in `nl_embryo.analysis`): one registry read by `nl-embryo analyze`, the demo and the report;
tables that accumulate; report sections that render on a run with no analysis yet."""
import contextlib, io

import pandas as pd
import pytest

from nl_embryo.analysis import ANALYSES, Analysis, analyses, analyze, register, report_section, show_section
from nl_embryo.timeline import Run


@pytest.fixture(scope='module')
def run(reference):
    """The shared mini BERT of conftest.py (4 steps on the small nested-zipf corpus, checkpoints 0, 2 and 4). Nothing here
    depends on its batch size or learning rate; these tests write only their own `toy_norms` table into its analysis/."""
    return Run(reference)


def _norms(model, tokenizer, data, n_ids=50):
    return pd.DataFrame([dict(metric='embedding norm', value=float(model.get_input_embeddings().weight[5:5 + n_ids].detach().norm()))])


@pytest.fixture
def toy():
    "An analysis registered in one place, removed again after the test."
    a = register(Analysis('toy_norms', 'Toy norms', _norms, lambda run: [None], defaults=dict(n_ids=50),
                          section=lambda run, t: ['the norm of the first embeddings', t['toy_norms']],
                          cli=dict(option='n_ids', metavar='N', parse=int, help='toy: how many embeddings'),
                          description='toy: embedding norms'))
    yield a
    del ANALYSES['toy_norms']


def test_a_registered_analysis_appears_in_the_cli_the_demo_and_the_report(run, toy):
    from nl_embryo.cli import make_parser
    from nl_embryo.demo import report_notebook, run_analyses
    helptext = make_parser()._subparsers._group_actions[0].choices['analyze'].format_help()
    assert '--toy_norms' in helptext and 'toy: how many embeddings' in helptext
    frames = run_analyses(run.path, steps=[0, 4], progress=False, analyses=['toy_norms'])
    assert set(frames['toy_norms'].step) == {0, 4} and run.has_table('toy_norms')
    nb = report_notebook(run.path)
    assert any("show_section(run, report_analysis('toy_norms'))" in c.source for c in nb.cells)
    assert report_section(run, 'toy_norms').parts[0] == 'the norm of the first embeddings'


def test_tables_accumulate_over_steps_and_options(run, toy):
    analyze(run, 'toy_norms', steps=[0], progress=False)
    analyze(run, 'toy_norms', steps=[2, 4], progress=False)
    analyze(run, 'toy_norms', steps=[4], progress=False, n_ids=10)
    t = run.table('toy_norms')
    assert sorted(t[t.options == toy.key_of(toy.options())].step) == [0, 2, 4]
    assert sorted(t[t.options == toy.key_of(toy.options(n_ids=10))].step) == [4]
    analyze(run, 'toy_norms', steps=[2], progress=False)                 # recomputing a step replaces its row only
    assert len(run.table('toy_norms')) == 4


def test_every_report_section_renders_on_a_run_with_no_analyses(run):
    from nl_embryo.pretrain import PretrainConfig, pretrain
    empty = Run(pretrain(PretrainConfig(out=str(run.path.parent/'empty'), preset='mini', corpus='nested-zipf', block_size=32,
                                        corpus_tokens=40_000, steps=1, batch_size=4, checkpoints='0,1', eval_batches=1), quiet=True))
    for name, a in analyses().items():
        s = report_section(empty, name)
        assert s.title == a.title and 'nl-embryo analyze' in s.markdown() and f'--{name}' in s.markdown(), name
        with contextlib.redirect_stdout(io.StringIO()): show_section(empty, name)


def test_unknown_analysis_and_option(run):
    from nl_embryo.core import NlEmbryoError
    with pytest.raises(NlEmbryoError, match='unknown analysis'): analyze(run, 'astrology')
    with pytest.raises(NlEmbryoError, match='no option'): analyze(run, 'probes', n_wordz=10)


@pytest.fixture(scope='module')
def encoder(tmp_path_factory, run):
    "A folder holding a BERT encoder without a masked-LM head, with the run's tokenizer."
    from transformers import BertConfig, BertModel
    from nl_embryo.models import quiet_transformers
    tok = run.load(0)[1]
    folder = tmp_path_factory.mktemp('encoder')/'encoder'
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    with quiet_transformers(): BertModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize('name', sorted(analyses()))
def test_needs_are_checked_before_any_checkpoint_is_loaded(name, encoder, monkeypatch):
    "Every analysis that declares it needs an MLM head refuses an encoder without one, naming the need, before loading anything."
    from nl_embryo.core import NlEmbryoError
    from nl_embryo.registry import check_needs, part_for
    a = analyses()[name]
    monkeypatch.setattr(Run, 'load', lambda *a, **k: pytest.fail('a checkpoint was loaded'))
    if {'mlm_head', 'lm_head'} & set(a.needs):                    # a masked or causal LM head: an encoder has neither
        with pytest.raises(NlEmbryoError, match='without a masked-LM head'): analyze(encoder, name, progress=False)
    else:
        check_needs(a.needs, encoder, name)                       # nothing this analysis needs is missing from an encoder
    assert part_for(a.needs, encoder) == 'auto'


def test_part_follows_needs_on_a_pair(tmp_path):
    "An analysis that needs the MLM head reads an ELECTRA pair's generator; the others read the discriminator ('auto')."
    from nl_embryo.pretrain import PretrainConfig, pretrain
    from nl_embryo.registry import part_for
    pair = Run(pretrain(PretrainConfig(out=str(tmp_path/'pair'), arch='electra', preset='mini', corpus='nested-zipf', block_size=32,
                                       corpus_tokens=40_000, steps=1, batch_size=4, checkpoints='0,1', eval_batches=1), quiet=True))
    assert pair.is_pair() and part_for(('mlm_head',), pair) == 'generator' and part_for((), pair) == 'auto'


def test_unknown_need_is_refused(run):
    from nl_embryo.core import NlEmbryoError
    from nl_embryo.registry import check_needs
    with pytest.raises(NlEmbryoError, match="unknown need"): check_needs(('gpu',), run)


def test_registered_phase_detector_reaches_run_phases(run, toy):
    "An analysis's phase detector joins `Run.phases()` when it is registered, and leaves when it is replaced."
    from nl_embryo.timeline import PHASE_DETECTORS
    mark = lambda r: [dict(phase='toy phase', step=2, value=1.0, reference=0.0, source='toy_norms', detail='')]
    a = register(Analysis('toy_norms', 'Toy norms', _norms, lambda run: [None], phases=mark), replace=True)
    assert 'toy phase' in set(run.phases()['phase']) and mark in PHASE_DETECTORS
    register(Analysis('toy_norms', 'Toy norms', _norms, lambda run: [None]), replace=True)
    assert 'toy phase' not in set(run.phases()['phase']) and mark not in PHASE_DETECTORS


def test_the_registry_imports_no_analysis():
    "The import graph has no cycle through the registry: importing it loads none of the analysis chapters."
    import subprocess, sys
    code = ("import sys, nl_embryo.registry; bad = [m for m in ('probes', 'reconstruction', 'attention', 'knowledge', 'surgery', 'weights', "
            "'finetune', 'analysis') if 'nl_embryo.' + m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, '-c', code], check=True)


class _KeyTaken(Exception):
    "Raised where `Run.map` asks for its cache folder: the key is known, nothing is computed or written."


CAUSAL_ONLY = ('induction',)   # analyses that refuse a masked run by name: their key is taken on a causal one


@pytest.fixture(scope='module')
def causal_run(tmp_path_factory, small_corpus):
    "A 2-step GPT-NeoX `MINI` run (checkpoints 0 and 2) for the analyses of causal models alone."
    from conftest import train
    return Run(train(tmp_path_factory.mktemp('causal')/'run', steps=2, checkpoints='0,2', arch='gpt-neox'))


@pytest.mark.parametrize('name', sorted(analyses()))
def test_the_cache_key_of_every_analysis_is_the_same_when_its_data_is_built_again(name, run, causal_run, monkeypatch):
    """The per-step cache answers a repeated analysis only if the key `Run.map` computes (the function, the data the
    analysis builds, its options) is the same each time the data is built afresh. Checked for every registered analysis
    through `analyze` itself, stopped where it would open the cache."""
    keys = []
    def take(self, key): keys.append(key); raise _KeyTaken
    monkeypatch.setattr(Run, 'cache_dir', take)
    if name in CAUSAL_ONLY:
        from nl_embryo.core import NlEmbryoError
        with pytest.raises(NlEmbryoError, match='is a masked LM'): analyze(run, name, steps=[0], progress=False, charts=False)
        run = causal_run
    # the LLC's step size is given: a calibration on this 4-step model tries four step sizes for minutes and refuses them all (none settles)
    options = dict(lr=3e-5) if name == 'llc' else {}
    for _ in range(2):
        with pytest.raises(_KeyTaken): analyze(run, name, steps=[0], progress=False, charts=False, **options)
    assert len(keys) == 2 and keys[0] == keys[1] and len(keys[0]) >= 16, keys
