"""Tests of the probes chapter that do not fit the notebook: planted signals for every solver, selectivity, alignment of
multi-piece words against a direct computation, streaming, the cache of analyze(run, 'probes'), bad input, offline charts."""
import subprocess

import numpy as np
import pandas as pd
import pytest
import torch

from nl_embryo.analysis import analyze
from nl_embryo.core import NlEmbryoError, autocast_dtype
from nl_embryo.corpora import get_tokenizer
from nl_embryo.models import build_model
from nl_embryo.probes import (ProbeTask, align_words, classification_scores, control_labels, extract_features,
                              fit_probes, probe_scores, probe_task, probes_checkpoint, words_frame, PROBE_TASKS)
from nl_embryo.pretrain import PretrainConfig, pretrain
from nl_embryo.timeline import Run



pytestmark = pytest.mark.usefixtures('one_torch_thread')

def planted(n=2400, layers=6, d=32, classes=5, at=3, seed=0):
    "Features where the label is linearly decodable at layer `at` only."
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    X = rng.normal(size=(n, layers, d)).astype(np.float32)
    X[:, at] += 4 * rng.normal(size=(classes, d)).astype(np.float32)[y] / np.sqrt(d)
    return X, y


@pytest.mark.parametrize('solver', ['lbfgs', 'adam', 'sklearn'])
def test_planted_signal_is_found_at_its_layer(solver):
    X, y = planted()
    p = fit_probes(X[:1600], y[:1600], 5, solver=solver, X_dev=X[1600:1900], y_dev=y[1600:1900])
    acc = classification_scores(p.predict(X[1900:]), y[1900:], 5)['accuracy']
    assert np.argmax(acc) == 3 and acc[3] > 0.95, acc
    assert all(abs(acc[l] - 0.2) < 0.08 for l in range(6) if l != 3), acc        # chance elsewhere


def test_lbfgs_matches_sklearn_objective():
    "Same objective: the torch L-BFGS and scikit-learn reach the same accuracy and nearly the same weights' predictions."
    X, y = planted(n=1500, d=24, seed=3)
    X[:, :3] += 0.5 * np.eye(5, 24, dtype=np.float32)[y][:, None]                  # a weaker signal elsewhere too
    ours, ref = (fit_probes(X[:1000], y[:1000], 5, solver=s, weight_decay=1e-2) for s in ('lbfgs', 'sklearn'))
    agree = (ours.predict(X[1000:]) == ref.predict(X[1000:])).mean(1)
    assert (agree > 0.98).all(), agree


def test_selectivity_real_signal_vs_memorisation():
    rng = np.random.default_rng(1)
    types = rng.integers(0, 100, 3000).astype(str)
    split = np.where(np.arange(3000) < 2000, 'train', 'test')
    y = rng.integers(0, 4, 3000)
    X_real = (rng.normal(size=(3000, 1, 64)) + 2 * rng.normal(size=(4, 64))[y][:, None]).astype(np.float32)
    real = probe_scores(X_real, pd.DataFrame({'label': y.astype(str), 'type': types, 'split': split}), 'real')
    X_mem = (rng.normal(size=(100, 64))[types.astype(int)] + 0.1 * rng.normal(size=(3000, 64)))[:, None].astype(np.float32)
    y_mem = control_labels(types, y.astype(str), seed=7)
    mem = probe_scores(X_mem, pd.DataFrame({'label': y_mem, 'type': types, 'split': split}), 'mem')
    sel = lambda df: df.set_index('metric').loc['selectivity', 'value']
    assert sel(real) > 0.4
    assert abs(sel(mem)) < 0.05 and mem.set_index('metric').loc['accuracy', 'value'] > 0.8


def test_control_labels_are_a_function_of_the_type():
    types = np.array(['a', 'b', 'a', 'c', 'b', 'a'] * 50)
    c = control_labels(types, ['X', 'Y', 'Z'] * 100, seed=0)
    assert all(len(set(c[types == t])) == 1 for t in 'abc')
    assert np.array_equal(c, control_labels(types, ['X', 'Y', 'Z'] * 100, seed=0))


@pytest.fixture(scope='module')
def tiny_model(english_tokenizer):
    tok = english_tokenizer
    torch.manual_seed(0)
    return build_model('bert', 'tiny', vocab_size=len(tok)).eval(), tok


def test_multi_piece_words_align(tiny_model):
    model, tok = tiny_model
    texts, words = words_frame([['Unbelievably', ',', 'the', 'filibusters', 'continued', '.'], ['Short', 'one', '.']])
    al = align_words(tok, texts, words)
    pieces = [tok.convert_ids_to_tokens(al.input_ids[0][al.pieces(r)].tolist()) for r in range(6)]
    assert len(pieces[0]) >= 3 and len(pieces[3]) >= 3, pieces               # multi-piece words
    assert ''.join(p.lstrip('#') for p in pieces[0]) == 'unbelievably'
    assert sorted(al.piece_pos[words.sent.to_numpy()[al.word_row] == 0].tolist()) == list(range(1, len(al.input_ids[0]) - 1))
    task = ProbeTask('t', texts, words, pd.DataFrame({'sent': [0, 0, 1], 'span1_start': [0, 3, 0], 'span1_end': [1, 5, 2],
        'span2_start': [-1, -1, -1], 'span2_end': [-1, -1, -1], 'label': ['a', 'b', 'a'], 'type': ['x', 'y', 'z'], 'split': ['train'] * 3}))
    for pooling in ('mean', 'first'):
        X, keep = extract_features(model, tok, task, pooling=pooling)
        assert keep.all() and X.shape == (3, 5, 256)
        amp = autocast_dtype('cpu')      # the direct computation in the analyses' precision (bf16 where the CPU has it)
        with torch.no_grad(), torch.autocast('cpu', dtype=amp or torch.bfloat16, enabled=amp is not None):
            hs = torch.stack(model.base_model(input_ids=torch.tensor(al.input_ids[0])[None], output_hidden_states=True).hidden_states)[:, 0].float()
        vec = lambda r: hs[:, al.pieces(r)].mean(1) if pooling == 'mean' else hs[:, al.pieces(r)[0]]
        assert np.allclose(X[0], vec(0).numpy(), atol=1e-5)
        assert np.allclose(X[1], ((vec(3) + vec(4)) / 2).numpy(), atol=1e-5)     # a span: the mean of its words


def test_turkish_groups_share_pieces():
    tok = get_tokenizer('turkish')
    texts, words = words_frame([['Açık', 'la', 'nma', 'yan', 'soru', '.']], [[False, False, False, True, False, False]])
    al = align_words(tok, texts, words)
    assert (al.n_pieces > 0).all() and np.bincount(al.piece_pos).max() > 1


def test_streamed_float16_features_and_adam_from_disk(tiny_model, tmp_path):
    model, tok = tiny_model
    task = probe_task('pos', n_words=400)
    X, keep = extract_features(model, tok, task)
    X16, keep16 = extract_features(model, tok, task, dtype='float16', out=tmp_path/'f.npy')
    assert isinstance(X16, np.memmap) and X16.dtype == np.float16 and np.array_equal(keep, keep16)
    assert np.allclose(np.load(tmp_path/'f.npy', mmap_mode='r'), X, atol=2e-2, rtol=1e-2)
    y = task.targets[keep].label.astype('category').cat.codes.to_numpy()
    disk = np.load(tmp_path/'f.npy', mmap_mode='r')                           # minibatches are read from the file
    p = fit_probes(disk, y, solver='adam', epochs=3, X_dev=X[:50], y_dev=y[:50])
    assert p.weight.shape[0] == 5 and p.info['epochs'] <= 3
    assert (p.predict(X) == y).mean(1).max() > 0.5


def test_one_class_task_is_refused(tiny_model):
    model, tok = tiny_model
    task = probe_task('pos', n_words=200)
    task.targets['label'] = 'NOUN'
    with pytest.raises(NlEmbryoError, match='single class'):
        probes_checkpoint(model, tok, task.data())
    with pytest.raises(NlEmbryoError, match='single class'):
        fit_probes(np.zeros((10, 2, 3), np.float32), np.zeros(10, int))


def test_unalignable_words(tiny_model):
    model, tok = tiny_model
    zw = '\u200b'                                     # removed by the normaliser: no piece
    sents = [['The', 'cat', zw, 'sat', '.'], ['A', 'dog', 'ran', '.']] * 10
    texts, words = words_frame(sents)
    targets = pd.DataFrame({'sent': words.sent, 'span1_start': words.wid, 'span1_end': words.wid + 1, 'span2_start': -1, 'span2_end': -1,
                            'label': 'X', 'type': words.word, 'split': 'train'})
    task = ProbeTask('zw', texts, words, targets)
    with pytest.raises(NlEmbryoError) as e:
        extract_features(model, tok, task)
    assert 'no piece' in str(e.value) and 'u200b' in str(e.value) and 'fix:' in str(e.value)
    with pytest.warns(UserWarning, match='dropped'):
        X, keep = extract_features(model, tok, task, max_unaligned=0.5)
    assert (~keep).sum() == 10 and len(X) == keep.sum()
    # a sentence longer than the model's positions: the words past the cut have no piece
    long = [['word'] * 600]
    t2, w2 = words_frame(long)
    task2 = ProbeTask('long', t2, w2, targets.iloc[:0].reindex(range(600)).assign(sent=0, span1_start=range(600), span1_end=range(1, 601),
                      span2_start=-1, span2_end=-1, label='X', type='word', split='train'))
    with pytest.raises(NlEmbryoError, match='longer than the model'):
        extract_features(model, tok, task2)


def test_unknown_names(tmp_path, reference, monkeypatch):
    with pytest.raises(NlEmbryoError, match='unknown probing task'): probe_task('klingon')
    with pytest.raises(NlEmbryoError, match='unknown probe solver'): fit_probes(*planted(n=50), solver='newton')
    (tmp_path/'checkpoints').mkdir()      # a run folder with no checkpoint says so, before anything is read
    with pytest.raises(NlEmbryoError, match='no complete checkpoint'): analyze(tmp_path, 'probes', tasks=('pos', 'ner'))
    def boom(*a, **k): raise AssertionError('a checkpoint was loaded')
    monkeypatch.setattr(Run, 'load', boom)   # a run with checkpoints: bad task names are named before any is loaded
    with pytest.raises(NlEmbryoError, match='unknown probing task'): analyze(reference, 'probes', tasks=('pos', 'ner'))


@pytest.mark.parametrize('name', list(PROBE_TASKS))
def test_probe_tasks_from_real_data(name):
    if name in ('dep', 'spans'):
        from nl_embryo.data import fetch
        fetch(['spacy-en'], quiet=True)
    t = probe_task(name, n_words=600, seed=3)
    tg = t.targets
    assert set(tg.split) == {'train', 'dev', 'test'} and tg.groupby('sent').split.nunique().max() == 1
    assert (tg.span1_end > tg.span1_start).all() and tg.sent.max() < len(t.texts) and len(t.labels) >= 2
    n_words = t.words.groupby('sent').size().to_numpy()
    assert (tg.span1_end.to_numpy() <= n_words[tg.sent.to_numpy()]).all()
    assert t.pair == (name in ('dep', 'tr-dep'))
    if t.pair: assert (tg.span2_start >= 0).all() and (tg.span2_start != tg.span1_start).all()
    if name == 'spans': assert set(t.labels) <= {'NP', 'VP', 'S', 'PP', 'ADJP', 'ADVP'}


@pytest.fixture(scope='module')
def short_run(tmp_path_factory):
    out = tmp_path_factory.mktemp('probes')/'run'
    return Run(pretrain(PretrainConfig(out=str(out), corpus='english', steps=4, batch_size=4, checkpoints='0,2,4', eval_batches=1), quiet=True))


def test_analyze_writes_probes_and_caches(short_run, monkeypatch):
    df = analyze(short_run, 'probes', tasks=('pos', 'tr-pos'), n_words=500, progress=False)
    assert set(df.step) == {0, 2, 4} and set(df.task) == {'pos', 'tr-pos'} and set(df.layer) == set(range(5))
    assert {'step', 'task', 'layer', 'metric', 'value', 'n_train', 'n_test', 'n_labels'} <= set(df.columns)
    assert {'accuracy', 'f1_micro', 'f1_macro', 'control_accuracy', 'selectivity', 'majority'} <= set(df.metric)
    a = short_run.path/'analysis'
    assert pd.read_parquet(a/'probes.parquet').equals(df)
    for f in ('probes_accuracy', 'probes_selectivity', 'probes_heatmap'):
        html = (a/f'{f}.html').read_text()
        bundle = html.split('src="', 1)[1].split('"', 1)[0]          # the Vega JavaScript, one shared file beside the pages
        assert 'vegaEmbed' in html and (a/bundle).stat().st_size > 100_000 and (a/f'{f}.png').read_bytes()[:4] == b'\x89PNG'
    # the cache answers without loading a checkpoint, with an identical frame
    def boom(*a, **k): raise AssertionError('a checkpoint was loaded')
    monkeypatch.setattr(Run, 'load', boom)
    again = analyze(short_run.path, 'probes', tasks=('pos', 'tr-pos'), n_words=500, progress=False, charts=False)
    assert again.equals(df)
    # another task is added to the parquet file; the rows of the earlier tasks stay
    monkeypatch.undo()
    analyze(short_run, 'probes', tasks=('pos-full',), n_words=500, steps=[4], progress=False, charts=False)
    assert set(pd.read_parquet(a/'probes.parquet').task) == {'pos', 'tr-pos', 'pos-full'}
    # the report section reads the table: every task, the charts and the values
    from nl_embryo.analysis import report_section
    s = report_section(short_run, 'probes')
    table = s.parts[-1]
    assert set(table.index.get_level_values('task')) == {'pos', 'tr-pos', 'pos-full'} and len(s.parts) >= 4


def test_folder_without_checkpoints_is_refused(tmp_path):
    (tmp_path/'checkpoints').mkdir()
    with pytest.raises(NlEmbryoError, match='no complete checkpoint'):
        analyze(tmp_path, 'probes', progress=False)


from conftest import CHROMIUM, require_browser


def test_chart_html_renders_offline(tmp_path):
    require_browser()
    from nl_embryo.probes import probe_curves_chart, save_chart
    df = pd.DataFrame([dict(step=s, task='pos', layer=l, metric=m, value=0.5 + 0.01 * s * l) for s in (0, 1, 10) for l in range(3)
                       for m in ('accuracy', 'majority')])
    paths = save_chart(probe_curves_chart(df), tmp_path/'chart')
    html = paths['html'].read_text()
    assert '<script src=' not in html
    # a proxy on a closed port: any network request would fail, so what renders came from the file itself
    r = subprocess.run([CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
                        '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic', '--proxy-server=127.0.0.1:9',
                        '--virtual-time-budget=10000', '--dump-dom', paths['html'].as_uri()], capture_output=True, text=True, timeout=120)
    assert 'role="graphics-document"' in r.stdout and ('<svg' in r.stdout or '<canvas' in r.stdout), r.stderr[-500:]


def test_a_few_dimensions_25x_larger_match_standardised_sklearn_within_the_interval():
    """GPT-2's and Pythia's deeper layers carry a few 'massive' dimensions, ~25x the rest, and on some tokens far more.
    The probe standardises each layer's features on the training split, so it scores what scikit-learn's
    LogisticRegression scores on standardised features: within the probe's own 95% interval, at both layers (on the raw
    features, whose scale is a residual stream's, the penalty would swamp the small dimensions that carry the label)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    rng = np.random.default_rng(0)
    n, d, classes = 3000, 48, 6
    y = rng.integers(0, classes, n)
    plain = (0.05 * (0.4 * rng.normal(size=(classes, d))[y] + rng.normal(size=(n, d)))).astype(np.float32)   # a residual stream's small scale
    massive = plain.copy()
    big = [3, 17, 40]
    massive[:, big] *= 25                                                   # a few dimensions 25x larger
    massive[np.ix_(rng.random(n) < 0.05, big)] += 15                        # and far larger on some tokens
    X = np.stack([plain, massive], 1)                                       # (N, 2 layers, D)
    sent = np.arange(n) // 5
    split = np.where(sent % 10 < 7, 'train', np.where(sent % 10 < 8, 'dev', 'test'))
    targets = pd.DataFrame(dict(split=split, label=y, type=[f'w{i % 400}' for i in range(n)], sent=sent))
    ours = probe_scores(X, targets, control=False).query("metric == 'accuracy'").set_index('layer')
    tr, te = split == 'train', split == 'test'
    for layer in (0, 1):
        s = StandardScaler().fit(X[tr, layer])
        clf = LogisticRegression(max_iter=2000).fit(s.transform(X[tr, layer]), y[tr])
        sk = float((clf.predict(s.transform(X[te, layer])) == y[te]).mean())
        r = ours.loc[layer]
        assert r['lo'] <= sk <= r['hi'] and r['value'] > 0.5, (layer, sk, r[['value', 'lo', 'hi']].tolist())
    assert abs(ours.loc[1, 'value'] - ours.loc[0, 'value']) < 0.02      # the massive dimensions change (almost) nothing
