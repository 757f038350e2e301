"""tools/run_cells.py, the runner of flagged cells where nbdev is not installed (the `gpu` cells on a bare GPU machine):
it runs a notebook's cells in order up to its last selected-flag cell, skips cells of other flags, and fails loudly."""
import json, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def notebook(path, sources):
    cells = [dict(cell_type='code', id=f'c{i}', metadata={}, outputs=[], execution_count=None, source=s) for i, s in enumerate(sources)]
    path.write_text(json.dumps(dict(cells=cells, metadata={}, nbformat=4, nbformat_minor=5)))
    return path


def run(*args):
    return subprocess.run([sys.executable, str(ROOT/'tools'/'run_cells.py'), *map(str, args)], capture_output=True, text=True)


def test_runs_the_flagged_cells_in_order_and_skips_the_others(tmp_path):
    out = tmp_path/'ran.txt'
    nb = notebook(tmp_path/'a.ipynb', [
        '#| hide\nfrom nbdev.showdoc import show_doc',                   # skipped: nbdev need not be installed
        'import os\nx = 41',
        '#| gpu\nraise RuntimeError("a cell of another flag ran")',
        '#| eval: false\nraise RuntimeError("an eval: false cell ran")',
        '%matplotlib inline\n!echo a shell line\nw = 1',                # IPython lines are dropped, the rest runs
        f'#| slow\nx += w\nopen({str(out)!r}, "w").write(str(x))',
        'raise RuntimeError("a cell after the last flagged one ran")',
    ])
    r = run('--flags', 'slow', nb)
    assert r.returncode == 0, r.stdout + r.stderr
    assert out.read_text() == '42' and 'ok ' in r.stdout


def test_a_failing_cell_fails_the_run_and_is_named(tmp_path):
    nb = notebook(tmp_path/'b.ipynb', ['x = 1', '#| slow\nassert x == 2, "x is not 2"'])
    r = run('--flags', 'slow', nb)
    assert r.returncode == 1 and 'FAILED' in r.stdout and 'x is not 2' in r.stdout + r.stderr


def test_no_flagged_cell_and_unknown_flags(tmp_path):
    nb = notebook(tmp_path/'c.ipynb', ['raise RuntimeError("ran")'])
    r = run('--flags', 'gpu', nb)
    assert r.returncode == 0 and 'not run' in r.stdout
    r = run('--flags', 'fast', nb)
    assert r.returncode != 0 and 'unknown flag' in r.stdout + r.stderr
