"""Downstream tasks: metrics against scikit-learn / SciPy, split determinism, documented sizes, task files and their errors, GLUE errors."""
import json, sys, types

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from sklearn import metrics as skm

from nl_embryo.core import NlEmbryoError
from nl_embryo import tasks as T
from nl_embryo.tasks import load_task, task_from_file, make_splits, score


@pytest.mark.parametrize('seed', range(20))
def test_metrics_match_sklearn_and_scipy(seed):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(2, 300)), int(rng.integers(2, 6))
    y, p = rng.integers(0, k, n), rng.integers(0, k, n)
    if seed % 3 == 0: p = np.where(rng.random(n) < 0.7, y, p)       # correlated predictions too
    assert T.accuracy(p, y) == pytest.approx(skm.accuracy_score(y, p), abs=1e-12)
    assert T.macro_f1(p, y) == pytest.approx(skm.f1_score(y, p, average='macro'), abs=1e-12)
    assert T.matthews(p, y) == pytest.approx(skm.matthews_corrcoef(y, p), abs=1e-10)
    yb, pb = y % 2, p % 2
    assert T.f1(pb, yb) == pytest.approx(skm.f1_score(yb, pb, zero_division=0.0), abs=1e-12)
    assert T.matthews(pb, yb) == pytest.approx(skm.matthews_corrcoef(yb, pb), abs=1e-10)
    x, z = rng.normal(size=n), rng.normal(size=n)
    if seed % 2: x, z = x.round(0), z.round(1)                      # many ties
    if seed % 4 == 1: z = x + rng.normal(scale=0.5, size=n)
    assert T.pearson(x, z) == pytest.approx(stats.pearsonr(x, z)[0], abs=1e-10)
    assert T.spearman(x, z) == pytest.approx(stats.spearmanr(x, z)[0], abs=1e-10)
    assert np.array_equal(T.rank_average(x), stats.rankdata(x))


def test_degenerate_metrics_are_zero_not_nan():
    assert T.matthews([1, 1, 1], [1, 0, 1]) == skm.matthews_corrcoef([1, 0, 1], [1, 1, 1]) == 0.0
    assert T.pearson([2, 2, 2], [1, 2, 3]) == 0.0 and T.spearman([1, 2, 3], [5, 5, 5]) == 0.0
    assert T.f1([0, 0], [0, 0]) == 0.0 and T.accuracy([], []) == 0.0
    with pytest.raises(NlEmbryoError, match='unknown metric'): score(['auc'], [1], [1])


# sizes of the full tasks, split with seed 0 (documented in nbs/10_tasks.ipynb)
SIZES = {'sentiment': (8056, 1007, 1007), 'sentiment-score': (8483, 1060, 1060), 'bbc-topic': (1701, 212, 212),
         'brown-genre': (9045, 1131, 1131), 'next-sentence': (5116, 639, 639), 'word-order': (8240, 1030, 1030),
         'brown-pos': (9221, 1153, 1153)}     # Brown and SOTU tasks: sentences of the evaluation documents only


@pytest.mark.parametrize('name', list(SIZES))
def test_task_sizes_and_splits(name):
    t = load_task(name)
    assert tuple(t.sizes.values()) == SIZES[name]
    tr, dv, te = (set(t.splits[s].tolist()) for s in ('train', 'dev', 'test'))
    assert not (tr & dv or tr & te or dv & te) and len(tr | dv | te) == len(t.texts)
    assert t.metric == t.metrics[0] and t.n_labels == (1 if t.kind == 'regression' else len(t.label_names))
    if t.kind in ('classification', 'pair'):
        assert set(np.unique(np.asarray(t.labels))) == set(range(t.n_labels))


def test_split_determinism_and_caps():
    a, b = load_task('sentiment', seed=3), load_task('sentiment', seed=3)
    assert all(np.array_equal(a.splits[s], b.splits[s]) for s in a.splits)
    c = load_task('sentiment', seed=4)
    assert not np.array_equal(a.splits['test'], c.splits['test'])
    capped = load_task('sentiment', max_train=100, max_eval=30, seed=3)
    assert capped.sizes == {'train': 100, 'dev': 30, 'test': 30}
    assert all(np.array_equal(capped.splits[s], a.splits[s][:len(capped.splits[s])]) for s in a.splits)
    s1, s2 = make_splits(1000, 7), make_splits(1000, 7)
    assert all(np.array_equal(s1[k], s2[k]) for k in s1) and [len(s1[k]) for k in ('train', 'dev', 'test')] == [800, 100, 100]
    with pytest.raises(NlEmbryoError, match='max_train'): load_task('sentiment', max_train=0)
    with pytest.raises(NlEmbryoError, match='fractions'): make_splits(10, fractions=(0.5, 0.5, 0.5))


def test_constructed_tasks_depend_only_on_seed():
    a, b = load_task('word-order', seed=1), load_task('word-order', seed=1)
    assert a.texts == b.texts and np.array_equal(a.labels, b.labels)
    t = load_task('word-order', max_train=500)
    for text, label in zip(*t.split("train")):
        assert label in (0, 1) and 5 <= len(text.split()) <= 40
    ns = load_task('next-sentence', max_train=300)
    assert all(isinstance(x, tuple) and len(x) == 2 for x in ns.split('train')[0])


def test_majority_and_evaluate():
    t = load_task('sentiment', max_train=500, max_eval=200)
    m = t.majority('dev')
    top = np.bincount(np.asarray(t.split('train')[1])).argmax()
    assert m['accuracy'] == pytest.approx(np.mean(np.asarray(t.split('dev')[1]) == top))
    assert t.evaluate(t.split('test')[1], 'test')['accuracy'] == 1.0
    with pytest.raises(NlEmbryoError, match='predictions'): t.evaluate([0, 1], 'test')
    r = load_task('sentiment-score', max_train=100, max_eval=50)
    assert r.majority('test')['spearman'] == 0.0                      # a constant prediction


def test_unknown_task():
    with pytest.raises(NlEmbryoError, match='unknown task'): load_task('sst-2')


# --- task files ---

def test_csv_classification_and_split_column(tmp_path):
    df = pd.DataFrame({'sentence': [f's{i}' for i in range(40)], 'y': ['a', 'b', 'c', 'b'] * 10,
                       'split': ['train'] * 30 + ['validation'] * 5 + ['test'] * 5})
    df.to_csv(tmp_path/'t.csv', index=False)
    t = load_task(tmp_path/'t.csv', text_columns='sentence', label_column='y')
    assert t.kind == 'classification' and t.label_names == ['a', 'b', 'c'] and t.sizes == {'train': 30, 'dev': 5, 'test': 5}
    assert t.name == 't' and t.metric == 'accuracy'
    t2 = load_task(tmp_path/'t.csv', text_columns='sentence', label_column='y', split_column=None, metric='macro_f1', seed=1)
    assert t2.sizes == {'train': 32, 'dev': 4, 'test': 4} and t2.metric == 'macro_f1'


def test_jsonl_pair_regression_and_token(tmp_path):
    rows = [dict(a=f'first {i}', b=f'second {i}', score=i / 3, same=i % 2) for i in range(30)]
    (tmp_path/'p.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    reg = task_from_file(tmp_path/'p.jsonl', text_columns=('a', 'b'), label_column='score')
    assert reg.kind == 'regression' and reg.metric == 'spearman' and reg.is_pair and reg.labels.dtype == np.float32
    pair = task_from_file(tmp_path/'p.jsonl', text_columns=['a', 'b'], label_column='same')
    assert pair.kind == 'pair' and pair.n_labels == 2
    toks = [dict(words=['the', 'dog', 'barks'], tags=['DET', 'NOUN', 'VERB'])] * 10
    (tmp_path/'tok.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in toks))
    tok = task_from_file(tmp_path/'tok.jsonl', text_columns='words', label_column='tags')
    assert tok.kind == 'token' and tok.label_names == ['DET', 'NOUN', 'VERB'] and list(tok.labels[0]) == [0, 1, 2]


def test_task_file_errors(tmp_path):
    pd.DataFrame({'text': ['a', 'b', 'c'], 'label': ['x', 'y', 'x']}).to_csv(tmp_path/'ok.csv', index=False)
    with pytest.raises(NlEmbryoError, match=r"no column\(s\) \['sentence'\]; its columns are: text, label"):
        task_from_file(tmp_path/'ok.csv', text_columns='sentence')
    with pytest.raises(NlEmbryoError, match=r"no column\(s\) \['stars'\]"):
        task_from_file(tmp_path/'ok.csv', label_column='stars')
    pd.DataFrame({'text': ['a', 'b', 'c'], 'label': ['x', 'x', 'x']}).to_csv(tmp_path/'one.csv', index=False)
    with pytest.raises(NlEmbryoError, match="single class") as e: task_from_file(tmp_path/'one.csv')
    assert 'at least two classes' in str(e.value)
    with pytest.raises(NlEmbryoError, match='does not exist'): task_from_file(tmp_path/'missing.csv')
    with pytest.raises(NlEmbryoError, match='one or two text columns'): task_from_file(tmp_path/'ok.csv', text_columns=['a', 'b', 'c'])
    with pytest.raises(NlEmbryoError, match='unknown metric'): task_from_file(tmp_path/'ok.csv', metric='auc')
    with pytest.raises(NlEmbryoError, match='not numeric'): task_from_file(tmp_path/'ok.csv', kind='regression')
    with pytest.raises(NlEmbryoError, match='pair task needs two'): task_from_file(tmp_path/'ok.csv', kind='pair')
    pd.DataFrame({'text': ['a', None], 'label': [None, 'y']}).to_csv(tmp_path/'empty.csv', index=False)
    with pytest.warns(UserWarning, match='dropped 2'), pytest.raises(NlEmbryoError, match='no rows'):
        task_from_file(tmp_path/'empty.csv')
    pd.DataFrame({'text': ['a', 'b'], 'label': [0, 1], 'split': ['train', 'holdout']}).to_csv(tmp_path/'sp.csv', index=False)
    with pytest.raises(NlEmbryoError, match="holdout"): task_from_file(tmp_path/'sp.csv')
    (tmp_path/'bad.jsonl').write_text('{"text": "a", "label": 1}\nnot json\n')
    with pytest.raises(NlEmbryoError, match='cannot read task file'): task_from_file(tmp_path/'bad.jsonl')


def test_glue_without_datasets_or_offline(monkeypatch):
    monkeypatch.setitem(sys.modules, 'datasets', None)                # import datasets -> ImportError
    with pytest.raises(NlEmbryoError, match='pip install datasets'): load_task('glue/sst2')
    fake = types.ModuleType('datasets')
    def offline(*a, **k): raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)")
    fake.load_dataset = offline
    monkeypatch.setitem(sys.modules, 'datasets', fake)
    with pytest.raises(NlEmbryoError, match='be online once') as e: T.load_glue('cola')
    assert 'ConnectionError' in str(e.value)
    with pytest.raises(NlEmbryoError, match='unknown GLUE task'): T.load_glue('squad')


def test_glue_with_a_fake_datasets(monkeypatch):
    class Split(dict):
        def __len__(self): return len(self['label'])
    fake = types.ModuleType('datasets')
    fake.load_dataset = lambda path, name: {'train': Split(sentence1=[f'a{i}' for i in range(50)], sentence2=[f'b{i}' for i in range(50)], label=[i % 2 for i in range(50)]),
                                            'validation': Split(sentence1=['x', 'y'], sentence2=['z', 'w'], label=[0, 1])}
    monkeypatch.setitem(sys.modules, 'datasets', fake)
    t = T.load_glue('mrpc', seed=1)
    assert t.kind == 'pair' and t.metric == 'f1' and t.sizes == {'train': 45, 'dev': 5, 'test': 2}
    assert t.split('test')[0] == [('x', 'z'), ('y', 'w')]


def test_a_task_file_with_too_few_rows_names_the_minimum(tmp_path):
    from nl_embryo.tasks import task_from_file, MIN_TASK_ROWS
    pd.DataFrame({'text': ['good film', 'bad film'], 'label': [1, 0]}).to_csv(tmp_path/'two.csv', index=False)
    with pytest.raises(NlEmbryoError, match=r'2 usable row\(s\), split 2 train / 0 dev / 0 test: the dev and test split\(s\) would be empty') as e:
        task_from_file(tmp_path/'two.csv')
    assert f'at least {MIN_TASK_ROWS} rows' in e.value.fix
    pd.DataFrame({'text': [f't{i}' for i in range(MIN_TASK_ROWS)], 'label': [0, 1] * (MIN_TASK_ROWS // 2)}).to_csv(tmp_path/'ten.csv', index=False)
    assert min(task_from_file(tmp_path/'ten.csv').sizes.values()) >= 1


def test_a_non_utf8_task_file_says_save_it_as_utf8(tmp_path):
    from nl_embryo.tasks import task_from_file
    (tmp_path/'latin.csv').write_bytes('text,label\ncaf\xe9 cr\xe8me,1\nna\xefve,0\n'.encode('latin-1'))
    with pytest.raises(NlEmbryoError, match='is not UTF-8 text') as e: task_from_file(tmp_path/'latin.csv')
    assert 'save it as UTF-8' in e.value.fix
