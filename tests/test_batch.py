"""Tests of papermill sweeps (nl_embryo.batch): a failing job, --retry-failed, resume, GPU slots, timeouts,
the Slurm array scripts and --run-job, and bad input (grid values of the wrong type, a grid that turns every analysis of
the embryology experiment off); results carry status and error; SIGTERM and SIGHUP stop a sweep, its jobs and their
kernels, and a job is never run by two sweeps at once. The experiment is tests/fixtures/sweep_toy.ipynb
(parameters x, y, fail, sleep, out_dir; each execution appends a line to out_dir/executions.txt)."""
import argparse, json, os, re, shutil, signal, socket, subprocess, sys, time
from pathlib import Path

import nbformat
import pandas as pd
import psutil
import pytest

from nl_embryo.batch import (add_sweep_parser, collect, expand_grid, job_id, job_state, sweep, worker_slots,
                             write_slurm)
from nl_embryo.core import NlEmbryoError, atomic_write_json

FIXTURE = Path(__file__).parent/'fixtures'/'sweep_toy.ipynb'
TOY = FIXTURE
EMBRYOLOGY = Path(__file__).parent.parent/'nbs'/'experiments'/'embryology.ipynb'
GRID = "x: [1, 2]\ny: a\njobs:\n  - {x: 3, y: ccc}\n  - {x: 4, fail: true}\n"


@pytest.fixture
def toy(tmp_path):
    "A copy of the toy experiment in the test's folder."
    return Path(shutil.copy(FIXTURE, tmp_path/'toy.ipynb'))


def write(path, text):
    Path(path).write_text(text); return Path(path)


def executions(out) -> dict:
    "job name -> how many times its notebook ran (lines of executions.txt)."
    manifest = json.loads((Path(out)/'jobs.json').read_text())['jobs']
    res = {}
    for j in manifest:
        f = Path(out)/'jobs'/j['id']/'executions.txt'
        res[j['name']] = len(f.read_text().splitlines()) if f.exists() else 0
    return res


def cli(*argv):
    "Run `nl-embryo sweep ...` through the parser that add_sweep_parser builds."
    p = argparse.ArgumentParser(prog='nl-embryo')
    add_sweep_parser(p.add_subparsers())
    args = p.parse_args(['sweep', *map(str, argv)])
    return args.func(args)


def test_failure_is_recorded_retry_reruns_only_it_and_resume_skips_done(tmp_path, toy, capsys):
    grid, out = write(tmp_path/'grid.yaml', GRID), tmp_path/'sweep'
    res = sweep(toy, grid, out, workers=2, quiet=True)
    # 4 jobs, one failing on purpose: 3 results collected, 1 failure recorded with its error and notebook
    s = res.summary
    assert (s['jobs'], s['done'], s['failed'], s['ran'], s['skipped']) == (4, 3, 1, 4, 0)
    assert executions(out) == {'x=1 y=a': 1, 'x=2 y=a': 1, 'x=3 y=ccc': 1, 'x=4 y=a fail=True': 1}
    df = pd.read_parquet(out/'results.parquet')
    assert list(df.columns) == ['job_id', 'job', 'status', 'error', 'x', 'y', 'fail', 'metric', 'value']   # ids, outcome, parameters, metrics
    done = df[df.status == 'done']
    assert done.job_id.nunique() == 3 and len(done) == 6 and set(done.metric) == {'score', 'length'}
    assert sorted(done[done.metric == 'score'].value) == [10.0, 20.0, 30.0]
    assert done.fail.eq(False).all() and done.set_index('x').y.to_dict() == {1: 'a', 2: 'a', 3: 'ccc'}   # defaults filled in
    failed = df[df.status == 'failed']
    assert len(failed) == 1 and failed.x.item() == 4 and failed.value.isna().all()
    summary = json.loads((out/'summary.json').read_text())
    assert summary['failed'] == 1 and summary['failures'][0]['error'].startswith('ValueError: asked to fail (x=4)')
    fid = summary['failures'][0]['job_id']
    assert fid == job_id({'x': 4, 'y': 'a', 'fail': True})
    nb = nbformat.read(out/'jobs'/fid/'notebook.ipynb', as_version=4)        # the executed notebook shows the error
    assert any(o.get('ename') == 'ValueError' for c in nb.cells if c.cell_type == 'code' for o in c.get('outputs', []))
    assert 'asked to fail' in (out/'jobs'/fid/'log.txt').read_text()
    st = json.loads((out/'jobs'/fid/'status.json').read_text())
    assert st['state'] == 'failed' and st['seconds'] > 0 and st['params'] == {'x': 4, 'y': 'a', 'fail': True}
    for r in done.drop_duplicates('job_id').itertuples():               # each job wrote into its own out_dir
        assert (out/'jobs'/r.job_id/'results.parquet').exists() and json.loads((out/'jobs'/r.job_id/'status.json').read_text())['state'] == 'done'

    # the same command again: nothing runs, the failure is not retried, and the summary says so
    capsys.readouterr()
    res = sweep(toy, grid, out, workers=2)
    assert (res.summary['ran'], res.summary['skipped'], res.summary['failed_not_rerun']) == (0, 4, 1)
    assert '--retry-failed' in capsys.readouterr().out
    assert set(executions(out).values()) == {1}

    # --retry-failed reruns the failed job and only that one
    res = sweep(toy, grid, out, workers=2, retry_failed=True, quiet=True)
    assert res.summary['ran'] == 1 and res.summary['failed'] == 1
    assert executions(out) == {'x=1 y=a': 1, 'x=2 y=a': 1, 'x=3 y=ccc': 1, 'x=4 y=a fail=True': 2}

    # resume after a crash: a job cut off while running, and one whose status was never written, run again;
    # a new value on an axis adds only its job; completed jobs are skipped. 2 GPU slots: each job sees its own.
    ids = {j['name']: j['id'] for j in json.loads((out/'jobs.json').read_text())['jobs']}
    st = json.loads((out/'jobs'/ids['x=1 y=a']/'status.json').read_text())
    atomic_write_json(out/'jobs'/ids['x=1 y=a']/'status.json', dict(st, state='running'))
    (out/'jobs'/ids['x=1 y=a']/'results.parquet').unlink()
    (out/'jobs'/ids['x=2 y=a']/'status.json').unlink()
    assert job_state(out/'jobs'/ids['x=1 y=a']) == job_state(out/'jobs'/ids['x=2 y=a']) == 'pending'
    res = sweep(toy, write(grid, GRID.replace('[1, 2]', '[1, 2, 5]')), out, gpus='7,9', quiet=True)
    assert res.summary['ran'] == 3 and res.summary['done'] == 4 and res.summary['failed'] == 1
    assert executions(out) == {'x=1 y=a': 2, 'x=2 y=a': 2, 'x=3 y=ccc': 1, 'x=4 y=a fail=True': 2, 'x=5 y=a': 1}
    ran = res.jobs[res.jobs.call == 'ran']
    assert set(ran.gpus) == {'7', '9'}                                  # CUDA_VISIBLE_DEVICES, one GPU per worker
    assert json.loads((out/'jobs.json').read_text())['jobs'][-1]['index'] == 4   # indices are stable: new jobs appended
    assert len(pd.read_parquet(out/'results.parquet')) == 4 * 2 + 1


def test_timeout_stops_a_job(tmp_path, toy):
    res = sweep(toy, {'sleep': [120]}, tmp_path/'slow', timeout=3, quiet=True)
    assert res.summary['failed'] == 1 and 'timed out after 3 s' in res.summary['failures'][0]['error']
    assert res.summary['wall_seconds'] < 60


def test_slurm_array_script_and_run_job_runs_exactly_one(tmp_path, toy, capsys):
    grid, out = write(tmp_path/'grid.yaml', "x: [1, 2, 3]\njobs:\n  - {x: 9, fail: true}\n"), tmp_path/'cluster'
    script = write_slurm(toy, grid, out, workers=2, gpus_per_job=2, timeout='90m', sbatch_options=['--partition=gpu', 'account=lab'],
                         setup=['module load cuda', 'source /opt/venv/bin/activate'])
    printed = capsys.readouterr().out
    assert script == (out/'slurm'/'array.sbatch').resolve() and 'sbatch --parsable' in printed and '--dependency=afterany' in printed
    text = script.read_text(); lines = text.splitlines()
    assert lines[0] == '#!/bin/bash'
    for want in ['#SBATCH --array=0-3%2', '#SBATCH --gres=gpu:2', '#SBATCH --time=01:30:00', '#SBATCH --partition=gpu',
                 '#SBATCH --account=lab', f"#SBATCH --output={out.resolve()}/slurm/logs/%A_%a.out", 'set -euo pipefail']:
        assert want in lines, want
    run = lines[-1]
    assert run.startswith('exec ') and run.endswith(f'sweep --out {out.resolve()} --run-job "$SLURM_ARRAY_TASK_ID"')
    assert Path(run.split()[1]).name == 'nl-embryo' and os.access(run.split()[1], os.X_OK)   # the nl-embryo of this environment
    assert lines.index('module load cuda') < lines.index('source /opt/venv/bin/activate') < len(lines) - 1
    assert max(i for i, l in enumerate(lines) if l.startswith('#SBATCH')) < lines.index('set -euo pipefail')   # options before commands
    coll = (out/'slurm'/'collect.sbatch').read_text()
    assert coll.rstrip().endswith(f'sweep --out {out.resolve()} --collect') and 'gres' not in coll and '--array' not in coll
    for s in (script, out/'slurm'/'collect.sbatch'): assert subprocess.run(['bash', '-n', str(s)]).returncode == 0
    manifest = json.loads((out/'jobs.json').read_text())['jobs']
    assert [j['index'] for j in manifest] == [0, 1, 2, 3] and [j['params'].get('x') for j in manifest] == [1, 2, 3, 9]
    assert all((out/'jobs'/j['id']/'job.json').exists() for j in manifest) and not executions(out)['x=2']

    # an array task: exactly one job runs, in this process
    cli('--out', out, '--run-job', 1, '--quiet')
    assert executions(out) == {'x=1': 0, 'x=2': 1, 'x=3': 0, 'x=9 fail=True': 0}
    assert [job_state(out/'jobs'/j['id']) for j in manifest] == ['pending', 'done', 'pending', 'pending']
    cli('--out', out, '--run-job', 1, '--quiet')                     # a requeued task whose job is done does nothing
    assert executions(out)['x=2'] == 1
    with pytest.raises(NlEmbryoError, match='failed: ValueError: asked to fail'):   # a failing task exits non-zero
        cli('--out', out, '--run-job', 3, '--quiet')
    with pytest.raises(NlEmbryoError, match='no job with index 7'):
        cli('--out', out, '--run-job', 7)
    assert sum(executions(out).values()) == 2

    # submitting again sends only what is not done (the failed job only with --retry-failed); --collect gathers
    assert '#SBATCH --array=0,2\n' in write_slurm(toy, grid, out, quiet=True).read_text()
    assert '#SBATCH --array=0,2-3\n' in write_slurm(toy, grid, out, retry_failed=True, quiet=True).read_text()
    cli('--out', out, '--collect')
    df = pd.read_parquet(out/'results.parquet')
    assert df.groupby('status').job_id.nunique().to_dict() == {'done': 1, 'failed': 1, 'pending': 2}
    assert json.loads((out/'summary.json').read_text())['pending'] == 2


def test_grid_format():
    jobs = expand_grid("corpus: [english, zipf]\nseed: [0, 1]\nlr: 1e-3\njobs:\n  - {corpus: random}\n")
    assert [j.params for j in jobs] == [{'corpus': c, 'seed': s, 'lr': 1e-3} for c in ['english', 'zipf'] for s in [0, 1]] + \
        [{'corpus': 'random', 'lr': 1e-3}]
    assert jobs[0].name == 'corpus=english seed=0' and len({j.id for j in jobs}) == 5
    assert expand_grid("seed: [1, 0]")[1].id == expand_grid({'seed': [0]})[0].id         # the id depends on the parameters only
    assert [j.params for j in expand_grid("jobs:\n  - {a: 1}\n  - {a: 2}\n")] == [{'a': 1}, {'a': 2}]
    assert expand_grid({'layers': [[0, 6]]})[0].params == {'layers': [0, 6]}


def test_worker_slots(monkeypatch):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '2,3')
    assert worker_slots() == ['2', '3'] and worker_slots(workers=3) == ['2', '3', '2']
    assert worker_slots(gpus_per_job=2) == ['2,3'] and worker_slots(gpus='none', workers=2) == ['', '']
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    assert worker_slots(workers=2) == [None, None]
    with pytest.raises(NlEmbryoError, match='only 2 are available'): worker_slots(gpus='0,1', gpus_per_job=3)
    with pytest.raises(NlEmbryoError, match='at least 1'): worker_slots(workers=0)


def test_bad_input_stops_before_any_job(tmp_path, toy):
    out = tmp_path/'out'
    # a parameter the notebook does not have
    with pytest.raises(NlEmbryoError, match=r"'lr' that toy.ipynb does not have") as e:
        sweep(toy, {'x': [1, 2], 'lr': [0.1]}, out)
    assert 'x, y, fail, sleep' in str(e.value) and not out.exists()
    with pytest.raises(NlEmbryoError, match=r"'fial' \(did you mean 'fail'\?\)"): sweep(toy, {'fial': True}, out)
    with pytest.raises(NlEmbryoError, match='sets itself'): sweep(toy, {'out_dir': ['a', 'b']}, out)

    # a notebook without a parameters cell, or without out_dir
    nb = nbformat.read(toy, as_version=4)
    nb.cells[1].metadata['tags'] = []; nbformat.write(nb, tmp_path/'untagged.ipynb')
    with pytest.raises(NlEmbryoError, match='no cell tagged `parameters`'): sweep(tmp_path/'untagged.ipynb', {'x': [1]}, out)
    nb.cells[1].metadata['tags'] = ['parameters']; nb.cells[1].source = 'x = 1'; nbformat.write(nb, tmp_path/'no_out_dir.ipynb')
    with pytest.raises(NlEmbryoError, match='no `out_dir` parameter'): sweep(tmp_path/'no_out_dir.ipynb', {'x': [1]}, out)
    assert not out.exists()

    # an output folder that holds another experiment's jobs (prepared for Slurm, so nothing runs here)
    write_slurm(toy, {'x': [1]}, out, quiet=True)
    meta = json.loads((out/'sweep.json').read_text())
    assert meta['notebook'] == str(toy.resolve()) and len(meta['notebook_sha256']) == 16
    nb = nbformat.read(toy, as_version=4); nb.cells[-1].source += "\nprint('another measurement')"
    nbformat.write(nb, tmp_path/'other.ipynb')
    with pytest.raises(NlEmbryoError, match='holds the jobs of another experiment') as e:
        sweep(tmp_path/'other.ipynb', {'x': [1]}, out)
    assert 'new --out folder' in str(e.value)
    # the same experiment with changed code: refused unless allow_changed; outputs and metadata do not count
    nb0 = nbformat.read(toy, as_version=4); nb0.metadata['widgets'] = {}; nb0.cells[1].outputs = [nbformat.v4.new_output('stream', text='hi')]
    nbformat.write(nb0, toy)
    assert write_slurm(toy, {'x': [1]}, out, quiet=True) is not None
    nbformat.write(nb, toy)
    with pytest.raises(NlEmbryoError, match='changed since') as e: sweep(toy, {'x': [1]}, out)
    assert '--allow-changed' in str(e.value)
    write_slurm(toy, {'x': [1]}, out, allow_changed=True, quiet=True)
    assert len(json.loads((out/'sweep.json').read_text())['history']) == 1
    # a folder that is not a sweep folder
    (tmp_path/'runs').mkdir(); write(tmp_path/'runs'/'notes.txt', 'x')
    with pytest.raises(NlEmbryoError, match='not a sweep folder'): sweep(toy, {'x': [1]}, tmp_path/'runs')

    # bad grids, notebooks, kernels and timeouts
    for grid, match in [(tmp_path/'missing.yaml', 'does not exist'), (write(tmp_path/'bad.yaml', 'x: [1'), 'not valid YAML'),
                        (write(tmp_path/'empty.yaml', 'x: []'), 'empty list'), (write(tmp_path/'list.yaml', '- 1\n- 2'), 'must be a mapping'),
                        (write(tmp_path/'nothing.yaml', ''), 'is empty')]:
        with pytest.raises(NlEmbryoError, match=match): sweep(toy, grid, tmp_path/'o2')
    with pytest.raises(NlEmbryoError, match='does not exist'): sweep(tmp_path/'nope.ipynb', {'x': [1]}, tmp_path/'o2')
    with pytest.raises(NlEmbryoError, match='jupytext'): sweep(write(tmp_path/'exp.py', 'x = 1'), {'x': [1]}, tmp_path/'o2')
    with pytest.raises(NlEmbryoError, match="no Jupyter kernel named 'julia-9'"): sweep(toy, {'x': [1]}, tmp_path/'o2', kernel='julia-9')
    with pytest.raises(NlEmbryoError, match='not a duration'): sweep(toy, {'x': [1]}, tmp_path/'o3', timeout='soon')
    with pytest.raises(NlEmbryoError, match='needs an experiment notebook and --grid'): cli('--out', tmp_path/'o2')
    with pytest.raises(NlEmbryoError, match='not a sweep folder'): collect(tmp_path/'runs')
    assert not (tmp_path/'o2').exists() and not (tmp_path/'o3').exists()


@pytest.mark.parametrize('grid, said', [({'x': ['one']}, "grid parameter x: 'one' is a string, but toy.ipynb's parameters cell sets x = 1 (a whole number)"),
                                        ({'fail': [1]}, "fail: 1 is a whole number, but toy.ipynb's parameters cell sets fail = False (a boolean)"),
                                        ({'y': [2]}, "y: 2 is a whole number, but toy.ipynb's parameters cell sets y = 'a' (a string)")])
def test_a_grid_value_of_the_wrong_type_stops_before_any_job(tmp_path, grid, said):
    from nl_embryo.batch import sweep
    toy = Path(shutil.copy(TOY, tmp_path/'toy.ipynb'))
    with pytest.raises(NlEmbryoError) as e: sweep(toy, grid, tmp_path/'out', quiet=True)
    assert said in str(e.value) and 'quote a value meant as text' in e.value.fix
    assert not (tmp_path/'out').exists()


def test_a_grid_that_turns_every_analysis_off_stops_before_any_job(tmp_path):
    from nl_embryo.batch import sweep, load_grid
    grid = load_grid("seed: [0, 1]\nprobe_tasks: [[]]\nattention_sentences: 0\nfinetune_tasks: [[]]\n")
    with pytest.raises(NlEmbryoError, match=r'job .*every analysis is off') as e: sweep(EMBRYOLOGY, grid, tmp_path/'out', quiet=True)
    assert 'turn at least one on' in e.value.fix and not (tmp_path/'out').exists()
    with pytest.raises(NlEmbryoError, match="seed: 'one' is a string"): sweep(EMBRYOLOGY, {'seed': ['one']}, tmp_path/'out', quiet=True)


def test_results_carry_status_and_error(tmp_path):
    from nl_embryo.batch import sweep
    toy = Path(shutil.copy(TOY, tmp_path/'toy.ipynb'))
    res = sweep(toy, {'jobs': [{'x': 2}, {'x': 4, 'fail': True}]}, tmp_path/'out', workers=1, quiet=True)
    df = pd.read_parquet(tmp_path/'out'/'results.parquet')
    assert {'status', 'error'} <= set(df.columns)
    failed = df[df['status'] == 'failed']
    assert len(failed) == 1 and 'asked to fail (x=4)' in failed['error'].iloc[0]
    assert df.loc[df['status'] == 'done', 'error'].isna().all() and not res.ok


# --- stopping a sweep: SIGTERM, SIGHUP, and a job that another sweep runs ---------------------------------------------

def held_toy(folder) -> Path:
    "The toy experiment, whose job waits while the file `hold` exists in its folder (the kernel's working folder)."
    nb = nbformat.read(FIXTURE, as_version=4)
    nb.cells[-1].source = nb.cells[-1].source.replace('time.sleep(sleep)', "while Path('hold').exists(): time.sleep(0.1)")
    assert "Path('hold')" in nb.cells[-1].source
    nbformat.write(nb, Path(folder)/'toy.ipynb'); (Path(folder)/'hold').touch()
    write(Path(folder)/'grid.yaml', 'x: [1]\n')
    return Path(folder)/'toy.ipynb'


@pytest.fixture
def start(tmp_path):
    "start(*argv): `nl-embryo sweep ARGV` in a process of its own session; what is left of it (and of its jobs) is killed at the end."
    started = []
    def start(*argv):
        p = subprocess.Popen([sys.executable, '-c', 'import sys; from nl_embryo.cli import main; sys.exit(main())', 'sweep', *map(str, argv)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=tmp_path,
                             preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))   # as from a terminal: a test run under nohup
        started.append(p); return p                                                                   # would pass SIGHUP's ignore on to the sweep
    yield start
    left = [q for q in psutil.process_iter(['cmdline']) if str(tmp_path) in ' '.join(q.info['cmdline'] or [])]
    for q in left + [c for q in left for c in q.children(recursive=True)]:
        try: q.kill()
        except psutil.Error: pass
    for p in started:
        if p.poll() is None: p.kill(); p.communicate()


def job_running(out, sweep_proc, timeout=120) -> Path:
    "Wait until the sweep's one job runs its notebook (it wrote executions.txt); its folder."
    end = time.time() + timeout
    while time.time() < end:
        assert sweep_proc.poll() is None, sweep_proc.communicate()
        if hits := list(Path(out).glob('jobs/*/executions.txt')): return hits[0].parent
        time.sleep(0.1)
    raise AssertionError(f"the job of {out} did not start in {timeout} s")


def alive(procs) -> list:
    "The processes of `procs` still alive (a zombie is dead), after up to 5 s."
    def live(q):
        try: return q.is_running() and q.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess: return False
    end = time.time() + 5
    while (left := [q for q in procs if live(q)]) and time.time() < end: time.sleep(0.1)
    return left


@pytest.mark.parametrize('signame', ['SIGTERM', 'SIGHUP'])
def test_a_signal_stops_the_sweep_its_jobs_and_kernels_and_a_rerun_completes_the_job_once(tmp_path, start, signame):
    toy, out = held_toy(tmp_path), tmp_path/'out'
    p = start(toy, '--grid', tmp_path/'grid.yaml', '--out', out)
    job = job_running(out, p)
    tree = psutil.Process(p.pid).children(recursive=True)              # the job's process and its kernel
    assert len(tree) >= 2 and any(str(job) in ' '.join(q.cmdline()) for q in tree)
    sig = getattr(signal, signame)
    if sig == signal.SIGHUP: os.killpg(p.pid, sig)                       # a terminal's hangup reaches the whole group
    else: os.kill(p.pid, sig)                                            # kill PID, a scheduler's stop
    t0 = time.time()
    _, err = p.communicate(timeout=150)
    assert p.returncode == 130 and time.time() - t0 < 120
    assert f'stopped by {signame}' in err and '1 running job(s) stopped and recorded as interrupted' in err
    assert not alive(tree)                                               # no job process, no kernel left behind
    assert not [q for q in psutil.process_iter(['cmdline']) if str(job) in ' '.join(q.info['cmdline'] or [])]
    st = json.loads((job/'status.json').read_text())
    assert st['state'] == 'interrupted' and signame in st['error'] and job_state(job) == 'pending'
    summary = json.loads((out/'summary.json').read_text())              # the summary is written
    assert (summary['done'], summary['pending'], summary['failed'], summary['ran']) == (0, 1, 0, 1)

    # the same command again completes the job, once
    (tmp_path/'hold').unlink()
    res = sweep(toy, tmp_path/'grid.yaml', out, quiet=True)
    assert (res.summary['done'], res.summary['ran']) == (1, 1) and job_state(job) == 'done'
    log = (job/'log.txt').read_text()
    assert log.count('=== interrupted') == 1 and len(re.findall(r'^=== .* job ', log, re.M)) == 2   # two runs, the first one interrupted
    assert sorted(out.rglob('results*')) == [job/'results.parquet', out/'results.parquet']
    assert len((job/'executions.txt').read_text().splitlines()) == 2 and len(pd.read_parquet(out/'results.parquet')) == 2


def test_a_second_sweep_does_not_start_a_job_that_the_first_one_runs(tmp_path, start, capsys):
    toy, out = held_toy(tmp_path), tmp_path/'out'
    first = start(toy, '--grid', tmp_path/'grid.yaml', '--out', out)
    job = job_running(out, first)
    pid = json.loads((job/'status.json').read_text())['pid']
    assert job_state(job) == 'running'
    res = sweep(toy, tmp_path/'grid.yaml', out, timeout=30)             # the same sweep again while the first one runs the job
    assert f"is running in process {pid} on {socket.gethostname()}; not started twice" in capsys.readouterr().out
    assert (res.summary['running'], res.summary['failed'], res.summary['ran'], res.summary['skipped']) == (1, 0, 0, 1) and not res.ok
    assert first.poll() is None                                          # the first sweep runs on
    (tmp_path/'hold').unlink()
    first.communicate(timeout=60)
    assert first.returncode == 0 and job_state(job) == 'done'
    assert len((job/'executions.txt').read_text().splitlines()) == 1     # the notebook ran once
    assert json.loads((out/'summary.json').read_text())['done'] == 1


def test_write_slurm_names_the_jobs_another_process_runs(toy, tmp_path, capsys):
    "Jobs whose lock another process holds are left out of the array, and `write_slurm` says which run where; with only those left it says they are running, not 'nothing to submit'."
    out = tmp_path/'cluster'
    write_slurm(toy, {'x': [1, 2]}, out, quiet=True)
    manifest = json.loads((out/'jobs.json').read_text())['jobs']
    holder = subprocess.Popen([sys.executable, '-c', "import fcntl, os, socket, sys, time\n"
                               "for d in sys.argv[1:]:\n"
                               "    fd = os.open(os.path.join(d, 'lock'), os.O_RDWR | os.O_CREAT, 0o644); fcntl.flock(fd, fcntl.LOCK_EX)\n"
                               "    os.pwrite(fd, f'{os.getpid()} on {socket.gethostname()}\\n'.encode(), 0)\n"
                               "print('held', flush=True); time.sleep(60)", *[str(out/'jobs'/j['id']) for j in manifest]],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'held'
        capsys.readouterr()
        assert [job_state(out/'jobs'/j['id']) for j in manifest] == ['running', 'running']
        assert write_slurm(toy, {'x': [1, 2]}, out) is None
        said = capsys.readouterr().out
        assert 'nothing to submit now: 2 of the 2 job(s)' in said and 'are done (' not in said and 'nothing to submit\n' not in said, said
        for j in manifest:
            assert f"job {j['index']} {j['id']} ({j['name']}): running in process {holder.pid} on {socket.gethostname()}" in said, said
    finally:
        holder.kill(); holder.wait()
    assert write_slurm(toy, {'x': [1, 2]}, out) is not None     # the locks died with their process: both jobs to submit
    assert 'running' not in capsys.readouterr().out
