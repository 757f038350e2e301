#!/usr/bin/env python
"""Run the flagged cells of notebooks where nbdev is not installed (a bare GPU machine, say), the way nbdev_test
runs them: each notebook's cells in order, in one namespace, up to its last cell carrying one of --flags.

    python tools/run_cells.py --flags gpu nbs/04_pretrain.ipynb nbs/06_probes.ipynb nbs/13_scoring.ipynb

Skipped, as nbdev_test skips them: cells flagged with a tst_flag that is not selected, `#| eval: false` cells, and
lines of IPython magics (`%`, `!`). Also skipped: `#| hide` cells that only import nbdev's show_doc. A notebook with
no cell carrying a selected flag is not run. Exits 1 at the first failing cell, naming it.
"""
import argparse, ast, configparser, json, os, sys, time, traceback
from pathlib import Path


def directives(src: str) -> dict:
    out = {}
    for line in src.splitlines():
        s = line.strip()
        if not s.startswith('#|'):
            if s: break
            continue
        words = s[2:].replace(':', ' ').split()
        if words: out[words[0]] = words[1:]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--flags', required=True, help='comma- or space-separated tst_flags to run (e.g. gpu)')
    ap.add_argument('notebooks', nargs='+')
    a = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    cfg = configparser.ConfigParser(); cfg.read(root/'settings.ini')
    all_flags = set(cfg['DEFAULT'].get('tst_flags', '').split())
    want = set(a.flags.replace(',', ' ').split())
    if not want <= all_flags: sys.exit(f"unknown flag(s) {sorted(want - all_flags)}: settings.ini's tst_flags are {sorted(all_flags)}")
    sys.path.insert(0, str(root))
    if os.environ.get('NL_EMBRYO_DATA'):                       # cells run in their notebook's folder: keep the cache found
        os.environ['NL_EMBRYO_DATA'] = str(Path(os.environ['NL_EMBRYO_DATA']).resolve())
    failed = 0
    for nb in a.notebooks:
        cells = [c for c in json.loads(Path(nb).read_text())['cells'] if c['cell_type'] == 'code']
        srcs = [''.join(c['source']) for c in cells]
        flagged = [i for i, s in enumerate(srcs) if want & set(directives(s))]
        if not flagged:
            print(f"{nb}: no cell flagged {sorted(want)}: not run"); continue
        ns = {'__name__': '__main__', 'display': print}
        cwd = os.getcwd(); os.chdir(Path(nb).parent)
        t0 = time.perf_counter(); ran = 0
        try:
            for i, src in enumerate(srcs[:flagged[-1] + 1]):
                d = directives(src)
                if (set(d) & all_flags) - want or d.get('eval') == ['false']: continue
                if 'hide' in d and 'nbdev.showdoc' in src: continue
                code = '\n'.join(l for l in src.splitlines() if not l.lstrip().startswith(('%', '!')))
                tree = ast.parse(code)
                last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
                if last: tree.body = tree.body[:-1]
                exec(compile(tree, f'{nb}[{i}]', 'exec'), ns)
                if last: eval(compile(ast.Expression(last.value), f'{nb}[{i}]', 'eval'), ns)
                ran += 1
        except Exception:
            traceback.print_exc()
            print(f"FAILED {nb}: code cell {i} (0-based, code cells only):\n{src}")
            failed += 1
        else:
            print(f"ok {nb}: {ran} cells ({len(flagged)} flagged {sorted(want)}) in {time.perf_counter() - t0:.0f} s")
        finally: os.chdir(cwd)
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
