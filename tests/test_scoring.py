"""Pseudo-log-likelihood: masked PLL against the naive definition and minicons, sub-batching, SCRIPT's eq. 7,
the static torch-zip reader, and AntiBERTy (a real pre-trained protein MLM) converted without unpickling."""
import pickle, zipfile

import numpy as np
import pandas as pd
import pytest
import torch

from nl_embryo.core import NlEmbryoError
from nl_embryo.models import build_model
from nl_embryo.torchzip import read_torch_zip
from nl_embryo.scoring import masked_pll, script_pll, sentence_scores, antiberty_dir, load_antiberty, compare_pll, causal_ll, score_sentences

SENTENCES = ['The committee approved the proposal yesterday .', 'Unbelievably , the metamorphosis happened overnight .',
             'It was .', 'Congress shall make no law respecting an establishment of religion .']


@pytest.fixture(scope='module')
def bert(english_tokenizer):
    tok = english_tokenizer
    torch.manual_seed(0)
    model = build_model('bert', 'tiny', vocab_size=len(tok), max_position=64).eval()
    return model, tok


def naive_pll(model, tok, sentences, word_l2r=False):
    "For each sentence and each non-special position in turn: mask it (and, l2r, the later pieces of its word), run the full model."
    rows = []
    for i, s in enumerate(sentences):
        enc = tok(s, return_special_tokens_mask=True)
        ids, words = enc['input_ids'], enc.word_ids()
        for j, special in enumerate(enc['special_tokens_mask']):
            if special: continue
            x = torch.tensor([ids]); x[0, j] = tok.mask_token_id
            if word_l2r:
                for k in range(j + 1, len(ids)):
                    if words[k] is not None and words[k] == words[j]: x[0, k] = tok.mask_token_id
            with torch.no_grad(): lp = torch.log_softmax(model(input_ids=x).logits[0, j], -1)
            rows.append((i, j, float(lp[ids[j]])))
    return pd.DataFrame(rows, columns=['sentence', 'position', 'score'])


@pytest.mark.parametrize('word_l2r', [False, True])
def test_masked_pll_equals_naive_reference_and_sub_batching_does_not_change_it(bert, word_l2r):
    model, tok = bert
    ref = naive_pll(model, tok, SENTENCES, word_l2r)
    outs = [masked_pll(model, tok, SENTENCES, word_l2r=word_l2r, max_copies=m) for m in (1, 3, 5, 10_000)]
    for got in outs:
        assert got[['sentence', 'position']].reset_index(drop=True).equals(ref[['sentence', 'position']])
        np.testing.assert_allclose(got.score, ref.score, atol=1e-5)
    for got in outs[1:]: np.testing.assert_allclose(got.score, outs[0].score, atol=1e-6)
    # the token frame: indices, tokens and words line up with the tokenizer
    t = outs[0]
    assert (t.groupby('sentence').token_index.apply(list) == t.groupby('sentence').size().map(lambda n: list(range(n)))).all()
    assert t[t.sentence == 1].token.tolist() == tok.tokenize(SENTENCES[1])


def test_word_l2r_differs_only_before_the_last_piece(bert):
    model, tok = bert
    a = masked_pll(model, tok, SENTENCES[1:2], word_l2r=True).merge(masked_pll(model, tok, SENTENCES[1:2]), on=['sentence', 'position'])
    multi = a[a.duplicated('word_x', keep=False)]
    assert len(multi) >= 2, 'the test sentence should contain a word split into pieces'
    last, first = multi.groupby('word_x').tail(1), multi.groupby('word_x').head(1)
    np.testing.assert_allclose(last.score_x, last.score_y, atol=1e-6)
    single = a[~a.duplicated('word_x', keep=False)]
    np.testing.assert_allclose(single.score_x, single.score_y, atol=1e-6)
    assert (np.abs(first.score_x.values - first.score_y.values) > 1e-6).all()


def test_sentence_scores_and_script_pll_is_eq7(bert):
    model, tok = bert
    s = sentence_scores(masked_pll(model, tok, SENTENCES), SENTENCES)
    assert s.text.tolist() == SENTENCES and np.allclose(s.pll, s['mean'] * s.n_tokens)
    got = script_pll(model, tok, SENTENCES, batch_size=3)
    for i, sent in enumerate(SENTENCES):
        x = torch.tensor([tok(sent)['input_ids']])
        with torch.no_grad(): log_z = torch.logsumexp(model(input_ids=x).logits[0, 1:-1], -1)
        np.testing.assert_allclose(got[got.sentence == i].score, torch.nn.functional.logsigmoid(log_z).numpy(), atol=1e-5)
    c = compare_pll(masked_pll(model, tok, SENTENCES), got)
    assert list(c.level) == ['token', 'sentence'] and c.n.tolist() == [len(got), len(SENTENCES)]


def test_bad_inputs_say_what_to_do(bert):
    model, tok = bert
    with pytest.raises(NlEmbryoError, match='window=2'): masked_pll(model, tok, SENTENCES, window=2)
    with pytest.raises(NlEmbryoError, match="window=65 is longer than the model's 64"): script_pll(model, tok, SENTENCES, window=65)
    with pytest.raises(NlEmbryoError, match='stride'): masked_pll(model, tok, ['word ' * 100], stride=63)
    with pytest.raises(NlEmbryoError, match='no sentences'): masked_pll(model, tok, [])
    with pytest.raises(NlEmbryoError, match='not a string'): masked_pll(model, tok, ['fine', 3])
    with pytest.raises(NlEmbryoError, match='max_copies'): masked_pll(model, tok, SENTENCES, max_copies=0)
    with pytest.raises(NlEmbryoError, match='masked-LM head'): masked_pll(model.bert, tok, SENTENCES)


def test_long_sentences_are_scored_in_windows(english_tokenizer):
    """A sentence longer than the model's 32 positions: one finite score per token from every scorer; a window of the
    model's size changes nothing for sentences that fit; a very long one goes through passes of at most max_copies rows
    of at most the model's positions."""
    tok = english_tokenizer
    torch.manual_seed(0)
    model = build_model('bert', 'mini', vocab_size=len(tok), max_position=32).eval()
    long = ' '.join(SENTENCES * 3)
    n = len(tok(long)['input_ids'])
    assert n > 3 * 32
    for got in (masked_pll(model, tok, [long, SENTENCES[0]], max_copies=50), masked_pll(model, tok, [long], word_l2r=True, stride=1),
                script_pll(model, tok, [long, SENTENCES[0]], batch_size=2)):
        g = got[got.sentence == 0]
        assert len(g) == n - 2 and (g.position.values == np.arange(1, n - 1)).all() and np.isfinite(got.score).all()
    assert masked_pll(model, tok, SENTENCES).equals(masked_pll(model, tok, SENTENCES, window=32, stride=5))
    # the first tokens of the long sentence, far from its first window's end, see the same input as that window alone
    first = tok.decode(tok(long, add_special_tokens=False)['input_ids'][:30])
    assert len(tok(first)['input_ids']) == 32
    np.testing.assert_allclose(masked_pll(model, tok, [long]).score.values[:5], masked_pll(model, tok, [first]).score.values[:5], atol=1e-5)
    gpt = build_model('gpt-neox', 'mini', vocab_size=len(tok), max_position=32).eval()
    c = causal_ll(gpt, tok, [long, SENTENCES[0]])
    assert (c.sentence == 0).sum() == n - 2 and np.isfinite(c.score).all()
    np.testing.assert_allclose(c[c.sentence == 1].score, causal_ll(gpt, tok, SENTENCES[:1]).score, atol=1e-6)
    shapes = []
    hook = model.base_model.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw['input_ids'].shape)), with_kwargs=True)
    huge = ' '.join(SENTENCES * 20)                                  # ~750 tokens
    try: h = masked_pll(model, tok, [huge], max_copies=16)
    finally: hook.remove()
    assert len(h) == len(tok(huge)['input_ids']) - 2 and np.isfinite(h.score).all()
    assert max(r for r, _ in shapes) == 16 and max(w for _, w in shapes) == 32


def test_causal_ll_is_transformers_own_next_token_loss(bert, english_tokenizer):
    tok = english_tokenizer
    torch.manual_seed(0)
    gpt = build_model('gpt-neox', 'mini', vocab_size=len(tok), max_position=64).eval()
    got = causal_ll(gpt, tok, SENTENCES, batch_size=3)
    for i, s in enumerate(SENTENCES):
        enc = tok(s, return_special_tokens_mask=True)
        x = torch.tensor([enc['input_ids']]); labels = x.masked_fill(torch.tensor([enc['special_tokens_mask']], dtype=torch.bool), -100)
        assert x[0, 0] == tok.cls_token_id == 2                  # the first token is scored given [CLS]
        with torch.no_grad(): loss = float(gpt(input_ids=x, labels=labels).loss)
        n = int((labels != -100).sum())
        assert (got.sentence == i).sum() == n
        np.testing.assert_allclose(got[got.sentence == i].score.sum(), -loss * n, atol=1e-4)
    np.testing.assert_allclose(causal_ll(gpt, tok, SENTENCES, batch_size=1).score, got.score, atol=1e-5)
    # another BOS id is put in front of an encoding that does not start with it: the same tokens, one position later
    sep = causal_ll(gpt, tok, SENTENCES[:1], bos_id=tok.sep_token_id)
    first = got[got.sentence == 0]
    assert (sep.position.values == first.position.values + 1).all() and (sep.token_id.values == first.token_id.values).all()
    assert not np.allclose(sep.score.values, first.score.values)
    np.testing.assert_allclose(score_sentences(gpt, tok, SENTENCES).score, got.score, atol=1e-5)
    model, _ = bert
    np.testing.assert_allclose(score_sentences(model, tok, SENTENCES[:2]).score, masked_pll(model, tok, SENTENCES[:2]).score)
    with pytest.raises(NlEmbryoError, match='causal_ll'): masked_pll(gpt, tok, SENTENCES)
    with pytest.raises(NlEmbryoError, match='causal_ll'): script_pll(gpt, tok, SENTENCES)
    with pytest.raises(NlEmbryoError, match='not a causal LM'): causal_ll(model, tok, SENTENCES)

def test_equal_to_minicons(bert, tmp_path):
    from minicons import scorer
    model, tok = bert
    model.save_pretrained(tmp_path); tok.save_pretrained(tmp_path)
    mc = scorer.MaskedLMScorer(str(tmp_path), 'cpu')
    mc.tokenizer.batch_encode_plus = mc.tokenizer.__call__    # minicons 0.3.39 calls this; transformers 5 removed it
    for metric, l2r in (('original', False), ('within_word_l2r', True)):
        theirs = mc.token_score(SENTENCES, PLL_metric=metric)
        ours = masked_pll(model, tok, SENTENCES, word_l2r=l2r, max_copies=7)
        for i, row in enumerate(theirs):
            np.testing.assert_allclose(ours[ours.sentence == i].score, [s for _, s in row], atol=1e-4)


def test_read_torch_zip_matches_torch_and_refuses_code(tmp_path):
    sd = {'w': torch.randn(3, 5), 'i': torch.arange(12).reshape(3, 4), 'h': torch.randn(4).bfloat16()}
    sd['view'] = sd['w'].t(); sd['part'] = sd['i'].flatten()[5:9]
    torch.save(sd, tmp_path/'a.bin')
    got, ref = read_torch_zip(tmp_path/'a.bin'), torch.load(tmp_path/'a.bin', weights_only=True)
    assert got.keys() == ref.keys()
    for k in ref: assert got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]), k

    class Evil:
        def __reduce__(self): return (eval, ("__import__('os').system('touch HACKED')",))
    with zipfile.ZipFile(tmp_path/'evil.bin', 'w') as zf: zf.writestr('archive/data.pkl', pickle.dumps({'x': Evil()}, protocol=2))
    with pytest.raises(NlEmbryoError, match=r'names \S*eval'): read_torch_zip(tmp_path/'evil.bin')
    (tmp_path/'plain.bin').write_bytes(pickle.dumps({'x': 1}))
    with pytest.raises(NlEmbryoError, match='not a torch zip'): read_torch_zip(tmp_path/'plain.bin')


@pytest.fixture(scope='module')
def antiberty():
    from nl_embryo.data import fetch
    fetch(['antiberty'], quiet=True)
    return load_antiberty()


def test_antiberty_conversion_is_exact_and_safetensors_only(antiberty):
    from nl_embryo.data import fetched_path
    from safetensors.torch import load_file
    folder = antiberty_dir()
    assert sorted(p.name for p in folder.glob('*.bin')) == [] and (folder/'model.safetensors').exists()
    # cross-check of the static reader against torch's restricted loader, on this file only
    src = fetched_path('antiberty')/'antiberty'/'trained_models'/'AntiBERTy_md_smooth'/'pytorch_model.bin'
    ref = torch.load(src, weights_only=True, map_location='cpu')
    saved = load_file(str(folder/'model.safetensors'))
    for k, v in saved.items(): assert torch.equal(v, ref[k]), k
    model, tok = antiberty
    assert torch.equal(model.cls.predictions.decoder.weight, ref['cls.predictions.decoder.weight'])
    vocab = (src.parent.parent/'vocab.txt').read_text().split()
    assert tok.convert_ids_to_tokens(tok('ACDY')['input_ids']) == ['[CLS]', 'A', 'C', 'D', 'Y', '[SEP]']
    assert [tok.convert_tokens_to_ids(t) for t in vocab] == list(range(len(vocab)))


def test_antiberty_conversion_is_written_with_the_umask_permissions(tmp_path, monkeypatch):
    "The converted folder's files, the weights included (safetensors writes 0600 whatever the umask), get the umask's bits."
    import os
    import nl_embryo.scoring as S
    from nl_embryo.data import fetch
    fetch(['antiberty'], quiet=True)
    monkeypatch.setattr(S, 'cache_path', lambda *parts: tmp_path.joinpath(*parts))
    old = os.umask(0o002)                                           # group-writable: not the default 0o644 either
    try: folder = antiberty_dir()
    finally: os.umask(old)
    assert folder == tmp_path/'models'/'antiberty'
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()}
    assert 'model.safetensors' in modes and set(modes.values()) == {'0o664'}, modes


# the PLL of AntiBERTy on real antibodies against shuffled copies is checked by the scoring notebook (13_scoring.ipynb)
