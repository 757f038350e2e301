"""Tests of token reconstruction and mask prediction: a copy model reconstructs everything (also through the timeline),
the whole-word masking protocol, word classes and frequency bins, rescaling, and models without an MLM head."""

import numpy as np
import pandas as pd
import pytest

import nl_embryo.reconstruction as R
from nl_embryo.analysis import analyze
from nl_embryo.core import NlEmbryoError
from nl_embryo.models import quiet_transformers
from nl_embryo.probes import align_words
from nl_embryo.reconstruction import (FREQUENCY_BINS, POS_CLASSES, _all_pieces_correct, pos_class,
                                      reconstruction_data, rescale_by_final, train_copy_model, word_correctness)
from nl_embryo.timeline import Run


pytestmark = pytest.mark.usefixtures('one_torch_thread')


@pytest.fixture(scope='module')
def tok(english_tokenizer):
    "The session's English tokenizer (conftest.py), under this file's short name."
    return english_tokenizer


@pytest.fixture(scope='module')
def small():
    return reconstruction_data(per_group=12, seed=5)          # 12 target words for each group


@pytest.fixture(scope='module')
def copier(tok, small):
    return train_copy_model(tok, small['texts'])


def test_copy_model_reconstructs_everything(tok, small, copier):
    wc = word_correctness(copier, tok, small)
    ev = wc[wc.evaluated]
    n_pieces = align_words(tok, small['texts'], small['words']).n_pieces
    assert len(ev) == small['words'].target.sum() and ev.reconstructed.all()   # every target word evaluated
    assert (n_pieces[ev.index] > 1).sum() >= 5                                  # multi-piece words among them
    assert ev.predicted.mean() < 0.2                                            # it never saw [MASK]


def test_copy_model_through_the_timeline(tmp_path, tok, small, copier):
    folder = tmp_path/'copy'
    with quiet_transformers(): copier.save_pretrained(folder)
    tok.save_pretrained(folder)
    run = Run(folder)                                                           # a model folder: a one-step run
    df = analyze(run, 'reconstruction', per_group=12, seed=5, progress=False)
    acc = df[df.metric == 'accuracy'].set_index(['task', 'grouping', 'group'])
    assert acc.loc[('reconstruction', 'all', 'all'), 'value'] == 1.0
    assert (acc.loc['reconstruction'].query('n > 0').value == 1.0).all()
    assert set(df.columns) >= {'step', 'task', 'layer', 'grouping', 'group', 'metric', 'value', 'n'} and set(df.step) == {0}
    assert run.has_table('reconstruction') and run.chart_path('reconstruction_pos').with_suffix('.png').exists()
    # the report section reads the table (charts and the table of values)
    from nl_embryo.analysis import report_section
    s = report_section(run, 'reconstruction')
    assert s.title.startswith('Token reconstruction') and s.parts[-1].shape[0] >= 9
    assert 'nl-embryo analyze' in report_section(run, 'probes').markdown()   # no probes table: a hint
    # a second call is answered from the cache: no checkpoint is loaded, the frame is identical
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Run, 'load', lambda *a, **k: pytest.fail('a checkpoint was loaded'))
        assert analyze(run, 'reconstruction', per_group=12, seed=5, progress=False, charts=False).equals(df)


def test_whole_word_exact_match():
    ok = _all_pieces_correct(np.array([0, 0, 1, 2, 2, 2]), np.array([True, True, True, True, False, True]), 4)
    assert ok.tolist() == [True, True, False, True]                           # word 3 has no piece: vacuously true, not evaluated


@pytest.mark.parametrize('mask_fraction', [0.15, None])
def test_masking_protocol(monkeypatch, tok, small, copier, mask_fraction):
    "Every evaluated word is masked, all its pieces, in exactly one copy; a copy masks ~mask_fraction of its words."
    seen = []
    real = R._predict
    def spy(model, head, seqs, positions, *a, **k):
        seen.append((seqs, positions)); return real(model, head, seqs, positions, *a, **k)
    monkeypatch.setattr(R, '_predict', spy)
    word_correctness(copier, tok, small, mask_fraction=mask_fraction)
    (plain, rec_pos), (copies, masked_pos) = seen
    al = align_words(tok, small['texts'], small['words'])
    n_pieces = sum(al.n_pieces[small['words'].target.to_numpy()])
    assert sum(len(p) for p in masked_pos) == n_pieces == sum(len(p) for p in rec_pos)
    for s, p in zip(copies, masked_pos):
        assert (s[p] == tok.mask_token_id).all() and (s == tok.mask_token_id).sum() == len(p)
    w = small['words']
    n_words, n_targets = w.groupby('sent').size().to_numpy(), w.groupby('sent').target.sum().to_numpy()
    # one masked word per copy by default (Chiang et al. 2020): one copy per target word; else ~mask_fraction of a sentence's words per copy
    expected = sum(t if mask_fraction is None else int(np.ceil(t / max(1, round(0.15 * n)))) for n, t in zip(n_words, n_targets))
    assert len(copies) == expected


def test_word_classes_and_frequency_bins():
    assert pos_class('vbz') == 'verb' and pos_class('hvd') == 'verb' and pos_class('md') == ''
    assert pos_class('np-tl') == 'proper noun' and pos_class('cs') == 'preposition' and pos_class('ppss') == ''
    data = reconstruction_data(per_group=20, seed=1)
    w = data['words']
    for lo, hi in FREQUENCY_BINS:
        inbin = w[(w.freq_bin == f'{lo}–{hi}') & w.target]
        assert len(inbin) >= 20 and inbin.freq_rank.between(lo, hi).all()
    assert all(n >= 20 for n in data['quota'].values())              # every group reached its quota
    assert (w[w.freq_bin == ''].freq_rank.lt(50) | w[w.freq_bin == ''].freq_rank.gt(99)).all()
    assert set(w.pos_class) - {''} <= set(POS_CLASSES)
    assert w.word.str.lower().map(w.groupby(w.word.str.lower()).freq_rank.first()).eq(w.freq_rank).all()   # one rank per type


def test_rescale_by_final():
    df = pd.DataFrame([dict(step=s, task='prediction', grouping='pos', group=g, metric='accuracy', value=v, n=10, layer=4)
                       for s, g, v in [(0, 'noun', 0.1), (10, 'noun', 0.4), (0, 'verb', 0.0), (10, 'verb', 0.0)]])
    r = rescale_by_final(df).set_index(['group', 'step']).value
    assert r['noun', 0] == pytest.approx(0.25) and r['noun', 10] == 1.0 and np.isnan(r['verb', 10])


def test_model_without_mlm_head_is_refused(tmp_path, tok, small, monkeypatch):
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    folder = tmp_path/'encoder'
    with quiet_transformers(): BertModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    monkeypatch.setattr(Run, 'load', lambda *a, **k: pytest.fail('a checkpoint was loaded'))
    with pytest.raises(NlEmbryoError, match='without a masked-LM head'):
        analyze(folder, 'reconstruction')
    with pytest.raises(NlEmbryoError, match='no masked-LM head'):
        word_correctness(BertModel(cfg).eval(), tok, small)


def test_empty_request_is_refused():
    with pytest.raises(NlEmbryoError, match='nothing to evaluate'):
        reconstruction_data(per_group=0)


def test_folder_without_checkpoints_is_refused(tmp_path):
    (tmp_path/'checkpoints').mkdir()
    with pytest.raises(NlEmbryoError, match='no complete checkpoint'):
        analyze(tmp_path, 'reconstruction', progress=False)


def test_causal_run_measures_next_word_prediction(tmp_path, tok, small):
    "A causal LM: prediction rows only (`prediction='next-word'`), read from the left context, through the timeline."
    import torch
    from nl_embryo.analysis import report_section
    from nl_embryo.models import build_model
    from nl_embryo.words import words_frame
    torch.manual_seed(0)
    model = build_model('gpt-neox', 'mini', vocab_size=len(tok)).eval()
    # the left context only: changing the last word changes no prediction, and each equals the output on the cut sentence
    texts, words = words_frame([['The', 'dog', 'slept', 'in', 'the', 'sun', '.'], ['The', 'dog', 'slept', 'in', 'the', 'sun', '!']])
    seen = []
    with pytest.MonkeyPatch.context() as mp:
        real = R._predict
        mp.setattr(R, '_predict', lambda m, h, seqs, pos, *a, **k: seen.append((seqs, pos, real(m, h, seqs, pos, *a, **k))) or seen[-1][2])
        wc = word_correctness(model, tok, dict(texts=texts, words=words.assign(target=True)))
    (seqs, pos, preds), = seen
    assert 'reconstructed' not in wc and wc.evaluated.sum() == 14
    assert tok.convert_ids_to_tokens(seqs[0][pos[0] + 1].tolist()) == ['the', 'dog', 'sle', 'in', 'the', 'sun', '.']   # first pieces ('slept': sle ##pt)
    assert (preds[0] == preds[1]).all()
    with torch.no_grad():
        assert [int(model(input_ids=torch.from_numpy(seqs[1][:q + 1])[None]).logits[0, -1].argmax()) for q in pos[1]] == preds[1].tolist()
    # through the timeline: the same columns as a masked run's, prediction rows only; charts, phases and the section read them
    folder = tmp_path/'causal'
    with quiet_transformers(): model.save_pretrained(folder)
    tok.save_pretrained(folder)
    run = Run(folder)
    df = analyze(run, 'reconstruction', per_group=12, seed=5, progress=False)
    assert set(df.columns) >= {'step', 'task', 'layer', 'grouping', 'group', 'metric', 'value', 'lo', 'hi', 'n', 'prediction'}
    assert set(df.task) == {'prediction'} and set(df.prediction) == {'next-word'} and set(df.grouping) == {'all', 'pos', 'verb_form', 'frequency'}
    assert run.chart_path('reconstruction_pos').with_suffix('.png').exists()             # (untrained: all 0, so no rescaled chart)
    assert all(p['phase'].startswith('next-word prediction: ') for p in R.prediction_phases(run)) and len(R.prediction_phases(run)) == len(POS_CLASSES)
    assert 'no causal analogue' in report_section(run, 'reconstruction').markdown()
