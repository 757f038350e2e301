"""The notebooks' cells as `nbdev_test` runs them, with the longest notebooks first.

`nbdev_test` hands its workers the notebooks in name order, so the longest ones late in that order (the tutorials come
last) kept one worker busy while the other had nothing left: 43 s of the notebook step in a CI run. Here the same
notebooks, flags and test function (`nbdev.test.test_nb`) run in the order of `SECONDS`, longest first (the
longest-first rule of scheduling); notebooks not listed follow in name order. The figures only rank the notebooks.

    python tools/nbtest.py [--flags slow] [--n_workers 2] [--timing] [NOTEBOOK ...]
"""
import argparse, os, sys
from pathlib import Path

from fastcore.parallel import parallel
from nbdev.config import get_config
from nbdev.doclinks import nbglob
from nbdev.test import _keep_file, test_nb

# seconds of each notebook (path under nbs/) in the clean-clone CI run of 2026-11-28 (2 workers, a cold data cache)
SECONDS = {'02_corpora.ipynb': 140, '04_pretrain.ipynb': 101, '12_knowledge.ipynb': 77, '01_data.ipynb': 72,
           'tutorials/sweep_gpu_server.ipynb': 71, '11_finetune.ipynb': 58, '09a_surgery.ipynb': 55,
           'experiments/results.ipynb': 51, '13_scoring.ipynb': 49, '06_probes.ipynb': 41, 'infra/batch.ipynb': 39,
           '07_reconstruction.ipynb': 37, 'tutorials/first_embryo.ipynb': 36, 'tutorials/interventions.ipynb': 35,
           '08_attention.ipynb': 32, '03_models.ipynb': 30, 'experiments/embryology.ipynb': 25, '09_interventions.ipynb': 21,
           'tutorials/probing_timeline.ipynb': 17, 'tutorials/attention_explorer.ipynb': 15, '01a_splits.ipynb': 15,
           '05_timeline.ipynb': 13, 'infra/docs.ipynb': 12, 'tutorials/existing_checkpoints.ipynb': 11}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--flags', default='', help="space-separated test flags to run that are normally skipped (e.g. slow)")
    p.add_argument('--n_workers', type=int, default=2)
    p.add_argument('--timing', action='store_true', help="print each notebook's seconds, longest first")
    p.add_argument('paths', nargs='*', help="only these notebooks (default: every notebook under nbs/)")
    a = p.parse_args(argv)
    cfg = get_config()
    nbs = Path(cfg.nbs_path).resolve()
    found = [Path(f) for f in a.paths] if a.paths else nbglob(cfg.nbs_path, as_path=True)
    files = [f.absolute() for f in sorted(found) if _keep_file(f, '.notest')]
    files.sort(key=lambda f: -SECONDS.get(f.resolve().relative_to(nbs).as_posix(), 0))    # a stable sort: ties keep name order
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
