"""Attention averaging: throughput and memory of `attention_tables` (pattern scores + average maps of every head).

For each preset (BERT `tiny`: 4 layers x 4 heads, `small`: 12 layers x 4 heads; random weights, the `english`
tokenizer) and each number of Brown sentences N, a fresh process warms the model up on one batch, then averages the
attention of all heads over N sentences (6-20 words, batches of 64, maps up to 32 tokens) and reports:

- tokens/s (real tokens through the eager forward pass and the streamed reduction), per wall and per CPU second,
- peak RSS of the process and its growth during the analysis (sampled every 5 ms; measured in a second process
  whose freed tensors go back to the system, see below),
- the size of the running sums (`AttentionStats.nbytes`), and what keeping every sentence's maps would take instead.

Memory is O(layers x heads x T^2): the growth must not depend on N.

    python bench/attention.py [--presets tiny,small] [--n 250,1000] [--batch-size 64] [--map-len 32] [--max-tokens 40]
"""
import argparse, json, os, subprocess, sys, threading, time


def one(preset: str, n: int, batch_size: int, map_len: int, max_tokens: int) -> dict:
    "Measure one (preset, N) in this process."
    import psutil, torch
    from nl_embryo.attention import AttentionStats, attention_batches, default_sentences, token_classes
    from nl_embryo.corpora import get_tokenizer
    from nl_embryo.models import build_model
    tok = get_tokenizer('english')
    torch.manual_seed(0)
    model = build_model('bert', preset, vocab_size=len(tok)).eval()
    cfg = model.config
    sents = default_sentences(n=n + batch_size)
    warm, sents = sents[:batch_size], sents[batch_size:]
    classes = token_classes(tok)
    st = AttentionStats(cfg.num_hidden_layers, cfg.num_attention_heads, map_len)
    for b in attention_batches(model, tok, warm, batch_size, max_tokens): st.update(*b, classes)   # allocations of one batch

    proc = psutil.Process()
    before = proc.memory_info().rss
    peak = [before]; done = threading.Event()
    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss); time.sleep(0.005)
    th = threading.Thread(target=sample, daemon=True); th.start()
    st = AttentionStats(cfg.num_hidden_layers, cfg.num_attention_heads, map_len, examples=range(4))
    t0 = time.perf_counter(); c0 = time.process_time()
    longest = 0
    for b in attention_batches(model, tok, sents, batch_size, max_tokens):
        longest = max(longest, b[1].shape[1]); st.update(*b, classes)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    done.set(); th.join()
    keep_all = sum(min(len(x), max_tokens) ** 2 for x in tok(sents)['input_ids']) * cfg.num_hidden_layers * cfg.num_attention_heads * 4
    return dict(preset=preset, layers=cfg.num_hidden_layers, heads=cfg.num_attention_heads, n=n, tokens=st.n_tokens,
                wall_s=round(wall, 2), cpu_s=round(cpu, 2), tokens_per_s=round(st.n_tokens / wall),
                tokens_per_cpu_s=round(st.n_tokens / cpu), longest=longest,
                rss_before_mb=round(before / 2**20, 1), rss_peak_mb=round(peak[0] / 2**20, 1),
                rss_growth_mb=round((peak[0] - before) / 2**20, 1), stats_kb=round(st.nbytes / 1e3, 1),
                keep_all_maps_mb=round(keep_all / 2**20, 1), threads=torch.get_num_threads())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--presets', default='tiny,small'); ap.add_argument('--n', default='250,1000')
    ap.add_argument('--batch-size', type=int, default=64); ap.add_argument('--map-len', type=int, default=32)
    ap.add_argument('--max-tokens', type=int, default=40, help='sentences are cut here, so every N meets the same longest batch')
    ap.add_argument('--one', nargs=2, metavar=('PRESET', 'N'), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a.batch_size, a.map_len, a.max_tokens))); return
    print(f"attention averaging, random-init BERT, Brown sentences of 6-20 words (cut at {a.max_tokens} tokens), "
          f"batch {a.batch_size}, maps up to {a.map_len} tokens")
    print("speed: a process with the default allocator; memory: a second process with MALLOC_MMAP_THRESHOLD_=65536, so that\n"
          "freed tensors go back to the system and RSS shows what is alive (glibc otherwise keeps freed blocks of every shape)")
    print(f"{'preset':7s} {'L x H':>6s} {'N':>6s} {'tokens':>7s} {'tok/s':>7s} {'tok/cpu-s':>9s} {'wall s':>7s} {'threads':>7s} "
          f"{'T max':>5s} {'peak RSS':>9s} {'growth':>7s} {'sums':>8s} {'all maps':>9s}")
    for preset in a.presets.split(','):
        for n in map(int, a.n.split(',')):
            runs = []
            for extra in ({}, {'MALLOC_MMAP_THRESHOLD_': '65536'}):
                r = subprocess.run([sys.executable, __file__, '--one', preset, str(n), '--batch-size', str(a.batch_size),
                                    '--map-len', str(a.map_len), '--max-tokens', str(a.max_tokens)], capture_output=True, text=True,
                                   env=dict(os.environ, TQDM_DISABLE='1', **extra))
                if r.returncode: sys.exit(f"{preset} N={n} failed:\n{r.stderr[-2000:]}")
                runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
            s, m = runs
            print(f"{preset:7s} {s['layers']:>2d} x {s['heads']:<2d} {n:6d} {s['tokens']:7d} {s['tokens_per_s']:7,d} {s['tokens_per_cpu_s']:9,d} "
                  f"{s['wall_s']:7.1f} {s['threads']:7d} {s['longest']:5d} {m['rss_peak_mb']:6.0f} MB {m['rss_growth_mb']:4.0f} MB "
                  f"{m['stats_kb']:5.0f} kB {m['keep_all_maps_mb']:6.0f} MB", flush=True)


if __name__ == '__main__':
    main()
