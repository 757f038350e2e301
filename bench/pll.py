"""Masked pseudo-log-likelihood: nl_embryo.scoring against minicons' MaskedLMScorer, and SCRIPT's single pass.

One model (a checkpoint folder that loads with AutoModelForMaskedLM, copied to a temporary folder), N held-out
English sentences (`held_out_sentences`, never in the training blocks of a model trained on `english`):

1. equality: the token scores of `masked_pll` and of minicons' `token_score` (PLL_metric 'original' and
   'within_word_l2r'), largest absolute difference;
2. time: both scorers on the same sentences, alternated (A B A B) in this one process, best of the rounds;
3. memory: each scorer in a child process whose address space may grow by at most --cap-gb over what the process
   maps once the model is loaded (RLIMIT_AS), on the longest inputs the model accepts; the child reports whether it
   finished and its peak RSS;
4. SCRIPT's single forward pass (`script_pll`) against `masked_pll` on the same sentences: time ratio.

    python bench/pll.py [--model runs/demo/checkpoints/step300] [--n 500] [--minicons-batch 4] [--cap-gb 2]

Needs `pip install -c constraints.txt minicons` (a benchmark/test dependency).
"""
import argparse, gc, json, os, resource, shutil, subprocess, sys, tempfile, time
from pathlib import Path

import numpy as np
import torch

MODEL_FILES = ('config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'vocab.txt')


def copy_model(src, dest) -> Path:
    "Copy the model and tokenizer files of a checkpoint folder (weights are safetensors) into `dest`."
    src, dest = Path(src), Path(dest)
    if not (src/'model.safetensors').exists():
        sys.exit(f"{src} has no model.safetensors: pass a checkpoint folder of a BERT-style run (--model)")
    dest.mkdir(parents=True, exist_ok=True)
    for f in MODEL_FILES:
        if (src/f).exists(): shutil.copy2(src/f, dest/f)
    return dest


def load(path):
    from transformers import AutoModelForMaskedLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    return AutoModelForMaskedLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def fitting(sentences, tok, limit):
    return [s for s in sentences if len(tok(s)['input_ids']) <= limit]


def long_inputs(tok, limit, n, seed=0):
    "`n` inputs of nearly `limit` tokens: held-out sentences joined until the next one would not fit."
    from nl_embryo.scoring import held_out_sentences
    pool = held_out_sentences('english', n=None, seed=seed)
    out, cur = [], ''
    for s in pool:
        nxt = (cur + ' ' + s).strip()
        if len(tok(nxt)['input_ids']) > limit:
            if cur: out.append(cur)
            cur = s if len(tok(s)['input_ids']) <= limit else ''
            if len(out) == n: break
        else: cur = nxt
    return out


def ours(model, tok, sentences, metric, max_copies):
    from nl_embryo.scoring import masked_pll
    df = masked_pll(model, tok, sentences, word_l2r=metric == 'within_word_l2r', max_copies=max_copies)
    return [g.score.to_numpy() for _, g in df.groupby('sentence', sort=True)]


def minicons_scorer(model, tokenizer=None):
    "minicons' MaskedLMScorer. minicons 0.3.39 calls `tokenizer.batch_encode_plus`, which transformers 5 removed; it is aliased to `tokenizer.__call__` (what it did for a batch)."
    from minicons import scorer as mc
    sc = mc.MaskedLMScorer(model, 'cpu', tokenizer=tokenizer)
    sc.tokenizer.batch_encode_plus = sc.tokenizer.__call__
    return sc


def minicons_scores(scorer, sentences, metric, batch):
    out = []
    for a in range(0, len(sentences), batch):
        for row in scorer.token_score(sentences[a:a + batch], PLL_metric=metric):
            out.append(np.array([s for _, s in row], dtype=np.float64))
    return out


def child(args):
    "Run one scorer under an address-space cap; print a JSON line."
    os.environ.setdefault('MALLOC_ARENA_MAX', '2')
    model, tok = load(args.model)
    limit = model.config.max_position_embeddings
    sentences = long_inputs(tok, limit, args.n_long)
    if args.child == 'minicons':
        sc = minicons_scorer(model, tok)
        run = lambda: minicons_scores(sc, sentences, 'original', args.minicons_batch)
    else:
        run = lambda: ours(model, tok, sentences, 'original', args.max_copies)
    gc.collect()
    vm = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmSize'))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + int(args.cap_gb * 2**30), resource.RLIM_INFINITY))
    t0 = time.perf_counter(); res = dict(scorer=args.child, inputs=len(sentences), tokens=int(sum(len(tok(s)['input_ids']) for s in sentences)))
    try:
        run(); res.update(ok=True)
    except (MemoryError, RuntimeError) as e:
        res.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
    res.update(seconds=round(time.perf_counter() - t0, 2), peak_rss_gb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30, 2),
               rss_before_gb=round(rss0 / 2**30, 2))
    print(json.dumps(res), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--model', default='runs/demo/checkpoints/step300', help='a checkpoint folder (default: the last checkpoint of nl-embryo demo)')
    ap.add_argument('--n', type=int, default=500)
    ap.add_argument('--minicons-batch', type=int, default=4)
    ap.add_argument('--max-copies', type=int, default=128)
    ap.add_argument('--rounds', type=int, default=2)
    ap.add_argument('--cap-gb', type=float, default=1.0)
    ap.add_argument('--n-long', type=int, default=8)
    ap.add_argument('--child', choices=['ours', 'minicons'])
    ap.add_argument('--skip-memory', action='store_true')
    args = ap.parse_args()
    if args.child: return child(args)
    torch.manual_seed(0)
    from nl_embryo.scoring import held_out_sentences, script_pll, masked_pll
    tmp = Path(tempfile.mkdtemp())
    path = copy_model(args.model, tmp/'model')
    model, tok = load(path)
    limit = model.config.max_position_embeddings
    sentences = fitting(held_out_sentences('english', n=None), tok, limit)[:args.n]
    n_tok = sum(len(tok(s)['input_ids']) - 2 for s in sentences)
    print(f"model {args.model} ({sum(p.numel() for p in model.parameters()):,} parameters), {len(sentences)} held-out sentences, "
          f"{n_tok:,} scored tokens, torch threads {torch.get_num_threads()}")
    sc = minicons_scorer(str(path))
    report = dict(sentences=len(sentences), tokens=n_tok)
    for metric in ('original', 'within_word_l2r'):
        t_ours, t_mc = [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter(); a = ours(model, tok, sentences, metric, args.max_copies); t_ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter(); b = minicons_scores(sc, sentences, metric, args.minicons_batch); t_mc.append(time.perf_counter() - t0)
        assert [len(x) for x in a] == [len(x) for x in b], 'the two scorers score different tokens'
        diff = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
        seq = max(abs(float(x.sum() - y.sum())) for x, y in zip(a, b))
        report[metric] = dict(max_abs_token_diff=diff, max_abs_sentence_diff=seq, ours_s=min(t_ours), minicons_s=min(t_mc),
                              speedup=min(t_mc) / min(t_ours))
        print(f"PLL {metric:16s}: max |token diff| {diff:.2e}, max |sentence diff| {seq:.2e}; nl_embryo {min(t_ours):.2f} s, "
              f"minicons (batch {args.minicons_batch}) {min(t_mc):.2f} s -> {min(t_mc) / min(t_ours):.2f}x")
    t_m, t_s = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter(); masked_pll(model, tok, sentences, max_copies=args.max_copies); t_m.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); script_pll(model, tok, sentences); t_s.append(time.perf_counter() - t0)
    report['script'] = dict(masked_s=min(t_m), single_pass_s=min(t_s), speedup=min(t_m) / min(t_s))
    print(f"SCRIPT single pass {min(t_s):.2f} s vs masked PLL {min(t_m):.2f} s -> {min(t_m) / min(t_s):.1f}x")
    if not args.skip_memory:
        report['memory'] = []
        for who, batch in (('ours', args.minicons_batch), ('minicons', 1), ('minicons', args.minicons_batch)):
            cmd = [sys.executable, __file__, '--child', who, '--model', str(path), '--cap-gb', str(args.cap_gb), '--n-long', str(args.n_long),
                   '--minicons-batch', str(batch), '--max-copies', str(args.max_copies)]
            r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, MALLOC_ARENA_MAX='2'))
            line = [l for l in r.stdout.splitlines() if l.startswith('{')]
            res = json.loads(line[-1]) if line else dict(scorer=who, ok=False, error=f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
            res['setting'] = f"max_copies {args.max_copies}" if who == 'ours' else f"batch {batch}"
            report['memory'].append(res)
            print(f"memory budget +{args.cap_gb} GB, {res.get('inputs')} inputs of ~{limit} tokens ({res.get('tokens')} tokens): {who} ({res['setting']}) "
                  f"{'finished' if res.get('ok') else 'FAILED (' + res.get('error', '') + ')'} in {res.get('seconds')} s, "
                  f"peak RSS {res.get('peak_rss_gb')} GB (model loaded: {res.get('rss_before_gb')} GB)")
    print(json.dumps(report))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == '__main__':
    main()
