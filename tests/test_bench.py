"""The scripts in bench/ as a user runs them: bench/eval_split.py names a folder that is not a run in one line with the
fix, and scores a real one (the shared `reference` run of conftest.py)."""
from pathlib import Path


def test_eval_split_bench_names_a_folder_that_is_not_a_run(tmp_path, reference):
    "bench/eval_split.py on a missing folder and on a bare checkpoint folder: one line each, naming the fix."
    import subprocess, sys
    root = Path(__file__).resolve().parent.parent
    for path, said in [(tmp_path/'nope', 'pass a run folder'), (Path(reference)/'checkpoints'/'step4', 'give a run folder')]:
        p = subprocess.run([sys.executable, str(root/'bench'/'eval_split.py'), str(path)], capture_output=True, text=True)
        assert p.returncode == 1 and said in p.stderr and 'Traceback' not in p.stderr, p.stderr
    p = subprocess.run([sys.executable, str(root/'bench'/'eval_split.py'), str(reference)], capture_output=True, text=True)
    row = p.stdout.strip().splitlines()[-1].split()
    assert p.returncode == 0 and row[1] == '4' and len(row) == 6, p.stdout + p.stderr   # a real run is scored both ways
