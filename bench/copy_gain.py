"""In-context copying: how much better a causal checkpoint predicts a held-out English sentence the second time it reads it.

For `--n` sentences of the English eval split (8 to 30 pieces each, the `english` tokenizer), every checkpoint of a
causal run reads `[CLS] s [SEP] s [SEP]`; the script compares the next-token loss over the second copy's pieces (all
but its first) with the loss over the same pieces in the first copy. The *gain* (first minus second, nats per piece)
is near 0 for a model that does not use the earlier copy, and large for one that copies from context, as an induction
head does. Printed per checkpoint: both losses and the gain, each with a 95% bootstrap interval over the sentences.
It measures on natural text what `induction_scores` measures on repeated random tokens, as loss rather than attention.

    python bench/copy_gain.py RUN [--n 256] [--save gain.csv]
"""
import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch


def sentence_pairs(tok, n: int, seed: int = 0, lo: int = 8, hi: int = 30):
    "Up to `n` eval sentences of 'english' of lo..hi pieces, in a seeded order: each sentence's piece ids (no special tokens)."
    from nl_embryo.corpora import CORPORA
    texts = CORPORA['english'].source(0, 0, tok, 'eval')        # the eval split only: no checkpoint trained on these
    order = np.random.default_rng(seed).permutation(len(texts))
    out = []
    for i in order:
        ids = tok(texts[i], add_special_tokens=False)['input_ids']
        if lo <= len(ids) <= hi: out.append(ids)
        if len(out) == n: break
    return out


def copy_losses(model, sents, cls_id, sep_id, device='cpu'):
    "Per sentence: the mean next-token loss over the first copy's pieces 2.. and over the second copy's same pieces."
    first, second = [], []
    with torch.no_grad():
        for s in sents:
            ids = torch.tensor([[cls_id, *s, sep_id, *s, sep_id]], device=device)
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            nll = -logp.gather(1, ids[0, 1:, None])[:, 0].cpu().numpy()      # nll[j]: loss of predicting ids[j + 1]
            L = len(s)
            first.append(nll[1:L].mean())                    # pieces 2..L of copy 1 (targets at ids positions 2..L)
            second.append(nll[L + 2:2 * L + 1].mean())       # pieces 2..L of copy 2 (positions L + 3..2L + 1)
    return np.array(first), np.array(second)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('run', help='a causal run folder (its checkpoints/stepN)')
    ap.add_argument('--n', type=int, default=256, help='held-out sentences')
    ap.add_argument('--save', help='write the per-checkpoint table to this CSV file')
    a = ap.parse_args()
    from nl_embryo.checkpoints import list_checkpoints, load_trained_model
    from nl_embryo.corpora import get_tokenizer
    from nl_embryo.models import is_causal
    from nl_embryo.stats import cluster_bootstrap
    if not Path(a.run).is_dir(): raise SystemExit(f"copy_gain: {a.run} is not a folder: pass a causal run folder")
    steps = list_checkpoints(a.run, warn=False)
    if not steps: raise SystemExit(f"copy_gain: {a.run} holds no checkpoints (checkpoints/stepN): pass the folder a causal pre-training run wrote")
    tok = get_tokenizer('english')
    sents = sentence_pairs(tok, a.n)
    rows = []
    for step, path in steps.items():
        model = load_trained_model(path).eval()
        if not is_causal(model):
            raise SystemExit(f"copy_gain: {path} is not a causal LM (its logits at a position are not a next-token guess): pass a run of gpt-neox, gpt2 or llama")
        if model.config.vocab_size != len(tok):
            raise SystemExit(f"copy_gain: the run's vocabulary ({model.config.vocab_size}) is not the english tokenizer's ({len(tok)}): pass a run on an English corpus")
        f, s = copy_losses(model, sents, tok.cls_token_id, tok.sep_token_id)
        row = dict(step=step, n=len(sents))
        for name, v in [('first', f), ('second', s), ('gain', f - s)]:
            row[name], row[f'{name}_lo'], row[f'{name}_hi'] = cluster_bootstrap(v)
        rows.append(row)
        print(f"step {step}: first copy {row['first']:.3f}, second {row['second']:.3f}, gain {row['gain']:.3f} [{row['gain_lo']:.3f}, {row['gain_hi']:.3f}] nats/piece", flush=True)
    if a.save: pd.DataFrame(rows).to_csv(a.save, index=False)


if __name__ == '__main__':
    main()
