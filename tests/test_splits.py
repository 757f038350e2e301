"""Evaluation data never trains: every sentence an analysis or a downstream task evaluates on is absent from the
training text of every real pre-training corpus (compared as `splits.text_key`: lowercase, no whitespace)."""
import pytest

from nl_embryo.corpora import CORPORA
from nl_embryo.splits import text_key, take_split, document_splits

REAL = ('english', 'brown', 'sotu', 'turkish', 'talmud', 'english-repeat', 'english-copy-50')   # english-repeat: its copies stay in their split;
# english-copy-50: English's sentences in their split, with token-id copy segments among the train ones


@pytest.fixture(scope='module')
def train_keys():
    keys = {}
    for name in REAL:
        texts = CORPORA[name].source(None, 0, None, split='train')
        assert len(texts) > 1000, (name, len(texts))
        keys[name] = {text_key(t) for t in texts if isinstance(t, str)}     # the sentences (copy segments are id arrays)
    return keys


def _eval_texts():
    from nl_embryo.attention import default_sentences
    from nl_embryo.probes import probe_task
    from nl_embryo.reconstruction import reconstruction_data
    from nl_embryo.tasks import load_task
    out = {'probes:pos': probe_task('pos', n_words=3000).texts,
           'reconstruction': reconstruction_data()['texts'],
           'attention': default_sentences()}
    for task in ('brown-genre', 'word-order', 'brown-pos', 'next-sentence'):
        t = load_task(task)
        if t.kind == 'token': texts = [' '.join(words) for words in t.texts]       # a sentence as its words
        elif t.is_pair: texts = [s for pair in t.texts for s in pair]                 # both sentences of a pair
        else: texts = list(t.texts)
        out[f'task:{task}'] = texts
    return out


def test_no_evaluation_sentence_is_in_a_training_corpus(train_keys):
    evals = _eval_texts()
    for name, texts in evals.items():
        assert len(texts) >= 100, (name, len(texts))
        keys = {text_key(t) for t in texts}
        for corpus, train in train_keys.items():
            shared = keys & train
            assert not shared, f"{len(shared)} {name} sentences are in the {corpus} training text, e.g. {sorted(shared)[:3]}"


def test_corpora_eval_split_holds_other_documents(train_keys):
    "The eval text of each real corpus comes from documents its train text does not hold (and they are not empty)."
    for name in REAL:
        ev = {text_key(t) for t in CORPORA[name].source(None, 0, None, split='eval')}
        assert len(ev) > 50
        share = len(ev & train_keys[name]) / len(ev)
        # Brown and SOTU drop shared sentences outright; Turkish keeps a few formulaic ones (e.g. one-word replies)
        assert share <= (0.0 if name != 'turkish' else 0.02), (name, share)


def test_split_is_by_document_and_stable():
    "A document's split depends on the set of documents only, not on their order; a fifth of them are held out."
    docs = [f'doc{i}' for i in range(500)]
    a = document_splits('brown', docs)
    b = document_splits('brown', docs[::-1])
    assert (a == b.loc[a.index]).all()
    assert (a == 'eval').sum() == 100
