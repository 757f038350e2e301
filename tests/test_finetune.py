"""Fine-tuning: it learns (beats the majority class), heads on every architecture, token alignment, determinism, folders,
other tokenizers, intervened models, transfer tables and bad input."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from nl_embryo.core import NlEmbryoError
from nl_embryo.corpora import get_tokenizer
from nl_embryo.finetune import (RESULT_COLUMNS, adopt_tokenizer, encode, finetune, majority_baseline, mlm_adapt, transfer_chart,
                                transfer_table, with_head, default_hparams)
from nl_embryo.models import ARCHS, SizePreset, build_model, is_causal, is_pair
from nl_embryo.tasks import load_task, task_from_file

MICRO = SizePreset('micro', hidden=64, layers=2, heads=2, intermediate=128)


pytestmark = pytest.mark.usefixtures('one_torch_thread')


@pytest.fixture(scope='module')
def tok(english_tokenizer):
    "The session's English tokenizer (conftest.py), under this file's short name."
    return english_tokenizer


@pytest.fixture(scope='module')
def toy_tasks(tmp_path_factory):
    "A classification, a pair-regression and a token task from small files."
    d = tmp_path_factory.mktemp('tasks')
    rng = np.random.default_rng(0)
    words = 'the cat dog sat ran on a mat quickly house'.split()
    rows = [dict(text=' '.join(rng.choice(words, 6)), label=['no', 'yes'][i % 2], a=f'first {i}', b=f'second {i}', sim=float(rng.normal()))
            for i in range(60)]
    pd.DataFrame(rows).to_csv(d/'cls.csv', index=False)
    tok_rows = [dict(words=list(rng.choice(words, 5)), tags=list(rng.choice(['N', 'V', 'D'], 5))) for _ in range(60)]
    (d/'tok.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in tok_rows))
    return [task_from_file(d/'cls.csv', name='cls'), task_from_file(d/'cls.csv', text_columns=('a', 'b'), label_column='sim', name='reg'),
            task_from_file(d/'cls.csv', text_columns=('a', 'b'), label_column='label', name='pairs'),
            task_from_file(d/'tok.jsonl', text_columns='words', label_column='tags', name='tags')]


def test_finetuning_beats_the_majority_class_on_sentiment(tok):
    torch.manual_seed(0)
    model = build_model('bert', MICRO, vocab_size=len(tok), max_position=128)
    res = finetune(model, tok, 'sentiment', max_train=2000, max_eval=300, lr=1e-3, batch_size=32, max_steps=150, progress=False)
    maj = majority_baseline('sentiment', 2000, 300)
    get = lambda df, split: df.query(f"split == '{split}' and metric == 'accuracy'")['value'].item()
    assert get(res, 'dev') > get(maj, 'dev') + 0.08, (get(res, 'dev'), get(maj, 'dev'))
    assert get(res, 'test') > get(maj, 'test') + 0.05
    assert list(res.columns) == RESULT_COLUMNS and set(res['split']) == {'dev', 'test'}


@pytest.mark.parametrize('arch', ARCHS)
def test_every_architecture_and_kind(arch, tok, toy_tasks):
    model = build_model(arch, MICRO, vocab_size=len(tok), max_position=64)
    res = finetune(model, tok, toy_tasks, max_steps=2, batch_size=8, progress=False)
    assert set(res['task']) == {'cls', 'reg', 'pairs', 'tags'} and res['value'].notna().all()
    body = model.discriminator if is_pair(model) else model
    for t in toy_tasks:
        head = with_head(model, t)
        a, b = (head.base_model.state_dict(), body.base_model.state_dict()) if is_causal(body) else (head.base_model.encoder.state_dict(), body.base_model.encoder.state_dict())
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)      # the body is copied in


def test_same_seed_same_scores_and_folders(tmp_path, tok, toy_tasks):
    model = build_model('bert', MICRO, vocab_size=len(tok), max_position=64)
    a = finetune(model, tok, toy_tasks[:2], seeds=(0, 1), max_steps=4, batch_size=8, progress=False)
    b = finetune(model, tok, toy_tasks[:2], seeds=(0, 1), max_steps=4, batch_size=8, progress=False)
    pd.testing.assert_frame_equal(a.drop(columns='seconds'), b.drop(columns='seconds'))
    model.save_pretrained(tmp_path/'m'); tok.save_pretrained(tmp_path/'m')
    c = finetune(tmp_path/'m', task=toy_tasks[:2], seeds=(0, 1), max_steps=4, batch_size=8, progress=False)
    pd.testing.assert_frame_equal(a.drop(columns='seconds'), c.drop(columns='seconds'))
    assert sorted(a['seed'].unique()) == [0, 1]


def test_token_labels_on_first_pieces_only(tok):
    t = load_task('brown-pos', max_train=300, max_eval=10)
    texts, tags = t.split('train')
    enc = encode(t, tok, 'train', max_len=64)
    assert len(enc) == len(texts)
    n_cont = 0
    for e, words, wtags in zip(enc, texts, tags):
        word_ids = tok(list(words), is_split_into_words=True, truncation=True, max_length=64).word_ids()
        prev = None
        for lab, w in zip(e['label'], word_ids):
            if w is None or w == prev: assert lab == -100; n_cont += w is not None
            else: assert lab == wtags[w]
            prev = w
    assert n_cont > 0                                            # the sample has continuation pieces


def test_pairs_get_segment_ids(tok):
    t = load_task('next-sentence', max_train=20, max_eval=5)
    e = encode(t, tok, 'train', 128)[0]
    types = e['token_type_ids']
    assert types[0] == 0 and types[-1] == 1 and set(types) == {0, 1} and e['input_ids'][0] == tok.cls_token_id


def test_other_tokenizer_needs_an_embedding_table(tok, toy_tasks):
    protein = get_tokenizer('protein')
    model = build_model('bert', MICRO, vocab_size=len(protein), max_position=64)
    with pytest.raises(NlEmbryoError, match='adopt_tokenizer'): finetune(model, tok, toy_tasks[0], max_steps=1, progress=False)
    new = adopt_tokenizer(model, tok)
    assert new.get_input_embeddings().weight.shape[0] == len(tok) == new.config.vocab_size
    assert torch.equal(new.bert.encoder.layer[0].attention.self.query.weight, model.bert.encoder.layer[0].attention.self.query.weight)
    assert new.get_output_embeddings().weight is new.get_input_embeddings().weight or torch.equal(new.get_output_embeddings().weight, new.get_input_embeddings().weight)
    assert new.config.nl_embryo_interventions[-1]['name'] == 'adopt_tokenizer'
    assert model.get_input_embeddings().weight.shape[0] == len(protein)         # the original is untouched
    kept = adopt_tokenizer(model, tok, embeddings='keep')
    assert torch.equal(kept.get_input_embeddings().weight[:len(protein)], model.get_input_embeddings().weight)
    finetune(new, tok, toy_tasks[0], max_steps=1, progress=False)
    pair = adopt_tokenizer(build_model('electra', MICRO, vocab_size=len(protein), max_position=64), tok)
    assert pair.embeddings_shared() and pair.generator.config.vocab_size == len(tok)
    with pytest.raises(NlEmbryoError, match="use 'reinit' or 'keep'"): adopt_tokenizer(model, tok, embeddings='copy')


def test_intervened_models(tok, toy_tasks):
    from nl_embryo.interventions import apply_interventions, swap_embeddings
    model = build_model('bert', MICRO, vocab_size=len(tok), max_position=64)
    cut = apply_interventions(model, 'remove_layers(last=1)')
    head = with_head(cut, toy_tasks[0])
    assert head.config.num_hidden_layers == 1 and head.config.nl_embryo_interventions[0]['name'] == 'remove_layers'
    rev = apply_interventions(model, 'reverse_layers')
    h = with_head(rev, toy_tasks[0])
    assert torch.equal(h.bert.encoder.layer[0].output.dense.weight, model.bert.encoder.layer[1].output.dense.weight)
    protein = get_tokenizer('protein')
    foreign = build_model('bert', MICRO, vocab_size=len(protein), max_position=64)
    swapped = swap_embeddings(foreign, model, tok)                  # the English tokenizer comes with the embeddings
    res = finetune(swapped, None, toy_tasks[0], max_steps=1, progress=False)
    assert len(res) == 2 and res["value"].notna().all()           # accuracy on dev and test


def test_defaults_follow_table5():
    assert default_hparams('word-order', 768) == dict(lr=1e-5, batch_size=16, epochs=3.0, warmup=0.06, max_len=64)
    assert default_hparams('sentiment-score')['lr'] == pytest.approx(2e-4) and default_hparams('next-sentence')['max_len'] == 128


def results_frame():
    rows = []
    for l1, base in [('english', 0.8), ('none', 0.5), ('zipf', 0.6)]:
        for task, metric in [('sentiment', 'accuracy'), ('word-order', 'matthews')]:
            for seed in (0, 1):
                for split in ('dev', 'test'):
                    rows.append(dict(l1=l1, task=task, seed=seed, split=split, metric=metric, primary=True, value=base + seed * 0.1 + (split == 'dev') * 0.01))
                    rows.append(dict(l1=l1, task=task, seed=seed, split=split, metric='f1', primary=False, value=0.0))
    return pd.DataFrame(rows)


def test_transfer_table():
    r = results_frame()
    t = transfer_table(r, row='l1')
    assert list(t.index) == ['english', 'none', 'zipf'] and list(t.columns) == ['sentiment', 'word-order', 'avg']
    assert t.loc['english', 'sentiment'] == pytest.approx(0.85) and t.loc['none', 'avg'] == pytest.approx(0.55)
    assert transfer_table(r, row='l1', aggregate='max').loc['zipf', 'sentiment'] == pytest.approx(0.7)
    assert transfer_table(r, row='l1', split='dev').loc['english', 'sentiment'] == pytest.approx(0.86)
    assert transfer_table(r, row='l1', metric='f1', average=False).to_numpy().sum() == 0
    assert list(transfer_table(r, row='l1', order=['zipf', 'english']).index) == ['zipf', 'english']
    spec = transfer_chart(r, row='l1').to_dict()
    assert spec['layer'][0]['mark']['type'] == 'rect'
    with pytest.raises(NlEmbryoError, match=r"no column\(s\) \['intervention'\]"): transfer_table(r, row='intervention')
    with pytest.raises(NlEmbryoError, match='unknown aggregate'): transfer_table(r, row='l1', aggregate='sum')
    with pytest.raises(NlEmbryoError, match='no results'): transfer_table(r, row='l1', split='train')


def test_bad_input(tok, toy_tasks):
    model = build_model('bert', MICRO, vocab_size=len(tok), max_position=64)
    with pytest.raises(NlEmbryoError, match='unknown fine-tuning option'): finetune(model, tok, toy_tasks[0], learning_rate=1e-3)
    with pytest.raises(NlEmbryoError, match='without its tokenizer'): finetune(model, None, toy_tasks[0])
    with pytest.raises(NlEmbryoError, match='no seeds'): finetune(model, tok, toy_tasks[0], seeds=())
    with pytest.raises(NlEmbryoError, match='no run at'): finetune('/nonexistent/run', task=toy_tasks[0])
    t = load_task(toy_tasks[0], max_train=10, max_eval=None)
    t.splits['dev'] = t.splits['dev'][:0]
    with pytest.raises(NlEmbryoError, match='0 dev examples'): finetune(model, tok, t, max_steps=1, progress=False)


def test_mlm_adapt_trains_only_embeddings_and_head():
    model = build_model('bert', MICRO, vocab_size=8000, max_position=128)
    new = mlm_adapt(model, steps=3, batch_size=4, progress=False)
    moved = {n for (n, p), q in zip(new.named_parameters(), model.parameters()) if not torch.equal(p, q)}
    assert 'bert.embeddings.word_embeddings.weight' in moved and any(n.startswith('cls.') for n in moved)
    assert all(n.startswith('cls.') or n.endswith('word_embeddings.weight') for n in moved)
    assert all(p.requires_grad for p in new.parameters()) and new.training is False
    assert new.config.nl_embryo_interventions[-1]['name'] == 'mlm_adapt' and not getattr(model.config, 'nl_embryo_interventions', None)
    pair = build_model('electra', MICRO, vocab_size=8000, max_position=128)
    adapted = mlm_adapt(pair, steps=2, batch_size=4, progress=False)
    d0, d1 = pair.discriminator, adapted.discriminator
    assert adapted.embeddings_shared() and not torch.equal(d1.get_input_embeddings().weight, d0.get_input_embeddings().weight)
    assert torch.equal(d1.base_model.encoder.layer[0].output.dense.weight, d0.base_model.encoder.layer[0].output.dense.weight)
    assert d1.config.nl_embryo_interventions[-1]['name'] == 'mlm_adapt'
    with pytest.raises(NlEmbryoError, match='no MLM head'): mlm_adapt(model.bert, steps=1)
    with pytest.raises(NlEmbryoError, match='at least one step'): mlm_adapt(model, steps=0)
    with pytest.raises(NlEmbryoError, match='embedding table has 25 rows'): mlm_adapt(build_model('bert', MICRO, vocab_size=25), steps=1)


def test_multiple_choice_over_the_reference_run(reference):
    "`next-sentence-mc` on a checkpoint of the reference run, as `analyze --finetune next-sentence-mc` runs it: accuracy with its chance and majority baselines."
    from nl_embryo.finetune import FINETUNE, finetune_run
    assert FINETUNE.cli['parse']('next-sentence-mc') == ['next-sentence-mc']
    res = finetune_run(reference, tasks=['next-sentence-mc'], steps=4, max_train=24, max_eval=12, cache=False, progress=False, max_steps=3, batch_size=8)
    task = load_task('next-sentence-mc', max_train=24, max_eval=12)
    assert set(res['step']) == {4} and set(res['kind']) == {'choice'} and set(res['split']) == {'dev', 'test'}
    for split, rows in res.groupby('split'):
        got = rows.set_index('metric')
        assert sorted(got.index) == ['accuracy', 'chance', 'majority'] and got.loc['accuracy', 'primary'] and not got.loc[['chance', 'majority'], 'primary'].any()
        assert 0 <= got.loc['accuracy', 'value'] <= 1 and got.loc['chance', 'value'] == 0.25 and got.loc['accuracy', 'n_eval'] == 12
        assert got.loc['majority', 'value'] == pytest.approx(task.majority(split)['accuracy'])
