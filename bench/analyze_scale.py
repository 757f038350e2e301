"""`nl-embryo analyze --probes pos --attention` over a 40-checkpoint timeline, against a plain transformers + scikit-learn loop.

One timeline (BERT `mini` trained 39 steps on nested-zipf, a checkpoint at every step, written once into --work) is
analysed by two whole processes, in turn, `--repeats` times each (A B A B ...), from an empty analysis folder each time:

- **nl_embryo**: `nl-embryo analyze RUN --probes pos --attention --quiet` (one pass: each checkpoint loaded once for
  both analyses; probes with control tasks, selectivity and intervals; attention scores and maps of every head; tables,
  charts and the per-checkpoint cache written);
- **plain loop**, written the obvious way: per checkpoint `AutoModelForMaskedLM.from_pretrained` and
  `AutoTokenizer.from_pretrained`, the same POS sentences (exported once from nl_embryo's task, not timed) through the
  model with `output_hidden_states`, a first-piece word vector per layer, `LogisticRegression` per layer fitted on the
  train split and scored on the test split; then the same sentences with `output_attentions` (eager) and each head's
  mean attention entropy. It imports nothing of nl_embryo.

Printed per process: seconds per checkpoint (its whole wall time over the checkpoints, start and data included) and
between consecutive checkpoints (nl_embryo: when its per-checkpoint cache files were written; plain: when each
checkpoint was done), with min, median and max, and its peak resident memory (ru_maxrss); then the ratios
nl_embryo / plain, whole process and checkpoint by checkpoint.

    python bench/analyze_scale.py [--work DIR] [--checkpoints 40] [--repeats 1]
"""
import argparse, json, os, resource, shutil, statistics, subprocess, sys, tempfile, time
from pathlib import Path

PLAIN = r'''
import json, sys, numpy as np, torch
from pathlib import Path
from sklearn.linear_model import LogisticRegression
from transformers import AutoModelForMaskedLM, AutoTokenizer
torch.set_num_threads(int(sys.argv[3]))
task = json.loads(Path(sys.argv[2]).read_text())
folders = sorted(Path(sys.argv[1]).glob('checkpoints/step*'), key=lambda p: int(p.name[4:]))
out = []
import time
t0 = time.perf_counter()
for folder in folders:
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForMaskedLM.from_pretrained(folder, attn_implementation='eager').eval()
    cap = min(128, model.config.max_position_embeddings - 2)   # RoBERTa-style positions start after the padding index
    feats = {}
    for split in ('train', 'test'):
        X, y = [], []
        for words, labels in zip(task[split]['words'], task[split]['labels']):
            enc = tok(words, is_split_into_words=True, return_tensors='pt', truncation=True, max_length=cap)
            with torch.no_grad(): hs = model(**enc, output_hidden_states=True).hidden_states
            first = {}
            for i, w in enumerate(enc.word_ids()):
                if w is not None and w not in first: first[w] = i
            idx = [first[w] for w in range(len(words)) if w in first]
            X.append(torch.stack([h[0, idx] for h in hs], 1).numpy()); y += [labels[w] for w in range(len(words)) if w in first]
        feats[split] = (np.concatenate(X), np.array(y))
    (Xtr, ytr), (Xte, yte) = feats['train'], feats['test']
    acc = [LogisticRegression().fit(Xtr[:, l], ytr).score(Xte[:, l], yte) for l in range(Xtr.shape[1])]
    ent = []
    for words in task['attention']:
        enc = tok(' '.join(words), return_tensors='pt', truncation=True, max_length=cap)
        with torch.no_grad(): att = model(**enc, output_attentions=True).attentions
        ent.append(torch.stack([-(a * (a + 1e-12).log()).sum(-1).mean(-1)[0] for a in att]).numpy())
    out.append(dict(step=int(folder.name[4:]), acc=acc, entropy=np.mean(ent, 0).tolist(), done=time.perf_counter() - t0))
    del model, tok
print(json.dumps(dict(n=len(out), last_acc=out[-1]['acc'], done=[o['done'] for o in out])))
'''

TRAIN = r'''
import sys
from nl_embryo.pretrain import PretrainConfig, pretrain
n = int(sys.argv[2])
pretrain(PretrainConfig(out=sys.argv[1], preset='mini', corpus='nested-zipf', corpus_tokens=60_000, block_size=32, batch_size=16,
                        steps=n - 1, checkpoints=','.join(map(str, range(n))), eval_batches=1), quiet=True)
'''

EXPORT = r'''
import json, sys
from nl_embryo.probes import probes_data
from nl_embryo.attention import attention_data
from nl_embryo.timeline import Run
run = Run(sys.argv[1])
t = probes_data(run, ('pos',))[0]
words, targets = t['words'], t['targets']
out = {}
for split in ('train', 'test'):
    rows = targets[targets['split'] == split]
    ws, ls = [], []
    for sent, g in rows.groupby('sent'):
        w = words[words['sent'] == sent]['word'].tolist()
        lab = dict(zip(g['span1_start'], g['label']))
        if len(lab) == len(w): ws.append(w); ls.append([lab[i] for i in range(len(w))])
    out[split] = dict(words=ws, labels=ls)
sents = attention_data(run)[0]
out['attention'] = [s.split() for s in (sents if isinstance(sents, list) else list(sents))][:200]
open(sys.argv[2], 'w').write(json.dumps(out))
print(len(out['train']['words']), len(out['test']['words']), len(out['attention']))
'''


def per_checkpoint(run: Path) -> list:
    "nl_embryo's seconds per checkpoint in one pass: the gaps between the times the per-checkpoint cache files were written."
    done = {}
    for f in (run/'analysis'/'cache').rglob('step*-*.parquet'):
        step = int(f.name[4:].split('-')[0]); done[step] = max(done.get(step, 0), f.stat().st_mtime)
    t = [done[s] for s in sorted(done)]
    return [b - a for a, b in zip(t, t[1:])]


def spread(x: list) -> str:
    return f"min {min(x):.2f} median {statistics.median(x):.2f} max {max(x):.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--work', default=None, help='where the timeline is written (kept, reused when there); default a temporary folder')
    ap.add_argument('--checkpoints', type=int, default=40)
    ap.add_argument('--repeats', type=int, default=1, help='runs of each, in turn (the spread is also over the checkpoints of one run)')
    ap.add_argument('--threads', type=int, default=2)
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp()); work.mkdir(parents=True, exist_ok=True)
    run = work/'run'
    py = sys.executable
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), TOKENIZERS_PARALLELISM='false')
    if not (run/'config.json').exists():
        subprocess.run([py, '-c', TRAIN, str(run), str(a.checkpoints)], check=True, env=env)
    task = work/'pos_task.json'
    if not task.exists(): print('exported sentences (train, test, attention):', subprocess.run([py, '-c', EXPORT, str(run), str(task)], check=True, capture_output=True, text=True, env=env).stdout.strip())
    cli = str(Path(py).parent/'nl-embryo')
    times, peaks, gaps = ({'nl_embryo': [], 'plain': []} for _ in range(3))
    for r in range(a.repeats):
        for name in ('nl_embryo', 'plain'):          # in turn, from an empty analysis folder each time
            shutil.rmtree(run/'analysis', ignore_errors=True)
            cmd = [cli, 'analyze', str(run), '--probes', 'pos', '--attention', '--quiet'] if name == 'nl_embryo' else [py, '-c', PLAIN, str(run), str(task), str(a.threads)]
            # each run in its own wrapper process, so RUSAGE_CHILDREN there is that run's peak alone
            m = subprocess.run([py, '-c', 'import resource, subprocess, sys, json, time; t = time.perf_counter(); p = subprocess.run(sys.argv[1:]); '
                                'print(json.dumps(dict(rc=p.returncode, wall=time.perf_counter() - t, peak=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)))', *cmd],
                               capture_output=True, text=True, env=env)
            lines = [l for l in m.stdout.strip().splitlines() if l.startswith('{')]
            res = json.loads(lines[-1])
            if res['rc']: sys.exit(f"analyze_scale: {name} failed:\n{m.stderr[-2000:]}")
            done = json.loads(lines[-2])['done'] if name == 'plain' else None
            g = per_checkpoint(run) if name == 'nl_embryo' else [b - a for a, b in zip(done, done[1:])]
            times[name].append(res['wall'] / a.checkpoints); peaks[name].append(res['peak'] / 1024); gaps[name] += g
            print(f"repeat {r + 1} {name:>9}: {res['wall'] / a.checkpoints:6.2f} s/checkpoint over the whole process ({res['wall']:.0f} s), "
                  f"between checkpoints {spread(g)} s, peak RSS {res['peak'] / 1024:6.0f} MB", flush=True)
    for name in times:
        print(f"{name:>9}: s/checkpoint (whole process) {spread(times[name])}; between checkpoints {spread(gaps[name])}; peak RSS {spread(peaks[name])} MB")
    pair = [x / y for x, y in zip(gaps['nl_embryo'], gaps['plain'])]
    print(f"ratio nl_embryo / plain, time per checkpoint: whole process {spread([x / y for x, y in zip(times['nl_embryo'], times['plain'])])}; "
          f"checkpoint by checkpoint {spread(pair)} ({len(pair)} checkpoints, {a.repeats} repeat(s) in turn, {a.checkpoints} checkpoints, {a.threads} threads)")
    print(f"peak RSS ratio nl_embryo / plain: {spread([x / y for x, y in zip(peaks['nl_embryo'], peaks['plain'])])}")

if __name__ == '__main__':
    main()
