"""Interventions: each one's defining property on every architecture, the input left untouched, the record in the
config, save/reload round trips, composition and replay, ALBERT's shared layers, bad input."""
import re

import numpy as np
import pytest
import torch
from transformers import AutoModelForMaskedLM, BertModel

from nl_embryo.core import NlEmbryoError
from nl_embryo.corpora import char_tokenizer
from nl_embryo.models import build_config, build_model, is_pair, load_model, quiet_transformers
from nl_embryo.interventions import (INTERVENTIONS, apply_interventions, canonical_component, canonical_interventions, clean,
                                     clean_components, format_interventions, freeze_except_embeddings, interventions_of,
                                     model_parts, oracle_init, parse_interventions, remove_layers, rescale_init,
                                     reverse_layers, shuffle_embeddings, substitute_embeddings, swap_embeddings,
                                     tokenizer_for)

V = 200
AMINO = char_tokenizer('ACDEFGHIKLMNPQRSTVWY')   # 25 tokens, for a donor with another vocabulary
ARCHS = ['bert', 'roberta', 'albert', 'electra', 'electra-generator', 'ale', 'bert-model']
MLM = {'bert', 'roberta', 'albert', 'electra-generator'}
BASE = {'bert': 'bert', 'roberta': 'roberta', 'albert': 'albert', 'electra': 'electra', 'electra-generator': 'electra',
        'ale': 'albert', 'bert-model': ''}


def make(arch, seed=0, vocab_size=V, **kw):
    "A tiny model of `arch` whose every parameter moved away from its initial value (so any re-init shows), in eval mode."
    torch.manual_seed(seed)
    if arch == 'bert-model':    # a bare encoder without MLM head, like all-MiniLM-L6-v2
        with quiet_transformers(): m = BertModel(build_config('bert', 'tiny', vocab_size=vocab_size, max_position=64, **kw))
    else:
        m = build_model('electra' if arch == 'electra-generator' else arch, 'tiny', vocab_size=vocab_size, max_position=64, **kw)
        if arch == 'electra-generator': m = m.generator
    with torch.no_grad():
        for p in m.parameters(): p.add_(torch.randn_like(p) * 0.05)
    return m.eval()


def net(m): return m.discriminator if is_pair(m) else m


def ids(seed=0, n=2, T=12, vocab_size=V):
    return torch.randint(5, vocab_size, (n, T), generator=torch.Generator().manual_seed(seed))


def out(m, x=None):
    "The model's main output: logits, or the last hidden state of a bare encoder."
    x = ids() if x is None else x
    with torch.no_grad():
        o = net(m)(input_ids=x)
    return o.logits if hasattr(o, 'logits') else o.last_hidden_state


def hidden(m, x=None):
    "Hidden states of the encoder model (embeddings output first)."
    with torch.no_grad(): return net(m).base_model(input_ids=ids() if x is None else x, output_hidden_states=True).hidden_states


def params(m): return {n: p.detach().clone() for n, p in net(m).named_parameters()}


pytestmark = pytest.mark.usefixtures('one_torch_thread')


@pytest.fixture(scope='module')
def models(one_torch_thread):
    return {a: make(a) for a in ARCHS}


def donor_for(arch):
    "A donor of the same family with the 25-token amino-acid vocabulary, and its tokenizer."
    return make(arch, seed=3, vocab_size=len(AMINO)), AMINO


def calls(arch):
    "One call of every intervention (name, function of the model)."
    return {
        'reverse_layers': reverse_layers,
        'remove_layers': lambda m: remove_layers(m, every=2),
        'clean': lambda m: clean(m, 'layer.0+layer_norms', seed=2),
        'shuffle_embeddings': lambda m: shuffle_embeddings(m, seed=1),
        'swap_embeddings': lambda m: swap_embeddings(m, *donor_for(arch)),
        'substitute_embeddings': lambda m: substitute_embeddings(m, used_ids=20),
        'rescale_init': lambda m: rescale_init(m, 'variance'),
        'oracle_init': oracle_init,
        'freeze_except_embeddings': freeze_except_embeddings,
    }


def test_registry_is_complete():
    assert set(INTERVENTIONS) == set(calls('bert'))


@pytest.mark.parametrize('arch', ARCHS)
@pytest.mark.parametrize('name', list(calls('bert')))
def test_round_trip_record_and_untouched_input(models, arch, name, tmp_path):
    m = models[arch]
    before, y0 = params(m), out(m)
    new = calls(arch)[name](m).eval()
    # the input model is untouched, and has no record
    assert all(torch.equal(p, before[n]) for n, p in net(m).named_parameters()) and torch.equal(out(m), y0)
    assert interventions_of(m) == []
    rec = interventions_of(new)
    assert len(rec) == 1 and rec[0]['name'] == name and isinstance(rec[0]['options'], dict)
    # save and reload with plain transformers: same outputs, same record
    with quiet_transformers(): new.save_pretrained(tmp_path)
    with quiet_transformers():
        back = (AutoModelForMaskedLM.from_pretrained(tmp_path) if arch in MLM else load_model(tmp_path)).eval()
    assert type(back) is type(new) and interventions_of(back) == rec
    x = ids(vocab_size=new.config.vocab_size)
    assert torch.equal(out(back, x), out(new, x))


@pytest.mark.parametrize('arch', ARCHS)
def test_reverse_twice_is_identity(models, arch):
    m = models[arch]
    once, twice = reverse_layers(m), reverse_layers(reverse_layers(m))
    assert torch.equal(out(twice), out(m))
    if arch in ('albert', 'ale'):      # one shared layer: reversing is the identity
        assert torch.equal(out(once), out(m))
    else:
        assert not torch.allclose(out(once), out(m))
        # the reversed model runs the original layers last to first
        enc, h = net(m).base_model.encoder, hidden(m)[0]
        with torch.no_grad():
            for layer in list(enc.layer)[::-1]: h = layer(h)
        assert torch.allclose(hidden(once)[-1], h, atol=1e-5)
    assert [r['name'] for r in interventions_of(twice)] == ['reverse_layers', 'reverse_layers']


@pytest.mark.parametrize('arch', ARCHS)
@pytest.mark.parametrize('k', [1, 3])
def test_remove_last_equals_first_layers(models, arch, k):
    m = models[arch]
    L = net(m).config.num_hidden_layers
    short = remove_layers(m, last=k)
    assert short.config.num_hidden_layers == L - k
    assert torch.allclose(hidden(short)[-1], hidden(m)[L - k], atol=1e-5)


@pytest.mark.parametrize('arch', ARCHS)
def test_remove_every_second(models, arch):
    m = models[arch]
    new = remove_layers(m, every=2)
    assert new.config.num_hidden_layers == 2
    if arch in ('albert', 'ale'):   # one shared layer applied twice: the same as removing the last two
        assert torch.equal(out(new), out(remove_layers(m, last=2)))
    else:                           # layers 0 and 2 of the original, in order
        old = list(net(m).base_model.encoder.layer)
        for a, i in zip(new.base_model.encoder.layer, [0, 2]):
            assert all(torch.equal(p, q) for p, q in zip(a.parameters(), old[i].parameters()))
        assert torch.equal(out(remove_layers(m, layers=[1, 3])), out(new))


def test_remove_errors(models):
    m = models['bert']
    for kw in [dict(last=4), dict(last=0), dict(last=9), dict(every=1), dict(layers=[0, 1, 2, 3]), dict(layers=[7]),
               dict(blocks=[0]), dict(blocks=[5]), dict(blocks=[1, 2, 3, 4]), dict(), dict(last=1, every=2), dict(blocks=[1], layers=[0])]:
        with pytest.raises(NlEmbryoError) as e: remove_layers(m, **kw)
        assert 'fix:' in str(e.value)
    with pytest.raises(NlEmbryoError, match='4 blocks'): remove_layers(m, last=4)


def test_albert_groups():
    "Several ALBERT groups: reverse = groups and inner layers reversed; removal must keep equal runs of groups."
    m = make('albert', num_hidden_groups=2, inner_group_num=2)   # 4 applications: groups 0, 0, 1, 1
    enc = m.albert.encoder
    def run(blocks):
        h = enc.embedding_hidden_mapping_in(m.albert.embeddings(input_ids=ids()))
        with torch.no_grad():
            for g, j in blocks: h = enc.albert_layer_groups[g].albert_layers[j](h)
        return h
    blocks = [(0, 0), (0, 1)] * 2 + [(1, 0), (1, 1)] * 2
    assert torch.allclose(hidden(m)[-1], run(blocks), atol=1e-5)
    assert torch.allclose(hidden(reverse_layers(m))[-1], run(blocks[::-1]), atol=1e-5)
    assert torch.equal(out(reverse_layers(reverse_layers(m))), out(m))
    two = remove_layers(m, last=2)
    assert (two.config.num_hidden_layers, two.config.num_hidden_groups) == (2, 1)
    assert torch.allclose(hidden(two)[-1], run(blocks[:4]), atol=1e-5)
    alt = remove_layers(m, every=2)    # applications 0 and 2: group 0 once, group 1 once
    assert (alt.config.num_hidden_layers, alt.config.num_hidden_groups) == (2, 2)
    assert torch.allclose(hidden(alt)[-1], run(blocks[:2] + blocks[4:6]), atol=1e-5)
    three = remove_layers(m, last=1)   # groups 0, 0, 1: ALBERT's own pattern for 3 applications of 2 groups
    assert (three.config.num_hidden_layers, three.config.num_hidden_groups) == (3, 2)
    assert torch.allclose(hidden(three)[-1], run(blocks[:6]), atol=1e-5)
    with pytest.raises(NlEmbryoError, match='ALBERT'): remove_layers(m, layers=[0])   # 0, 1, 1: not expressible
    comps, groups = clean_components(m), model_parts(m).layers
    assert [comps[f'block{k}'] for k in range(1, 5)] == [[f'{groups}.{g}'] for g in (0, 0, 1, 1)]   # block k: the group it applies
    assert not any(k.startswith('layer.') for k in comps)
    # the Hugging Face spelling layer.N named group N: still so, recorded as the first block that applies it
    for legacy, block in [('layer.0', 'block1'), ('layer.1', 'block3')]:
        a, b = clean(m, legacy, seed=1), clean(m, block, seed=1)
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
        assert interventions_of(a) == interventions_of(b) == [{'name': 'clean', 'options': {'components': [block], 'seed': 1}}]


@pytest.mark.parametrize('arch', ARCHS)
def test_oracle_keeps_each_multiset(models, arch):
    m = models[arch]
    new = oracle_init(m, seed=4)
    for (n, p), q in zip(net(m).named_parameters(), new.parameters()):
        assert torch.equal(p.flatten().sort().values, q.flatten().sort().values), n
        if p.max() > p.min(): assert not torch.equal(p, q), n
    assert all(torch.equal(a, b) for a, b in zip(oracle_init(m, seed=4).parameters(), new.parameters()))   # seeded
    if new.get_output_embeddings() is not None:
        assert new.get_output_embeddings().weight is new.get_input_embeddings().weight


@pytest.mark.parametrize('arch', ['bert', 'albert'])
@pytest.mark.parametrize('match', ['magnitude', 'variance'])
def test_rescale_init(models, arch, match):
    m = models[arch]
    new = rescale_init(m, match)
    fresh = clean(m, 'all')
    for (n, p), q, f in zip(net(m).named_parameters(), new.parameters(), fresh.parameters()):
        if p.ndim >= 2:
            assert not torch.equal(p, q)
            if match == 'magnitude': assert torch.isclose(q.abs().mean(), p.abs().mean(), rtol=1e-5), n
            else: assert torch.isclose(q.std(), p.std(), rtol=1e-5) and torch.isclose(q.mean(), p.mean(), atol=1e-6), n
        else:
            assert torch.equal(q, f), n    # biases and LayerNorms: the default initialisation
    with pytest.raises(NlEmbryoError, match='magnitude, variance'): rescale_init(m, 'std')


@pytest.mark.parametrize('arch', ARCHS)
def test_shuffle_keeps_specials_and_permutes_the_rest(models, arch):
    m = models[arch]
    new = shuffle_embeddings(m, seed=1)
    E0, E1 = net(m).get_input_embeddings().weight, new.get_input_embeddings().weight
    assert torch.equal(E1[:5], E0[:5])
    assert (E1[5:] != E0[5:]).any(-1).float().mean() > 0.95
    src = torch.cdist(E1[5:], E0, compute_mode='donot_use_mm_for_euclid_dist').argmin(1)   # where each row came from
    assert torch.equal(E1[5:], E0[src]) and sorted(src.tolist()) == list(range(5, len(E0)))   # a permutation of 5..V-1
    outp = new.get_output_embeddings()
    if outp is not None:
        assert outp.weight is E1                                   # still tied: the output rows move with the inputs
        b0 = net(m).get_output_embeddings().bias
        assert torch.equal(outp.bias, b0)                          # the output bias (the unigram prior) stays with its token
        b1 = shuffle_embeddings(m, seed=1, outputs='all').get_output_embeddings().bias
        assert torch.equal(b1[5:], b0[src]) and torch.equal(b1[:5], b0[:5])   # outputs='all': relabelled as a whole
    assert not torch.equal(shuffle_embeddings(m, seed=2).get_input_embeddings().weight, E1)
    assert torch.equal(shuffle_embeddings(m, seed=1).get_input_embeddings().weight, E1)
    kept = shuffle_embeddings(m, keep=list(range(10)))
    assert torch.equal(kept.get_input_embeddings().weight[:10], E0[:10])
    assert interventions_of(kept)[0]['options']['keep'] == list(range(10))


def component_params(arch, component, names):
    "The parameter names a component should cover, written independently of clean_components."
    b = BASE[arch]
    pre = f'{b}.' if b else ''
    in_base = lambda n: n.startswith(pre) and not n.startswith(f'{pre}pooler.')
    rules = {
        'word_embeddings': lambda n: 'embeddings.word_embeddings' in n,
        'position_embeddings': lambda n: 'embeddings.position_embeddings' in n,
        'layer_norms': lambda n: in_base(n) and re.search(r'LayerNorm|layer_norm', n),
        'encoder': lambda n: re.search(r'encoder\.(layer|albert_layer_groups)\.', n),
        'layer.0': lambda n: re.search(r'encoder\.(layer|albert_layer_groups)\.0\.', n),
        'block1': lambda n: re.search(r'encoder\.(layer|albert_layer_groups)\.0\.', n),
        'embedding_projection': lambda n: 'embedding_hidden_mapping_in' in n or 'embeddings_project' in n,
        'head': lambda n: not in_base(n),
        'all': lambda n: True,
    }
    return {n for n in names if rules[component](n)}


@pytest.mark.parametrize('arch', ARCHS)
@pytest.mark.parametrize('components', ['word_embeddings', 'position_embeddings', 'layer_norms', 'encoder', 'layer.0', 'block1',
                                        'head', 'all', 'word_embeddings+layer_norms', 'embedding_projection'])
def test_clean_changes_only_what_was_asked(models, arch, components):
    m = models[arch]
    if components == 'embedding_projection' and arch not in ('albert', 'ale', 'electra-generator'):
        with pytest.raises(NlEmbryoError, match='embedding_projection'): clean(m, components)
        return
    new = clean(m, components, seed=3)
    old = params(m)
    changed = {n for n, p in new.named_parameters() if not torch.equal(p, old[n])}
    want = set().union(*(component_params(arch, c, old) for c in components.split('+')))
    assert changed == want, (changed ^ want)
    if new.get_output_embeddings() is not None:
        assert new.get_output_embeddings().weight is new.get_input_embeddings().weight
    # seeded: the same seed gives the same weights
    assert all(torch.equal(p, q) for p, q in zip(clean(m, components, seed=3).parameters(), new.parameters()))
    recorded = [canonical_component(c) for c in components.split('+')]   # blocks counted from 1: layer.0 is recorded as block1
    assert interventions_of(new) == [{'name': 'clean', 'options': {'components': recorded, 'seed': 3}}]


def test_clean_reinitialises_a_loaded_model(tmp_path):
    "from_pretrained marks loaded weights as initialised (transformers skips them in _init_weights); clean must not."
    m = make('bert')
    with quiet_transformers():
        m.save_pretrained(tmp_path); loaded = AutoModelForMaskedLM.from_pretrained(tmp_path)
    new = clean(loaded, 'all')
    assert not torch.equal(new.bert.encoder.layer[0].output.dense.weight, loaded.bert.encoder.layer[0].output.dense.weight)
    assert torch.equal(new.bert.encoder.layer[0].output.LayerNorm.weight, torch.ones(256))
    assert all(torch.equal(p, q) for p, q in zip(new.parameters(), clean(m, 'all').parameters()))


def test_clean_errors(models):
    for comp in ['attention', 'layer.4', 'block5', 'block0', 'embedding_projection', '']:
        with pytest.raises(NlEmbryoError) as e: clean(models['bert'], comp)
        assert 'word_embeddings' in str(e.value) and 'block4' in str(e.value) and 'layer.3' not in str(e.value)
        if comp.startswith(('layer.', 'block')): assert 'blocks block1..block4, counted from 1' in str(e.value)
    with pytest.raises(NlEmbryoError) as e: clean(models['bert'], 'layer.4')
    assert "block5 (given as layer.4)" in str(e.value)
    with pytest.raises(NlEmbryoError, match='no head'):
        with quiet_transformers(): clean(BertModel(build_config('bert', 'tiny', vocab_size=V), add_pooling_layer=False), 'head')


@pytest.mark.parametrize('arch', ARCHS)
@pytest.mark.parametrize('how', ['cycle', 'random'])
def test_substitute_maps_unused_rows_onto_used(models, arch, how):
    m = models[arch]
    used = [2, 3, 7, 8, 9, 50, 120]            # specials 2, 3 among them, as in a corpus's blocks
    new = substitute_embeddings(m, np.array([used, used]), how=how, seed=5)
    E0, E1 = net(m).get_input_embeddings().weight, new.get_input_embeddings().weight
    sources = [7, 8, 9, 50, 120]
    assert torch.equal(E1[:5], E0[:5]) and torch.equal(E1[sources], E0[sources])
    unused = [i for i in range(V) if i >= 5 and i not in sources]
    d = torch.cdist(E1[unused], E0[sources], compute_mode='donot_use_mm_for_euclid_dist')
    assert (d.min(1).values == 0).all()                                    # every unused row is a used row
    src = torch.tensor(sources)[d.argmin(1)]
    if how == 'cycle': assert src.tolist() == [sources[k % 5] for k in range(len(unused))]
    else: assert len(set(src.tolist())) == 5
    if new.get_output_embeddings() is not None:
        assert new.get_output_embeddings().weight is E1
        assert torch.equal(new.get_output_embeddings().bias[unused], net(m).get_output_embeddings().bias[src])
    rec = interventions_of(new)[0]['options']
    assert rec['used_ids'] == '7-9,50,120'
    again = apply_interventions(m, interventions_of(new))      # the record replays exactly
    assert torch.equal(again.get_input_embeddings().weight, E1)


def test_substitute_inputs(models):
    m = models['bert']
    first = substitute_embeddings(m, 10)                     # the first 10 non-special ids: 5..14
    assert interventions_of(first)[0]['options']['used_ids'] == '5-14'
    assert torch.equal(substitute_embeddings(m, '5-14').get_input_embeddings().weight, first.get_input_embeddings().weight)
    assert torch.equal(substitute_embeddings(m, torch.arange(5, 15)).get_input_embeddings().weight,
                       first.get_input_embeddings().weight)
    for bad in [[1, 2, 3], [5, 999], 0, 500, '5-x']:
        with pytest.raises(NlEmbryoError): substitute_embeddings(m, bad)
    with pytest.raises(NlEmbryoError, match='cycle, random'): substitute_embeddings(m, 10, how='nearest')


@pytest.mark.parametrize('arch', ARCHS)
def test_freeze_except_embeddings(models, arch):
    m = models[arch]
    new = freeze_except_embeddings(m).train()
    trainable = {n for n, p in new.named_parameters() if p.requires_grad}
    b = BASE[arch]
    want = {n for n, _ in new.named_parameters()
            if 'word_embeddings' in n or (arch in MLM and not n.startswith(f'{b}.'))}
    assert trainable == want and any('word_embeddings' in n for n in trainable)
    x = ids()
    o = new(input_ids=x, labels=x) if arch in MLM else new(input_ids=x)
    loss = o.loss if arch in MLM else (o.logits if hasattr(o, 'logits') else o.last_hidden_state).pow(2).mean()
    loss.backward()
    torch.optim.SGD(new.parameters(), lr=1.0).step()
    old = params(m)
    moved = {n for n, p in new.named_parameters() if not torch.equal(p, old[n])}
    assert moved and moved <= trainable
    assert all(p.requires_grad for p in new.requires_grad_(True).parameters())    # how to unfreeze
    assert all(p.requires_grad for p in net(m).parameters())                       # the input is untouched


@pytest.mark.parametrize('arch', ARCHS)
def test_swap_embeddings(models, arch, tmp_path):
    m = models[arch]
    donor, tok = donor_for(arch)
    new = swap_embeddings(m, donor, tok)
    assert tokenizer_for(new) is tok and tokenizer_for(m, 'fallback') == 'fallback'
    assert new.config.vocab_size == len(tok) == new.get_input_embeddings().weight.shape[0]
    assert torch.equal(new.get_input_embeddings().weight, net(donor).get_input_embeddings().weight)
    assert all(torch.equal(p, q) for p, q in zip(new.base_model.encoder.parameters(), net(m).base_model.encoder.parameters()))
    if new.get_output_embeddings() is not None:
        assert new.get_output_embeddings().weight is new.get_input_embeddings().weight
        assert torch.equal(new.get_output_embeddings().bias, net(donor).get_output_embeddings().bias)
    x = tok(['ACDK', 'WY'], padding=True, return_tensors='pt')['input_ids']
    assert out(new, x).shape[:2] == x.shape
    # the tokenizer travels through later interventions
    assert tokenizer_for(reverse_layers(new)) is tok
    # same id space: no tokenizer needed
    same = swap_embeddings(m, make(arch, seed=9))
    assert tokenizer_for(same) is None and same.config.vocab_size == V


def test_swap_from_a_path_replays(models, tmp_path):
    donor, tok = donor_for('bert')
    with quiet_transformers(): donor.save_pretrained(tmp_path/'donor')
    tok.save_pretrained(tmp_path/'donor')
    new = swap_embeddings(models['bert'], tmp_path/'donor')
    assert len(tokenizer_for(new)) == len(tok) and interventions_of(new) == [{'name': 'swap_embeddings', 'options': {'donor': str(tmp_path/'donor')}}]
    again = apply_interventions(make('bert', seed=1), interventions_of(new))
    assert torch.equal(again.get_input_embeddings().weight, new.get_input_embeddings().weight)


def test_swap_errors(models):
    m = models['bert']
    with pytest.raises(NlEmbryoError, match='128-dimensional but the model.s are 256'):
        swap_embeddings(m, make('albert'))                              # ALBERT's embeddings are 128 wide
    with quiet_transformers():
        narrow = BertModel(build_config('bert', 'tiny', vocab_size=V, hidden_size=128, num_attention_heads=2))
    with pytest.raises(NlEmbryoError, match='same embedding size'): swap_embeddings(m, narrow)
    with pytest.raises(NlEmbryoError, match='donor_tokenizer'): swap_embeddings(m, donor_for('bert')[0])
    with pytest.raises(NlEmbryoError, match='no run'): swap_embeddings(m, '/nonexistent/model')


def test_pair_means_discriminator(models):
    "(Every intervention on the pair is in the round-trip matrix above, arch 'electra'.)"
    pair = models['electra']
    new = shuffle_embeddings(pair)
    assert type(new).__name__ == 'ElectraForTokenClassification' and interventions_of(new)[0]['name'] == 'shuffle_embeddings'
    assert pair.embeddings_shared() and interventions_of(pair) == []
    assert not torch.equal(new.get_input_embeddings().weight, pair.generator.get_input_embeddings().weight)
    assert type(apply_interventions(pair, [])).__name__ == 'ElectraForTokenClassification'


def test_composition_records_in_order_and_replays(models, tmp_path):
    m = models['roberta']
    both = apply_interventions(m, 'reverse_layers, remove_layers(last=1), shuffle_embeddings(seed=3)')
    assert [r['name'] for r in interventions_of(both)] == ['reverse_layers', 'remove_layers', 'shuffle_embeddings']
    assert torch.equal(out(both), out(shuffle_embeddings(remove_layers(reverse_layers(m), last=1), seed=3)))
    with quiet_transformers():
        both.save_pretrained(tmp_path); back = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert interventions_of(back) == interventions_of(both) and back.config.num_hidden_layers == 3
    more = oracle_init(back)                              # a reloaded model keeps adding to its record
    assert [r['name'] for r in interventions_of(more)][-2:] == ['shuffle_embeddings', 'oracle_init']
    replay = apply_interventions(m, interventions_of(both))
    assert torch.equal(out(replay), out(both))


def test_spec_parsing():
    steps = parse_interventions("reverse_layers,remove_layers(every=2), clean(components=layer.0+layer_norms, seed=1),"
                                "substitute_embeddings(used_ids='5-54,60', how=random), shuffle_embeddings(keep=[0, 1]),"
                                "substitute_embeddings(used_ids=5-54, seed=-3)")
    assert steps == [dict(name='reverse_layers', options={}), dict(name='remove_layers', options={'every': 2}),
                     dict(name='clean', options={'components': 'layer.0+layer_norms', 'seed': 1}),
                     dict(name='substitute_embeddings', options={'used_ids': '5-54,60', 'how': 'random'}),
                     dict(name='shuffle_embeddings', options={'keep': [0, 1]}),
                     dict(name='substitute_embeddings', options={'used_ids': '5-54', 'seed': -3})]
    assert parse_interventions([{'name': 'oracle_init', 'seed': 2}, 'reverse_layers']) == [
        dict(name='oracle_init', options={'seed': 2}), dict(name='reverse_layers', options={})]
    assert parse_interventions(None) == parse_interventions([]) == parse_interventions('') == []
    with pytest.raises(NlEmbryoError) as e: parse_interventions('reverse_layers,flip_layers')
    assert "unknown intervention 'flip_layers'" in str(e.value) and 'oracle_init' in str(e.value)
    for bad in ['remove_layers(2)', 'clean(components=[x)', 'oracle_init(sed=1)', 'oracle_init(seed=)', '3d', [42], {'options': {}}]:
        with pytest.raises(NlEmbryoError): parse_interventions(bad)


def test_not_a_bert_family_model():
    with pytest.raises(NlEmbryoError, match='cannot intervene on a Linear: .*no architecture entry says where its layers'): reverse_layers(torch.nn.Linear(2, 2))


def test_from_a_run_checkpoint(tmp_path):
    "A model folder opened with Run.load (eval mode, tokenizer) goes through apply_interventions like a built one."
    from nl_embryo.timeline import Run
    from nl_embryo.corpora import get_tokenizer
    m = make('bert', vocab_size=8000)
    with quiet_transformers(): m.save_pretrained(tmp_path)
    get_tokenizer('english').save_pretrained(tmp_path)
    model, tok = Run(tmp_path).load()
    new = apply_interventions(model, 'remove_layers(last=2),clean(components=head)')
    x = tok(['the cat sat on the mat'], return_tensors='pt')['input_ids']
    assert out(new, x).shape == (1, x.shape[1], 8000) and tokenizer_for(new, tok) is tok


# ---- one layer numbering: blocks counted from 1, the Hugging Face module spelling read too


@pytest.mark.parametrize('arch', ['bert', 'albert', 'gpt-neox'])
def test_old_and_new_block_spelling_give_the_same_intervention(arch):
    "`layer.N` (the Hugging Face module index, from 0) and `block{N+1}` give the same model and the same record, in the new spelling."
    torch.manual_seed(0)
    m = build_model(arch, 'tiny', vocab_size=V, max_position=64).eval()
    same = lambda a, b: all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    legacy, block = ('layer.0', 'block1') if arch == 'albert' else ('layer.1', 'block2')   # ALBERT's tiny model: one shared group, layer.0
    old, new = clean(m, f'{legacy}+layer_norms', seed=2), clean(m, [block, 'layer_norms'], seed=2)
    assert same(old, new) and interventions_of(old) == interventions_of(new) == [
        {'name': 'clean', 'options': {'components': [block, 'layer_norms'], 'seed': 2}}]
    if arch == 'albert':
        with pytest.raises(NlEmbryoError, match='layer.1'): clean(m, 'layer.1')   # no such module: refused as before
    if arch != 'albert':    # ALBERT's tiny model has one shared group: layer.1 does not exist there
        a, b = remove_layers(m, layers=[0, 2]), remove_layers(m, blocks=[1, 3])
        assert same(a, b) and interventions_of(a) == interventions_of(b) == [{'name': 'remove_layers', 'options': {'blocks': [1, 3]}}]
        with pytest.raises(NlEmbryoError, match='blocks 1..4'): remove_layers(m, blocks=[0])    # counted from 1: there is no block 0
        spec = "clean(components=layer.0, seed=1), remove_layers(layers=[3])"
        assert format_interventions(canonical_interventions(spec)) == "clean(components=block1, seed=1), remove_layers(blocks=[4])"
        x, y = apply_interventions(m, spec), apply_interventions(m, format_interventions(canonical_interventions(spec)))
        assert same(x, y) and interventions_of(x) == interventions_of(y)
        assert [r['options'] for r in interventions_of(x)] == [{'components': ['block1'], 'seed': 1}, {'blocks': [4]}]
        assert interventions_of(apply_interventions(m, interventions_of(x))) == interventions_of(x)   # the record replays as itself


def test_surgery_names_use_the_new_spelling():
    from nl_embryo.surgery import DEFAULT_SURGERIES, SURGERY, parse_surgeries, surgery_checkpoint
    assert 'clean:block1' in DEFAULT_SURGERIES and not any('layer.' in s for s in DEFAULT_SURGERIES)
    assert parse_surgeries('reverse,clean:layer.0,clean:layer.1+layer_norms,remove_layers(layers=[0])') == (
        'identity', 'reverse', 'clean:block1', 'clean:block2+layer_norms', 'remove_layers(blocks=[1])')
    assert 'clean:block' in SURGERY.cli['help'] and 'Hugging Face module index' in SURGERY.cli['help']
    torch.manual_seed(0)
    m = build_model('bert', 'tiny', vocab_size=V, max_position=64).eval()
    batches = [np.random.default_rng(0).integers(5, V, (4, 32))]
    data = dict(batches=batches, seed=0, task=None)
    old = surgery_checkpoint(m, None, data, surgeries=('clean:layer.0', 'remove_layers(layers=[1])'))
    new = surgery_checkpoint(m, None, data, surgeries=('clean:block1', 'remove_layers(blocks=[2])'))
    assert sorted(set(old.surgery)) == ['clean:block1', 'identity', 'remove_layers(blocks=[2])']    # the table names the block from 1
    pd_equal = old.reset_index(drop=True).equals(new.reset_index(drop=True))
    assert pd_equal


def test_block_k_is_the_probes_and_attentions_layer_k(english_tokenizer):
    "Cleaning block k leaves the probes' layers 0..k-1 and the attention's layers 1..k-1 as they were and changes layer k."
    from nl_embryo.attention import attention_scores
    from nl_embryo.probes import ProbeTask, extract_features
    from nl_embryo.words import words_frame
    import pandas as pd
    tok = english_tokenizer
    torch.manual_seed(0)
    m = build_model('bert', 'tiny', vocab_size=len(tok), max_position=64).eval()
    texts, words = words_frame([['The', 'cat', 'sat', 'on', 'the', 'mat', '.'], ['A', 'dog', 'ran', 'home', '.']] * 3)
    targets = pd.DataFrame({'sent': words.sent, 'span1_start': words.wid, 'span1_end': words.wid + 1, 'span2_start': -1,
                            'span2_end': -1, 'label': 'X', 'type': words.word, 'split': 'train'})
    task = ProbeTask('t', texts, words, targets)
    sentences = [' '.join(map(str, words[words.sent == s].word)) for s in range(4)]
    scores = lambda net: attention_scores(net, tok, sentences).set_index(['layer', 'head', 'pattern'])['value'].sort_index()
    X0, a0 = extract_features(m, tok, task)[0], scores(m)
    for k in (1, 3):
        cut = clean(m, f'block{k}', seed=5)
        assert clean(m, f'layer.{k - 1}', seed=5).state_dict().keys() == cut.state_dict().keys()
        X = extract_features(cut, tok, task)[0]
        same = [np.array_equal(X0[:, layer], X[:, layer]) for layer in range(X0.shape[1])]
        assert same == [True] * k + [False] * (X0.shape[1] - k), (k, same)          # probe layer k: the output of block k
        a = scores(cut)
        changed = sorted({layer for (layer, _, _), v in (a - a0).abs().items() if v > 1e-9})
        assert changed and changed[0] == k, (k, changed)                              # attention layer k: block k's attention
