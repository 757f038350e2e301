"""Masked pseudo-log-likelihood: nl_embryo.scoring against minicons' MaskedLMScorer, and SCRIPT's single pass.

One model (a checkpoint folder that loads with AutoModelForMaskedLM, copied to a temporary folder; default: the newest
checkpoint of `runs/demo`), the first N held-out English sentences (`held_out_sentences`, never in the training blocks
of a model trained on `english`):

1. equality: the token scores of `masked_pll` and of minicons' `token_score` (PLL_metric 'original' and
   'within_word_l2r') on the sentences that fit the model, largest absolute difference; the sentences longer than the
   model's positions (minicons cannot score them) and a long input of several held-out sentences are scored by
   `masked_pll`'s sliding window: one finite score per token;
2. time (`bench/interleave.py`): each scorer in its own worker process, one step = scoring the same batch (the first
   --time-n fitting sentences); the workers take turns in short segments and only segments where other processes left their cores
   free count. Printed: each scorer's step times (25th percentile, with min / median / max) and the checked ratio
   minicons / ours (goal: at least 3x), or the harness's refusal line; then SCRIPT's `script_pll` against
   `masked_pll` the same way;
3. memory: each scorer in a child process whose address space may grow by at most --cap-gb over what the process
   maps once the model is loaded (RLIMIT_AS), on inputs of nearly the model's positions (and `masked_pll` on inputs
   of --long-x times them, in windows); the child reports whether it finished and its peak RSS.

    python bench/pll.py [--model runs/demo/checkpoints/stepN] [--n 500] [--time-n 32] [--minicons-batch 4] [--rounds 6] [--cap-gb 1]

Needs `pip install -c constraints.txt minicons` (a benchmark/test dependency).
"""
import argparse, gc, json, os, resource, shutil, subprocess, sys, tempfile, time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interleave import serve, interleave, ratio, describe

MODEL_FILES = ('config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'vocab.txt')
DEMO = 'runs/demo'
GOAL = 3.0          # minicons' time over ours


def newest_checkpoint(run=DEMO) -> Path:
    "The highest-step checkpoint of `run` (the demo's by default); exits with what to do when it has none."
    from nl_embryo.checkpoints import list_checkpoints
    found = list_checkpoints(run, warn=False)
    if not found: sys.exit(f"no checkpoint in {run}/checkpoints: run `make demo` (or `nl-embryo demo`) first, or pass --model a checkpoint folder")
    return found[max(found)]


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


def limit_of(model) -> int:
    from nl_embryo.models import max_positions
    return max_positions(model)


def held(tok, limit, n) -> tuple[list, list]:
    "The first `n` held-out English sentences: those that fit the model, and those longer than its positions."
    from nl_embryo.scoring import held_out_sentences
    pool = held_out_sentences('english', n=n)
    fits = [len(tok(s)['input_ids']) <= limit for s in pool]
    return [s for s, f in zip(pool, fits) if f], [s for s, f in zip(pool, fits) if not f]


def long_inputs(tok, limit, n, times=1.0, seed=0):
    "`n` inputs of nearly `times` x `limit` tokens: held-out sentences joined until the next one would not fit."
    from nl_embryo.scoring import held_out_sentences
    pool, size = held_out_sentences('english', n=None, seed=seed), int(times * limit)
    out, cur = [], ''
    for s in pool:
        nxt = (cur + ' ' + s).strip()
        if len(tok(nxt)['input_ids']) > size:
            if cur: out.append(cur)
            cur = s if len(tok(s)['input_ids']) <= size else ''
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


# ---------------------------------------------------------------- workers (timed) and children (memory)
def worker(spec):
    "One timed loop: score the same fitting sentences at every step."
    from nl_embryo.scoring import script_pll
    model, tok = load(spec['model'])
    sentences = held(tok, limit_of(model), spec['n'])[0][:spec['time_n']]
    if spec['loop'] == 'minicons':
        sc = minicons_scorer(model, tok)
        unit = lambda: minicons_scores(sc, sentences, spec['metric'], spec['batch'])
    elif spec['loop'] == 'script': unit = lambda: script_pll(model, tok, sentences)
    else: unit = lambda: ours(model, tok, sentences, spec['metric'], spec['max_copies'])
    serve(unit, warmup=1)


def child(args):
    "Run one scorer under an address-space cap; print a JSON line."
    os.environ.setdefault('MALLOC_ARENA_MAX', '2')
    model, tok = load(args.model)
    limit = limit_of(model)
    sentences = long_inputs(tok, limit, args.n_long, times=args.long_x if args.child == 'ours-long' else 1.0)
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
        scores = run(); res.update(ok=bool(all(np.isfinite(x).all() for x in scores)))
    except (MemoryError, RuntimeError) as e:
        res.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
    res.update(seconds=round(time.perf_counter() - t0, 2), peak_rss_gb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30, 2),
               rss_before_gb=round(rss0 / 2**30, 2))
    print(json.dumps(res), flush=True)


# ---------------------------------------------------------------- parent
def equality(model, tok, sc, sentences, long_ones, args, report):
    from nl_embryo.scoring import masked_pll
    for metric in ('original', 'within_word_l2r'):
        a, b = ours(model, tok, sentences, metric, args.max_copies), minicons_scores(sc, sentences, metric, args.minicons_batch)
        assert [len(x) for x in a] == [len(x) for x in b], 'the two scorers score different tokens'
        diff = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
        seq = max(abs(float(x.sum() - y.sum())) for x, y in zip(a, b))
        report[metric] = dict(max_abs_token_diff=diff, max_abs_sentence_diff=seq)
        print(f"PLL {metric:16s}: max |token diff| {diff:.2e}, max |sentence diff| {seq:.2e} ({len(a)} sentences)"
              + ('' if diff < 1e-4 else '  <- NOT EQUAL'), flush=True)
    longer = long_ones + long_inputs(tok, limit_of(model), 1, times=args.long_x)
    df = masked_pll(model, tok, longer, max_copies=args.max_copies)
    n_tok = [len(tok(s)['input_ids']) - 2 for s in longer]
    ok = df.groupby('sentence').size().tolist() == n_tok and bool(np.isfinite(df.score).all())
    report['windows'] = dict(inputs=len(longer), tokens=n_tok, ok=ok)
    print(f"longer than the model's {limit_of(model)} positions: {len(longer)} inputs of {min(n_tok) + 2}-{max(n_tok) + 2} tokens "
          f"scored in windows: {'one finite score per token' if ok else 'FAILED'}", flush=True)


def timing(path, n_fit, args, report):
    spec = lambda loop, **kw: [sys.executable, __file__, '--worker', json.dumps(dict(loop=loop, model=str(path), n=args.n, time_n=args.time_n, **kw))]
    opts = dict(rounds=args.rounds, segment_s=args.segment_s, min_steps=args.min_steps, threads=args.threads)
    check = lambda t, a, b: ratio(t, a, b, max_disagreement=args.max_disagreement)
    print(f"\ntime: one step = scoring the same {min(n_fit, args.time_n)} sentences; {args.rounds} interleaved rounds of at least {args.min_steps} steps a segment", flush=True)
    t = interleave({'ours': spec('ours', metric='original', max_copies=args.max_copies),
                    'minicons': spec('minicons', metric='original', batch=args.minicons_batch)}, **opts)
    for name in ('ours', 'minicons'): print(f"  {describe(t, name)}")
    r, line = check(t, 'minicons', 'ours')
    print(f"  => minicons / ours: " + (f"{r:.2f}x (goal at least {GOAL:g}x: {'met' if r >= GOAL else 'NOT met'}); {line}" if r else line), flush=True)
    report['time'] = dict(threads=t.threads, why_threads=t.why_threads, interference=t.interference(), ours=t.stats('ours'),
                          minicons=t.stats('minicons'), ratio=r, ratio_line=line, minicons_batch=args.minicons_batch)
    t = interleave({'masked': spec('ours', metric='original', max_copies=args.max_copies), 'script': spec('script')}, **opts)
    for name in ('masked', 'script'): print(f"  {describe(t, name)}")
    r, line = check(t, 'masked', 'script')
    print(f"  => SCRIPT's single pass: masked PLL / script_pll: " + (f"{r:.1f}x; {line}" if r else line), flush=True)
    report['script'] = dict(threads=t.threads, masked=t.stats('masked'), script=t.stats('script'), ratio=r, ratio_line=line)


def memory(path, args, report):
    report['memory'] = []
    for who, batch in (('ours', args.minicons_batch), ('ours-long', args.minicons_batch), ('minicons', 1), ('minicons', args.minicons_batch)):
        cmd = [sys.executable, __file__, '--child', who, '--model', str(path), '--cap-gb', str(args.cap_gb), '--n-long', str(args.n_long),
               '--minicons-batch', str(batch), '--max-copies', str(args.max_copies), '--long-x', str(args.long_x)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, MALLOC_ARENA_MAX='2'))
        line = [l for l in r.stdout.splitlines() if l.startswith('{')]
        res = json.loads(line[-1]) if line else dict(scorer=who, ok=False, error=f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
        res['setting'] = f"max_copies {args.max_copies}" if who.startswith('ours') else f"batch {batch}"
        report['memory'].append(res)
        size = f"~{args.long_x:g}x the model's positions, in windows" if who == 'ours-long' else "~the model's positions"
        print(f"memory budget +{args.cap_gb} GB, {res.get('inputs')} inputs of {size} ({res.get('tokens')} tokens): {who} ({res['setting']}) "
              f"{'finished' if res.get('ok') else 'FAILED (' + res.get('error', 'a score is not finite') + ')'} in {res.get('seconds')} s, "
              f"peak RSS {res.get('peak_rss_gb')} GB (model loaded: {res.get('rss_before_gb')} GB)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--model', help=f'a checkpoint folder (default: the newest checkpoint of {DEMO}, which `make demo` writes)')
    ap.add_argument('--n', type=int, default=500, help='held-out sentences for the equality check')
    ap.add_argument('--time-n', type=int, default=32, help='a timed step scores the first this many of the sentences that fit')
    ap.add_argument('--minicons-batch', type=int, default=4)
    ap.add_argument('--max-copies', type=int, default=128)
    ap.add_argument('--rounds', type=int, default=6); ap.add_argument('--segment-s', type=float, default=1.5)
    ap.add_argument('--min-steps', type=int, default=3, help='steps per segment at least')
    ap.add_argument('--threads', default='auto', help="the workers' threads: a number, or auto (the cores other processes leave free)")
    ap.add_argument('--max-disagreement', type=float, default=1.5, help='refuse a ratio whose per-round ratios differ by more than this factor')
    ap.add_argument('--cap-gb', type=float, default=1.0)
    ap.add_argument('--n-long', type=int, default=8); ap.add_argument('--long-x', type=float, default=4.0)
    ap.add_argument('--skip-time', action='store_true'); ap.add_argument('--skip-memory', action='store_true')
    ap.add_argument('--child', choices=['ours', 'ours-long', 'minicons'], help=argparse.SUPPRESS)
    ap.add_argument('--worker', help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker: return worker(json.loads(args.worker))
    if args.child: return child(args)
    torch.manual_seed(0)
    src = Path(args.model) if args.model else newest_checkpoint()
    tmp = Path(tempfile.mkdtemp())
    try:
        path = copy_model(src, tmp/'model')
        model, tok = load(path)
        sentences, long_ones = held(tok, limit_of(model), args.n)
        n_tok = sum(len(tok(s)['input_ids']) - 2 for s in sentences)
        print(f"model {src} ({sum(p.numel() for p in model.parameters()):,} parameters, {limit_of(model)} positions), {len(sentences)} "
              f"held-out sentences that fit ({n_tok:,} scored tokens; {len(long_ones)} longer ones), torch threads {torch.get_num_threads()}", flush=True)
        report = dict(model=str(src), sentences=len(sentences), tokens=n_tok)
        equality(model, tok, minicons_scorer(str(path)), sentences, long_ones, args, report)
        if not args.skip_time: timing(path, len(sentences), args, report)
        if not args.skip_memory: memory(path, args, report)
        print(json.dumps(report))
    finally: shutil.rmtree(tmp, ignore_errors=True)


if __name__ == '__main__':
    main()
