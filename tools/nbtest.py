"""The notebooks' cells as `nbdev_test` runs them, with the longest notebooks first.

`nbdev_test` hands its workers the notebooks in name order, so the longest ones late in that order (the tutorials come
last) kept one worker busy while the other had nothing left: 43 s of the notebook step in a CI run. Here the same
notebooks, flags and test function (`nbdev.test.test_nb`) run in the order of `SECONDS`, longest first (the
longest-first rule of scheduling), after the two of `FIRST` that fill the data cache; notebooks not listed follow in
name order. The figures only rank the notebooks.

The tutorials (nbs/tutorials) are left to `tests/test_tutorials.py`, which runs each from a folder outside the checkout,
as a reader who copied it would: run here too they would cost the suite about three minutes twice. Named on the command
line, they run here as any notebook.

    python tools/nbtest.py [--flags slow] [--n_workers 2] [--timing] [NOTEBOOK ...]
"""
import argparse, os, sys
from pathlib import Path

from fastcore.parallel import parallel
from nbdev.config import get_config
from nbdev.doclinks import nbglob
from nbdev.test import _keep_file, test_nb

# seconds of each notebook (path under nbs/) in the clean-clone CI run of 936c6fa, 2026-11-28 (2 workers, a cold data cache);
# 13a_minimal_pairs: its pairs are parsed on a cold cache (about 80 s on the 2-core machine), then 16 s
SECONDS = {'04_pretrain.ipynb': 154, '02_corpora.ipynb': 133, '13a_minimal_pairs.ipynb': 100, '12_knowledge.ipynb': 87,
           'tutorials/sweep_gpu_server.ipynb': 81, '09a_surgery.ipynb': 74, '11_finetune.ipynb': 70,
           '13_scoring.ipynb': 54, 'experiments/results.ipynb': 52, '06_probes.ipynb': 51, '01_data.ipynb': 45,
           '07_reconstruction.ipynb': 43, '08f_llc.ipynb': 40, '08h_induction.ipynb': 35, 'tutorials/first_embryo.ipynb': 32, 'tutorials/interventions.ipynb': 30,
           'infra/batch.ipynb': 29, '08_attention.ipynb': 26, '09_interventions.ipynb': 19,
           'tutorials/probing_timeline.ipynb': 16, 'experiments/embryology.ipynb': 16, '05_timeline.ipynb': 13,
           '03_models.ipynb': 13, 'tutorials/existing_checkpoints.ipynb': 12, 'tutorials/attention_explorer.ipynb': 11,
           'infra/docs.ipynb': 10}
# started first, side by side: 02_corpora trains the tokenizers and packs the corpora that most notebooks read from the
# data cache (cold on CI); 01_data uses neither (it reads the fetched sources, and the four derived tables the two
# notebooks share are built once, under `derived_frame`'s lock). Started beside 02_corpora, 04_pretrain waited for the
# English tokenizer: 154-158 s in the two CI runs that ran it so, 101-115 s in the four before, when it started after 01_data
FIRST = ('02_corpora.ipynb', '01_data.ipynb')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--flags', default='', help="space-separated test flags to run that are normally skipped (e.g. slow)")
    p.add_argument('--n_workers', type=int, default=2)
    p.add_argument('--timing', action='store_true', help="print each notebook's seconds, longest first")
    p.add_argument('paths', nargs='*', help="only these notebooks (default: every notebook under nbs/)")
    a = p.parse_args(argv)
    cfg = get_config()
    nbs = Path(cfg.nbs_path).resolve()
    found = ([Path(f) for f in a.paths] if a.paths else
             [f for f in nbglob(cfg.nbs_path, as_path=True) if 'tutorials' not in Path(f).resolve().relative_to(nbs).parts])   # tests/test_tutorials.py runs those
    files = [f.absolute() for f in sorted(found) if _keep_file(f, '.notest')]
    def rank(f):
        rel = f.resolve().relative_to(nbs).as_posix()
        return (FIRST.index(rel), 0) if rel in FIRST else (len(FIRST), -SECONDS.get(rel, 0))
    files.sort(key=rank)                                      # a stable sort: ties keep name order
    with_cwd = os.getcwd()
    os.chdir(nbs)
    try:
        results = parallel(test_nb, files, skip_flags=cfg.tst_flags.split(), force_flags=a.flags.split(), n_workers=a.n_workers,
                           basepath=cfg.config_path, pause=0.01, do_print=False)
    finally: os.chdir(with_cwd)
    passed, times = zip(*results)
    if a.timing:
        for f, t in sorted(zip(files, times), key=lambda o: -o[1]): print(f"{f.relative_to(nbs).as_posix()}: {int(t)} secs")
    if not all(passed):
        failed = '\n\t'.join(f.relative_to(nbs).as_posix() for ok, f in zip(passed, files) if not ok)
        sys.stderr.write(f"\nnbdev Tests Failed On The Following Notebooks:\n{'=' * 50}\n\t{failed}\n")
        sys.exit(1)
    print("Success.")


if __name__ == '__main__':
    main()
