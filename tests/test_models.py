"""Model builders: every architecture builds, runs, round-trips through save/load; shared embeddings; sizes; FLOPs; errors;
safetensors only: pickled weights are refused without unpickling, a trusted state dict is converted (on a checkpoint of
the shared `reference` run of conftest.py)."""
import copy, dataclasses, shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, ElectraForTokenClassification, AlbertForTokenClassification

from nl_embryo.core import NlEmbryoError
from nl_embryo.models import (ARCHS, CAUSAL_ARCHS, PAIR_ARCHS, PRESETS, SizePreset, ElectraPair, build_config, build_model, load_model,
                              count_parameters, set_attention, attention_implementation, flops_per_token, training_flops,
                              kaplan_training_flops, measure_training_flops, check_tokenizer_matches, checkpoint_sizes,
                              parameter_table, stored_numel, steps_for_equal_flops, quiet_transformers, is_pair, mlm_head)

V = 8000
# a 2-layer tiny keeps the suite fast; the notebook exercises the real `tiny`
MINI = dataclasses.replace(PRESETS['tiny'], name='mini', layers=2, max_position=64)


def batch(seed=0, n=2, T=24):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (n, T), generator=g)
    labels = torch.where(torch.rand(n, T, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    labels[0, 0] = ids[0, 0]
    return ids, labels


@pytest.fixture(scope='module')
def models():
    torch.manual_seed(0)
    return {arch: build_model(arch, MINI, vocab_size=V).eval() for arch in ARCHS}


@pytest.mark.parametrize('arch', ARCHS)
def test_forward_with_labels(models, arch):
    m, (ids, labels) = models[arch], batch()
    gen = m.generator if is_pair(m) else m
    out = gen(input_ids=ids, labels=labels)
    assert torch.isfinite(out.loss) and out.logits.shape == (2, 24, V)
    if is_pair(m):
        assert m.discriminator(input_ids=ids).logits.reshape(2, 24).shape == (2, 24)
    cfgs = [m.generator.config, m.discriminator.config] if is_pair(m) else [m.config]
    for c in cfgs:
        assert (c.pad_token_id, c.cls_token_id, c.sep_token_id, c.mask_token_id, c.tie_word_embeddings) == (0, 2, 3, 4, arch != 'gpt-neox')   # GPT-NeoX (Pythia) unties its output layer
        assert c.nl_embryo_arch == arch


@pytest.mark.parametrize('arch', ARCHS)
def test_save_load_round_trip(models, arch, tmp_path):
    m, (ids, _) = models[arch], batch(1)
    m.save_pretrained(tmp_path) if is_pair(m) else _quiet_save(m, tmp_path)
    if is_pair(m):
        assert (tmp_path/'generator'/'model.safetensors').exists() and (tmp_path/'discriminator'/'model.safetensors').exists()
        back = ElectraPair.from_pretrained(tmp_path).eval()
        assert back.embeddings_shared()
        g, d = back.generator.base_model.embeddings, back.discriminator.base_model.embeddings
        assert g.word_embeddings.weight.data_ptr() == d.word_embeddings.weight.data_ptr()
        assert back.generator.get_output_embeddings().weight.data_ptr() == d.word_embeddings.weight.data_ptr()
        for a, b in [(m.generator, back.generator), (m.discriminator, back.discriminator)]:
            assert torch.equal(a(input_ids=ids).logits, b(input_ids=ids).logits)
        cls = ElectraForTokenClassification if arch == 'electra' else AlbertForTokenClassification
        with quiet_transformers():
            alone = cls.from_pretrained(tmp_path/'discriminator').eval()
        assert torch.equal(alone(input_ids=ids).logits, m.discriminator(input_ids=ids).logits)
    else:
        with quiet_transformers():
            back = (AutoModelForCausalLM if arch in CAUSAL_ARCHS else AutoModelForMaskedLM).from_pretrained(tmp_path).eval()
        assert type(back) is type(m)
        assert torch.equal(back(input_ids=ids).logits, m(input_ids=ids).logits)
        assert back.config.nl_embryo_objective == ('script' if arch == 'script' else 'clm' if arch in CAUSAL_ARCHS else 'mlm')
    assert type(load_model(tmp_path)) is type(m)
    on_disk = sum(p.stat().st_size for p in tmp_path.rglob('*.safetensors'))
    assert 0 <= on_disk - 4 * stored_numel(m) < 50_000


def _quiet_save(m, path):
    with quiet_transformers():
        m.save_pretrained(path)


@pytest.mark.parametrize('arch', PAIR_ARCHS)
def test_shared_embeddings_move_together(arch):
    m = build_model(arch, MINI, vocab_size=V)
    g, d = m.generator.base_model.embeddings, m.discriminator.base_model.embeddings
    for name in ElectraPair.SHARED:
        assert getattr(g, name) is getattr(d, name)
    with torch.no_grad():
        d.word_embeddings.weight[7, 0] += 1.0
    assert m.generator.get_output_embeddings().weight[7, 0] == d.word_embeddings.weight[7, 0]
    assert count_parameters(m) < count_parameters(m.generator) + count_parameters(m.discriminator)
    assert copy.deepcopy(m).embeddings_shared()   # interventions copy models: sharing survives
    # the generator is the discriminator scaled by 1/4 (Shao 2020 Table V)
    gc, dc = m.generator.config, m.discriminator.config
    assert (gc.hidden_size, gc.num_attention_heads, gc.intermediate_size) == (64, 1, 256)
    assert (dc.hidden_size, gc.num_hidden_layers, gc.embedding_size) == (256, dc.num_hidden_layers, dc.embedding_size)


def test_set_attention(models):
    ids, _ = batch()
    for arch in ['bert', 'electra']:
        m = set_attention(models[arch], 'eager')
        assert attention_implementation(m) == 'eager'
        net = m.discriminator if is_pair(m) else m
        assert len(net(input_ids=ids, output_attentions=True).attentions) == MINI.layers
        set_attention(m, 'sdpa')
        assert attention_implementation(m) == 'sdpa'
    with pytest.raises(NlEmbryoError, match='eager'):
        set_attention(models['bert'], 'flash')


def test_parameter_counts():
    small = build_model('electra', 'small', vocab_size=30522, device='meta')
    assert abs(count_parameters(small.discriminator) - 13.5e6) < 0.1e6          # ELECTRA-small: 13.55M
    assert abs(count_parameters(build_model('bert', 'small', vocab_size=30522, device='meta')) - 13.5e6) < 0.1e6
    assert abs(count_parameters(build_model('ale', 'small', vocab_size=30522, device='meta').discriminator) - 4.8e6) < 0.1e6
    assert abs(count_parameters(build_model('bert', 'base', vocab_size=30522, device='meta')) - 110e6) < 1e6
    assert count_parameters(build_model('albert', 'tiny', device='meta')) == count_parameters(build_model('albert', 'small', device='meta'))
    t = parameter_table(presets=('small',), archs=('bert', 'electra'), vocab_sizes=(30522,))
    assert list(t.arch) == ['bert', 'electra'] and t.discriminator.iloc[1] == count_parameters(small.discriminator)


def test_checkpoint_sizes():
    df = checkpoint_sizes(presets=('tiny', 'base'), archs=('bert', 'electra'), vocab_sizes=(8000,))
    assert (df.fp32_bytes == 2 * df.bf16_bytes).all()
    base = df.set_index(['preset', 'arch']).loc[('base', 'bert')]
    assert 350e6 < base.fp32_bytes < 380e6


def test_roberta_positions():
    r = build_model('roberta', MINI, vocab_size=V, max_position=32).eval()
    assert r.config.max_position_embeddings == 33 and r.config.nl_embryo_max_position == 32
    assert r(input_ids=torch.randint(5, V, (1, 32))).logits.shape == (1, 32, V)
    with pytest.raises((IndexError, RuntimeError)):
        r(input_ids=torch.randint(5, V, (1, 33)))


def test_flops_follow_6nd(models):
    for arch in ['bert', 'roberta']:
        ours = training_flops(models[arch], 1e9, 128, mlm_head_on_masked_only=False)
        assert abs(ours / kaplan_training_flops(models[arch], 1e9, 128) - 1) < 0.05
    # computing the MLM head only at the masked 15% saves a visible share of a small model's compute
    assert training_flops(models['bert'], 1e9, 128) < 0.8 * training_flops(models['bert'], 1e9, 128, mlm_head_on_masked_only=False)


@pytest.mark.parametrize('arch', ARCHS)
def test_flops_match_flop_counter(models, arch):
    m = models[arch]
    measured = measure_training_flops(m, seq_len=64, batch_size=1)
    counted = 3 * flops_per_token(m, seq_len=64, mlm_head_on_masked_only=False)['total']
    assert abs(counted / measured - 1) < 0.05
    assert attention_implementation(m) == 'sdpa' and not m.training


def test_flops_parts_and_equal_steps():
    bert, electra, script = (build_config(a, 'small', vocab_size=30522) for a in ['bert', 'electra', 'script'])
    f = flops_per_token(electra)
    assert {'generator.mlm_head', 'discriminator.rtd_head', 'total'} <= set(f)
    assert f['total'] > flops_per_token(bert)['total']
    assert flops_per_token(script)['total'] > 2 * flops_per_token(bert)['total']
    assert 140_000 < steps_for_equal_flops(electra, bert, 163_000) < 163_000


def test_errors():
    with pytest.raises(NlEmbryoError, match='bert, roberta'):
        build_model('gpt3')
    with pytest.raises(NlEmbryoError, match='tiny, tiny2, small, base'):
        build_model('bert', 'giant')
    with pytest.raises(NlEmbryoError):
        build_model('bert', vocab_size=4)
    with pytest.raises(NlEmbryoError, match='divisible'):
        SizePreset('odd', hidden=100, layers=1, heads=3, intermediate=10)
    with pytest.raises(NlEmbryoError, match='generator'):
        build_model('electra', 'base', generator_fraction=0.3, device='meta')
    with pytest.raises(NlEmbryoError):
        ElectraPair.from_pretrained('/nonexistent')


def test_tokenizer_mismatch(models):
    from nl_embryo.corpora import char_tokenizer
    tok = char_tokenizer('ACDEFGHIKLMNPQRSTVWY')
    check_tokenizer_matches(build_model('bert', MINI, vocab_size=len(tok)), tok)
    with pytest.raises(NlEmbryoError, match=f'vocab_size=8000.*{len(tok)} tokens') as e:
        check_tokenizer_matches(models['bert'], tok)
    assert f'vocab_size={len(tok)}' in str(e.value)
    with pytest.raises(NlEmbryoError, match='generator'):
        check_tokenizer_matches(models['ale'], tok)
    m = build_model('bert', MINI, vocab_size=len(tok), mask_token_id=7)
    with pytest.raises(NlEmbryoError, match='mask_token_id=7.*mask_token_id=4'):
        check_tokenizer_matches(m, tok)


@pytest.mark.parametrize('arch', ['bert', 'roberta', 'albert', 'electra', 'ale'])
def test_mlm_head_alone_matches_forward(models, arch):
    m = models[arch].generator if arch in PAIR_ARCHS else models[arch]
    ids, _ = batch(2)
    with torch.no_grad():
        h = m.base_model(input_ids=ids).last_hidden_state
        assert torch.allclose(mlm_head(m)(h), m(input_ids=ids).logits, atol=1e-5)


# --- safetensors only --------------------------------------------------------------------------------------------

class _WritesAFile:
    "Unpickling this writes a file."
    def __init__(self, path): self.path = str(path)
    def __reduce__(self): return (exec, (f"open({self.path!r}, 'w').write('pwned')",))


def test_pickled_weights_are_refused_without_unpickling(tmp_path, reference):
    from nl_embryo.models import load_model, convert_to_safetensors
    from nl_embryo.timeline import Run
    folder = tmp_path/'model'; shutil.copytree(reference/'checkpoints'/'step4', folder)
    (folder/'model.safetensors').unlink()
    marker = tmp_path/'pwned'
    torch.save({'w': _WritesAFile(marker)}, folder/'pytorch_model.bin')
    with pytest.raises(NlEmbryoError, match='no safetensors weights') as e: load_model(folder)
    assert 'convert_to_safetensors' in e.value.fix
    with pytest.raises(NlEmbryoError, match='no safetensors weights'): Run(folder).load()
    with pytest.raises(NlEmbryoError, match=r'the pickle names \S*exec'): convert_to_safetensors(folder)
    assert not marker.exists() and not (folder/'model.safetensors').exists()


def test_a_trusted_state_dict_converts_and_loads(tmp_path, reference):
    from nl_embryo.models import load_model, convert_to_safetensors
    folder = tmp_path/'model'; shutil.copytree(reference/'checkpoints'/'step4', folder)
    sd = load_file(str(folder/'model.safetensors')); (folder/'model.safetensors').unlink()
    torch.save(sd, folder/'pytorch_model.bin')
    convert_to_safetensors(folder)
    m = load_model(folder)
    for k, v in sd.items(): assert torch.equal(m.state_dict()[k], v), k
