"""A causal timeline nl_embryo did not write, as GPT-2 and Pythia ship them: a transformers Trainer run of a small
GPT2LMHeadModel whose tokenizer is a byte-level BPE with no mask token, no padding token, and nothing added in front of
a sentence. Surgery measures the next-token loss on the named eval text, and next-word prediction keeps every part of
speech (the function words a sentence starts with included) at every step. The source folder is never changed."""
import hashlib, warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from nl_embryo.core import NlEmbryoError
from nl_embryo.timeline import Run

pytestmark = pytest.mark.usefixtures('one_torch_thread')

SENTENCES = ["The cat sat on the mat and looked at the birds outside.", "She walked to the market to buy fresh bread.",
             "They have been working on the new bridge for two years.", "A small dog barked loudly at the passing car.",
             "We will meet again tomorrow morning at the old station.", "He reads a book every night before he sleeps.",
             "But the children played in the garden until it got dark.", "However, my brother plays the guitar in a band."]
FUNCTION_WORDS = ('determiner', 'preposition', 'conjunction', 'adverb')


def tree_digest(root) -> dict:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(root).rglob('*')) if p.is_file()}


def gpt2_style_tokenizer():
    "A byte-level BPE like GPT-2's: `<|endoftext|>` its only special token (BOS and EOS), no mask, no pad, nothing added."
    from tokenizers import ByteLevelBPETokenizer, Tokenizer
    from transformers import PreTrainedTokenizerFast
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES * 4, vocab_size=320, special_tokens=['<|endoftext|>'], show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(bpe.to_str()), bos_token='<|endoftext|>', eos_token='<|endoftext|>')


@pytest.fixture(scope='module')
def gpt2_trainer_out(tmp_path_factory):
    "A Trainer run of a small GPT2LMHeadModel, 6 steps (checkpoints 2, 4, 6), its tokenizer saved with each checkpoint."
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator
    from nl_embryo.models import quiet_transformers
    tok = gpt2_style_tokenizer()
    assert tok.mask_token_id is None and tok.pad_token_id is None and tok('The cat')['input_ids'][0] != tok.bos_token_id
    eos = tok.eos_token_id
    rows = []
    for s in SENTENCES * 3:                     # fixed-length blocks: no padding token needed
        ids = (tok(s)['input_ids'] + [eos] * 24)[:24]
        rows.append(dict(input_ids=ids, labels=ids))
    out = tmp_path_factory.mktemp('hf-gpt2')/'trainer-run'
    torch.manual_seed(0)
    with quiet_transformers():
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=512,
                                           bos_token_id=eos, eos_token_id=eos, architectures=['GPT2LMHeadModel']))
    args = TrainingArguments(output_dir=str(out), max_steps=6, save_steps=2, logging_steps=1, per_device_train_batch_size=4,
                             report_to=[], use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0, learning_rate=3e-3)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        Trainer(model=model, args=args, train_dataset=rows, processing_class=tok, data_collator=default_data_collator).train()
    return out


def test_surgery_measures_the_next_token_loss_with_a_tokenizer_that_has_no_mask(tmp_path, gpt2_trainer_out):
    from nl_embryo.analysis import analyze
    before = tree_digest(gpt2_trainer_out)
    notes = tmp_path/'eval.txt'
    notes.write_text('\n'.join(s.replace('the', 'a') for s in SENTENCES * 12) + '\n')
    run = Run(gpt2_trainer_out, out=tmp_path/'A', eval_text=notes)
    assert run.is_causal() and run.steps() == [2, 4, 6] and run.tokenizer().mask_token_id is None
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        df = analyze(run, 'surgery', surgeries='identity,reverse', eval_batches=2, batch_size=4, probe=False, progress=False, charts=False)
    loss = df[(df.metric == 'clm_loss') & (df.surgery == 'identity')].set_index('step')['value']
    assert sorted(loss.index) == [2, 4, 6] and loss.between(1, 2 * np.log(len(run.tokenizer()))).all()   # about log(vocabulary) or below
    rev = df[(df.metric == 'clm_loss_increase') & (df.surgery == 'reverse')]
    assert len(rev) == 3 and rev['value'].notna().all()
    assert 'mlm_loss' not in set(df.metric)
    assert tree_digest(gpt2_trainer_out) == before


def test_next_word_prediction_keeps_every_function_word_class_at_every_step(tmp_path, gpt2_trainer_out):
    from nl_embryo.analysis import analyze
    from nl_embryo.reconstruction import reconstruction_data
    per_group = 60
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        df = analyze(Run(gpt2_trainer_out, out=tmp_path/'A'), 'reconstruction', per_group=per_group, progress=False, charts=False)
    pos = df[(df.grouping == 'pos') & (df.metric == 'accuracy')]
    assert set(pos['prediction']) == {'next-word'} and sorted(set(pos['step'])) == [2, 4, 6]
    for c in FUNCTION_WORDS:
        g = pos[pos.group == c]
        assert len(g) == 3 and g['value'].notna().all() and (g['n'] >= per_group).all(), (c, g[['step', 'value', 'n']])
    # the same words without the context token in front would lose the sentence-initial ones: the quota needs them
    words = reconstruction_data(per_group=per_group)['words']
    first = words[words.target].groupby('sent').head(1)
    first = first[first['wid'] == 0] if 'wid' in first else first
    assert first['pos_class'].isin(FUNCTION_WORDS).sum() > 0


def test_a_masked_model_whose_tokenizer_has_no_mask_is_refused_by_name(tmp_path, gpt2_trainer_out):
    from nl_embryo.surgery import surgery_data
    from transformers import BertConfig, BertForMaskedLM
    from nl_embryo.models import quiet_transformers
    tok = gpt2_style_tokenizer()
    folder = tmp_path/'suite'/'step10'
    with quiet_transformers():
        BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                   architectures=['BertForMaskedLM'])).save_pretrained(folder)
    tok.save_pretrained(folder)
    notes = tmp_path/'eval.txt'
    notes.write_text('\n'.join(SENTENCES * 12) + '\n')
    with pytest.raises(NlEmbryoError, match="has no mask token, and this masked LM's held-out loss masks tokens with it"):
        surgery_data(Run(tmp_path/'suite', out=tmp_path/'B', eval_text=notes), probe=False)


def test_a_tokenizer_with_nothing_to_start_a_sentence_with_draws_no_first_word(tmp_path, gpt2_trainer_out):
    "No BOS, no EOS, nothing added in front: the first word cannot be predicted, so none is drawn and the quota holds."
    import shutil
    from transformers import PreTrainedTokenizerFast
    from nl_embryo.reconstruction import context_token, reconstruction_inputs
    suite = tmp_path/'suite'
    shutil.copytree(gpt2_trainer_out/'checkpoint-6', suite/'step6', ignore=shutil.ignore_patterns('tokenizer*', 'special_tokens_map.json'))
    bare = PreTrainedTokenizerFast(tokenizer_object=gpt2_style_tokenizer().backend_tokenizer)
    bare.save_pretrained(suite/'step6')
    run = Run(suite, out=tmp_path/'A')
    assert context_token(run.tokenizer()) is None and run.is_causal()
    (data,) = reconstruction_inputs(run, per_group=40)
    w = data['words']
    assert not w.groupby('sent').head(1).target.any() and all(n >= 40 for k, n in data['quota'].items() if k.startswith('pos:'))
