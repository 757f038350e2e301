"""Causal (decoder-only) language models end to end: a run per builder loads with AutoModelForCausalLM and gives the same
logits, the loss leaves the unigram plateau, resume is bit-exact, interventions keep a model loadable, every analysis
returns rows or names why not, and a Pythia-layout timeline (a hub cache of step revisions) is analysed read-only."""
import hashlib, json, shutil, warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import train, weights
from nl_embryo.core import NlEmbryoError
from nl_embryo.models import CAUSAL_ARCHS, is_causal, load_model, quiet_transformers
from nl_embryo.objectives import PLATEAU_MARGIN
from nl_embryo.timeline import Run

pytestmark = pytest.mark.usefixtures('one_torch_thread')

CAUSAL = dict(eval_batches=4)     # MINI (conftest) on nested-zipf, with eval intervals from 4 batches


@pytest.fixture(scope='module')
def causal_runs(tmp_path_factory, small_corpus):
    "One 6-step run per causal builder (checkpoints 0, 3, 6)."
    root = tmp_path_factory.mktemp('causal')
    return {arch: train(root/arch, steps=6, checkpoints='0,3,6', arch=arch, **CAUSAL) for arch in CAUSAL_ARCHS}


def tree_digest(root) -> dict:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(root).rglob('*')) if p.is_file()}


@pytest.mark.parametrize('arch', CAUSAL_ARCHS)
def test_a_causal_run_loads_with_AutoModelForCausalLM_and_gives_the_same_logits(causal_runs, arch):
    from transformers import AutoModelForCausalLM
    ck = causal_runs[arch]/'checkpoints'/'step6'
    ours = load_model(ck).eval()
    with quiet_transformers(): theirs = AutoModelForCausalLM.from_pretrained(ck).eval()
    assert type(ours) is type(theirs) and is_causal(theirs) and theirs.config.nl_embryo_arch == arch
    ids = torch.randint(5, theirs.config.vocab_size, (2, 24))
    with torch.no_grad(): assert torch.equal(ours(input_ids=ids).logits, theirs(input_ids=ids).logits)
    cfg = json.loads((causal_runs[arch]/'config.json').read_text())['config']
    assert cfg['objective'] == 'clm' and cfg['norm'] == 'pre' and cfg['output_bias'] == 'zero'   # the recipe's unigram bias has no causal head to go to
    rows = [json.loads(l) for l in (causal_runs[arch]/'metrics.jsonl').read_text().splitlines()]
    assert [r['step'] for r in rows] == list(range(7)) and all('eval_clm_loss' in r for r in rows if r['step'] in (0, 3, 6))


def test_the_next_token_loss_leaves_the_unigram_plateau(tmp_path, small_corpus):
    run = Run(train(tmp_path/'run', steps=150, checkpoints='0,75,150', arch='gpt2', **CAUSAL))
    m = run.metrics().dropna(subset=['eval_clm_loss'])
    assert m['eval_below_unigram'].iloc[0] < 0 < PLATEAU_MARGIN < m['eval_below_unigram'].iloc[-1]   # starts above log-unigram, ends below
    assert m['eval_clm_loss_hi'].iloc[-1] < m['eval_clm_loss_lo'].iloc[0]                             # beyond the eval's noise


def test_resume_of_a_causal_run_is_bit_exact(tmp_path, causal_runs):
    run = tmp_path/'run'
    shutil.copytree(causal_runs['gpt-neox'], run)
    shutil.rmtree(run/'checkpoints'/'step6')
    train(run, steps=6, checkpoints='0,3,6', arch='gpt-neox', resume=True, **CAUSAL)
    a, b = weights(causal_runs['gpt-neox'], 6), weights(run, 6)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_wrong_objective_and_the_unigram_bias_are_refused_by_name(tmp_path):
    from nl_embryo.pretrain import PretrainConfig
    with pytest.raises(NlEmbryoError, match="objective 'mlm' does not fit architecture 'llama'"):
        PretrainConfig(out=str(tmp_path/'a'), arch='llama', objective='mlm').resolved()
    with pytest.raises(NlEmbryoError, match="objective 'clm' does not fit architecture 'bert'"):
        PretrainConfig(out=str(tmp_path/'b'), arch='bert', objective='clm').resolved()
    with pytest.raises(NlEmbryoError, match='has no bias'):
        PretrainConfig(out=str(tmp_path/'c'), arch='gpt2', output_bias='unigram').resolved()
    with pytest.raises(NlEmbryoError, match='rotary positions'):
        PretrainConfig(out=str(tmp_path/'d'), arch='gpt-neox', position_init='sinusoidal').resolved()
    assert not any(tmp_path.iterdir())


def make_pythia_cache(root, run) -> Path:
    "A run's checkpoints as a hub cache of step revisions, as Pythia publishes them: refs/stepN -> snapshots/<commit>/ -> ../../blobs/."
    repo = root/'models--EleutherAI--pythia-embryo'
    (repo/'blobs').mkdir(parents=True); (repo/'refs').mkdir()
    for step in (0, 3, 6):
        commit = hashlib.sha1(f'step{step}'.encode()).hexdigest()
        snap = repo/'snapshots'/commit; snap.mkdir(parents=True)
        for f in sorted((run/'checkpoints'/f'step{step}').iterdir()):
            if f.name not in ('config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json'): continue
            data = f.read_bytes(); blob = hashlib.sha256(data).hexdigest()
            if not (repo/'blobs'/blob).exists(): (repo/'blobs'/blob).write_bytes(data)
            (snap/f.name).symlink_to(Path('..')/'..'/'blobs'/blob)
        (repo/'refs'/f'step{step}').write_text(commit)
    return repo


def test_a_pythia_layout_timeline_of_a_causal_model_is_analysed_end_to_end(tmp_path, causal_runs, monkeypatch):
    from nl_embryo.analysis import analyze
    monkeypatch.setenv('HF_HUB_OFFLINE', '1'); monkeypatch.setenv('TRANSFORMERS_OFFLINE', '1')
    hub = make_pythia_cache(tmp_path/'hub', causal_runs['gpt-neox'])
    before = tree_digest(hub)
    run = Run(hub, out=tmp_path/'A')
    assert run.steps() == [0, 3, 6] and run.is_causal() and not run.source.owned
    probes = analyze(run, 'probes', n_words=300, progress=False, charts=False)
    assert sorted(set(probes['step'])) == [0, 3, 6] and set(probes['layer']) == set(range(5))   # embeddings + 4 layers
    attention = analyze(run, 'attention', n_sentences=24, map_len=16, progress=False, charts=False)
    assert sorted(set(attention['step'])) == [0, 3, 6]
    assert tree_digest(hub) == before and sorted(p.name for p in hub.iterdir()) == ['blobs', 'refs', 'snapshots']


SMALL = dict(probes=dict(n_words=300), attention=dict(n_sentences=24, map_len=16), reconstruction=dict(per_group=12),
             knowledge=dict(), surgery=dict(eval_batches=2, batch_size=8, probe_words=300), weights=dict(),
             finetune=dict(tasks=['sentiment'], seeds=[0], max_train=32, max_eval=32), acquisition=dict(max_words=20, n_contexts=4),
             syntax_heads=dict(n_words=800, min_pairs=5), minimal_pairs=dict(max_pairs=4), icl=dict(n_blocks=8),
             similarity=dict(n_blocks=8, n_tokens=128, n_boot=10), essential_dynamics=dict(n_blocks=8),
             llc=dict(n_blocks=16, chains=2, draws=10, burnin=5, batch_size=4, lr=1e-4), induction=dict(n_blocks=8, n_seqs=4))


def test_every_analysis_returns_rows_on_a_causal_run_or_names_why_not(tmp_path, causal_runs):
    "The built-in analyses on a causal run give rows at the step asked for; what a causal model cannot do is refused by name."
    from nl_embryo.analysis import ANALYSES, analyze
    run = tmp_path/'run'
    shutil.copytree(causal_runs['gpt-neox'], run)
    assert set(SMALL) == set(ANALYSES), 'a new analysis: add it here with small options'
    for name, opts in SMALL.items():
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            df = analyze(run, name, steps=[6], progress=False, charts=False, **opts)
        assert len(df) and set(df['step']) == {6}, name
        main = Run(run).table(ANALYSES[name].main_table)                # the analysis's key names each row of its main table once
        assert not main.duplicated([c for c in ('options', 'step', *ANALYSES[name].key) if c in main]).any(), (name, ANALYSES[name].key)
    assert {'induction', 'prev_random'} <= set(Run(run).table('attention')['pattern'])            # the causal head scores
    assert set(Run(run).table('reconstruction')['prediction']) == {'next-word'}
    assert set(Run(run).table('acquisition_surprisal')['prediction']) == {'next-word'}      # one step: no age, and the table says why
    sh = Run(run).table('syntax_heads')
    assert len(sh) and (sh['offset'] <= 0).all() and sh['baseline'].notna().all()      # a causal model's baseline looks left
    assert Run(run).table('acquisition')['aoa'].isna().all() and Run(run).table('acquisition')['fit'].str.contains('at least 4').all()
    assert 'clm_loss_increase' in set(Run(run).table('surgery')['metric'])
    assert set(Run(run).table('minimal_pairs')['scorer']) == {'log-likelihood'}          # a causal LM's own likelihood
    assert set(Run(run).table('icl')['prediction']) == {'next-token'} and (Run(run).table('llc')['loss'] == 'next-token').all()
    assert 'note' in Run(run).table('essential_dynamics')                                 # one step: no path, and the table says why
    assert 'sentiment' in set(Run(run).table('finetune')['task'])
    ind = Run(run).table('induction')                                                      # every kind, length and head, and the copying scores
    from nl_embryo.induction import INDUCTION_LENGTHS
    from nl_embryo.models import max_positions
    fit = {h for h in INDUCTION_LENGTHS if 1 + 2 * h <= max_positions(Run(run).model_config())}      # the lengths that fit its positions twice
    assert set(ind['kind']) == {'uniform', 'frequent', 'weights'} and set(ind.loc[ind['metric'] == 'induction', 'half_len']) == fit and fit
    with pytest.raises(NlEmbryoError, match="'next-sentence-mc' needs a MultipleChoice head, which transformers does not have for the causal"):
        analyze(run, 'finetune', steps=[6], progress=False, charts=False, **dict(SMALL['finetune'], tasks=['next-sentence-mc']))
    with pytest.raises(NlEmbryoError, match='holds a causal LM'):          # a masked-only need is refused by name
        from nl_embryo.registry import check_needs
        check_needs(('mlm_head',), Run(run), 'a masked analysis')
