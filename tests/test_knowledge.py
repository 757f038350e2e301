"""Knowledge probes: the single-token answer filter (WordPiece and byte-level BPE), the probe's ranks, knowledge
injection, and the outputs of analyze(run, 'knowledge'). That a model pre-trained on injected facts learns them (and
not the held-out ones) is the last example of nbs/12_knowledge.ipynb, run by nbdev_test in CI: about 750 steps of
pre-training."""

import numpy as np
import pandas as pd
import pytest
import torch

from nl_embryo.analysis import analyze
from nl_embryo.core import NlEmbryoError
from nl_embryo.corpora import CORPORA, get_tokenizer
from nl_embryo.knowledge import (RELATIONS, load_facts, fact_queries, single_token_counts, train_byte_bpe, knowledge_checkpoint,
                                 knowledge_scores, split_facts, inject_facts, fact_sentences,
                                 knowledge_predictions, top_predictions_table)

CAPITALS = pd.DataFrame(dict(relation='capital', subject=['France', 'Italy', 'Burkina Faso', 'Chad', 'Peru'],
                             object=['Paris', 'Rome', 'Ouagadougou', "N'Djamena", 'Lima']))


@pytest.fixture(scope='module')
def bpe():
    "A small byte-level BPE: frequent words (with their leading space) become single tokens, rare ones do not."
    texts = ['The capital of France is Paris .', 'Paris is lovely .', 'Rome and Paris and Lima are cities .',
             'People in Italy visit Rome often .', 'the cat sat on the mat .'] * 50
    return train_byte_bpe(texts, vocab_size=400)


def independent_single(tok, answer, in_context_space):
    "The answer is one (non-unknown) token when tokenised alone, with the space a BPE token would carry in context."
    ids = tok((' ' if in_context_space else '') + answer, add_special_tokens=False)['input_ids']
    return len(ids) == 1 and ids[0] != tok.unk_token_id


def test_single_token_filter_byte_level_bpe(bpe):
    q = fact_queries(CAPITALS, bpe, 'all')
    kept = set(zip(q.subject, q.template_id))
    for f in CAPITALS.itertuples():
        for tid, _, t in RELATIONS['capital'].templates('all'):
            mid = not t.startswith('[Y]')
            assert ((f.subject, tid) in kept) == independent_single(bpe, f.object, mid), (f.object, t)
    assert {'Paris', 'Rome'} <= set(q.object) and 'Ouagadougou' not in set(q.object)
    for r in q.itertuples():                                    # the target decodes to exactly the answer (+ its space)
        assert bpe.convert_tokens_to_string([bpe.convert_ids_to_tokens(r.target_id)]).strip() == r.object
        assert r.input_ids[r.mask_index] == bpe.mask_token_id and r.query.count(bpe.mask_token) == 1
        full = bpe(r.text)['input_ids']
        assert [x for i, x in enumerate(full) if i != r.mask_index] == [x for i, x in enumerate(r.input_ids) if i != r.mask_index]


def test_single_token_filter_wordpiece():
    tok = get_tokenizer('english')
    q = fact_queries(CAPITALS, tok, 'all')
    for f in CAPITALS.itertuples():
        assert (f.subject in set(q.subject)) == independent_single(tok, f.object, False), f.object
    assert set(tok.convert_ids_to_tokens(q.target_id.tolist())) == {o.lower() for o in q.object}
    counts = single_token_counts(load_facts(), {'english': tok})
    assert counts.loc['total', 'english'] < counts.loc['total', 'all facts'] and (counts['english'] > 0).all()


def test_probe_ranks_scores_and_errors():
    tok = get_tokenizer('english')
    from nl_embryo.models import build_model
    torch.manual_seed(0)
    model = build_model('bert', 'tiny', vocab_size=len(tok), max_position=32).eval()
    p = knowledge_checkpoint(model, tok, CAPITALS, top_k=5)
    q = fact_queries(CAPITALS, tok)
    for r, qq in zip(p.itertuples(), q.itertuples()):       # rank by hand from the full logits
        with torch.no_grad(): logits = model(input_ids=torch.tensor([qq.input_ids])).logits[0, qq.mask_index]
        logits[tok.all_special_ids] = -float('inf')
        assert r.rank == int((logits > logits[qq.target_id]).sum()) + 1 and len(r.top) == 5
    s = knowledge_scores(p).set_index(['relation', 'metric']).value
    assert np.isclose(s['capital', 'mrr'], (1 / p['rank']).mean()) and np.isclose(s['mean', 'p@10'], (p['rank'] <= 10).mean())
    with pytest.raises(NlEmbryoError, match='masked-LM head'): knowledge_checkpoint(model.bert, tok, CAPITALS)
    with pytest.raises(NlEmbryoError, match='unknown relation'): fact_queries(CAPITALS.assign(relation='wife'), tok)
    with pytest.raises(NlEmbryoError, match='template set'): fact_queries(CAPITALS, tok, 'some')
    with pytest.raises(NlEmbryoError, match='rate'): inject_facts(CAPITALS, rate=1.5)
    with pytest.raises(NlEmbryoError, match='artificial'): inject_facts(CAPITALS, base='zipf')


def test_injected_corpus_mixes_paraphrases_at_the_rate_and_keeps_held_out_facts_out():
    tok = get_tokenizer('english')
    facts = split_facts(load_facts().groupby('relation').head(20), holdout=0.25, seed=1)
    assert (facts.groupby('relation').injected.mean() == 0.75).all()
    spec = inject_facts(facts, rate=0.2, max_base_sentences=500, name='test-injection')
    assert CORPORA['test-injection'] is spec and not spec.artificial
    texts = spec.source(None, 0, tok)
    written = set(fact_sentences(facts[facts.injected], 100_000))
    n = sum(t in written for t in texts)
    assert abs(n / len(texts) - 0.2) < 0.01 and len(texts) - n == 500
    assert not set(fact_sentences(facts[~facts.injected], 100_000, 'all')) & set(texts)
    assert not set(fact_sentences(facts, 100_000, 'probe')) & set(texts)
    base = CORPORA['english'].source(None, 0, None, split='train')[:500]   # the train documents
    assert [t for t in texts if t not in written] == base            # the base keeps its order


@pytest.fixture(scope='module')
def facts_run(tmp_path_factory, english_tokenizer):
    "A few steps of pre-training a tiny BERT on a facts-heavy corpus (90% fact sentences, 12 facts): outputs, not learning."
    from nl_embryo.pretrain import PretrainConfig, pretrain
    tok = english_tokenizer
    facts = load_facts(['city_country', 'language', 'currency'])
    ok = fact_queries(facts, tok, 'all')[['relation', 'subject']].drop_duplicates()
    facts = facts.merge(ok).groupby('relation').head(4)
    spec = inject_facts(facts, rate=0.9, max_base_sentences=30, name='test-facts-heavy')
    run = pretrain(PretrainConfig(out=str(tmp_path_factory.mktemp('k')/'run'), corpus=spec.name, block_size=BLOCK, batch_size=8,
                                  steps=STEPS, lr=1e-3, checkpoints=f'0,{STEPS}', eval_batches=1), quiet=True)
    return run, facts

BLOCK, STEPS = 16, 6


def test_a_model_at_step_0_knows_no_fact(facts_run):
    run, facts = facts_run
    p = knowledge_predictions(run, facts=facts, templates='all', quiet=True)
    s = knowledge_scores(p).query("relation == 'mean' and metric == 'p@1'").set_index(['step', 'template_kind']).value
    assert s[0, 'paraphrase'] == 0 and s[0, 'probe'] == 0
    assert set(p['step']) == {0, STEPS} and (p['rank'] >= 1).all()


def test_analyze_writes_tidy_knowledge_scores_and_charts(facts_run, tmp_path):
    from nl_embryo.analysis import report_section
    from nl_embryo.timeline import Run
    run, facts = facts_run
    run = Run(run)
    assert 'nl-embryo analyze' in report_section(run, 'knowledge').markdown()     # no table yet: the section says how to compute one
    scores = analyze(run, 'knowledge', progress=False, data=[facts])
    assert list(scores.columns) == ['step', 'options', 'relation', 'metric', 'value', 'lo', 'hi', 'n', 'suspect'] and not scores.suspect.any() and set(scores.metric) == {'p@1', 'p@10', 'mrr', 'prior_p@1'}   # and the answer prior's P@1, the baseline
    assert scores.step.unique().tolist() == [0, STEPS]
    assert run.table('knowledge').equals(scores)
    assert run.chart_path('knowledge').with_suffix('.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    html = run.chart_path('knowledge').with_suffix('.html').read_text()
    assert 'cdn.jsdelivr' not in html and 'vega' in html
    preds = run.table('knowledge_predictions')
    table = top_predictions_table(preds, n=1)
    assert list(table.columns) == [f'step {s}' for s in (0, STEPS)]
    s = report_section(run, 'knowledge')
    assert s.title == 'World knowledge' and isinstance(s.parts[-1], pd.DataFrame) and list(s.parts[-1].columns) == list(table.columns)
