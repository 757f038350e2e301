"""The battery of hostile folders, faults and bad input: each case that once ran foreign code, read outside a folder, named a
broken checkpoint as good, overwrote a run, lost a checkpoint, let two writers in, died in the chart renderer, hung on a
grid or a zip bomb, or ended in a traceback or silence. Each asserts a clean message, no marker of foreign code, no file
outside the folder opened (an audit hook on Python's opens, and FIFOs as the outside targets: a reader of one, in any
language, is seen by a watchdog and let go at once) and no data lost."""
import errno, hashlib, json, os, resource, shutil, stat, subprocess, sys, threading, time
from pathlib import Path

import pytest
import torch

from conftest import MINI, cli, nl_embryo_cmd, train, weights
from nl_embryo.core import NlEmbryoError

pytestmark = pytest.mark.usefixtures('one_torch_thread')


# --- watching the outside ---------------------------------------------------------------------------------------------

_WATCHED: list = []          # the folders whose opening is a violation, while a `Watched` block runs
_WATCHDOGS: set = set()      # the threads that poll the FIFOs (their own opens are not violations)

def _audit(event, args):
    if event == 'open' and _WATCHED and args and isinstance(args[0], (str, bytes, os.PathLike)) and threading.get_ident() not in _WATCHDOGS:
        p = os.path.realpath(os.fsdecode(args[0]))
        for w in _WATCHED:
            if p.startswith(w['root']): w['opened'].append(p)

sys.addaudithook(_audit)


class Watched:
    """An outside folder nothing may read: Python-level opens under it are recorded (audit hook), and its FIFOs are polled
    by a watchdog: a reader of one (a Rust or C open, say) is recorded and released with an EOF at once."""
    def __init__(self, root: Path):
        self.root = Path(root); self.root.mkdir(parents=True, exist_ok=True)
        self.w = dict(root=os.path.realpath(self.root), opened=[]); self.stop = threading.Event(); self.fifos = []

    def fifo(self, name: str) -> Path:
        p = self.root/name; p.parent.mkdir(parents=True, exist_ok=True); os.mkfifo(p); self.fifos.append(p); return p

    def _watch(self):
        _WATCHDOGS.add(threading.get_ident())
        while not self.stop.is_set():
            for f in self.fifos:
                try: fd = os.open(f, os.O_WRONLY | os.O_NONBLOCK)       # ENXIO while no reader has it open
                except OSError: continue
                self.w['opened'].append(str(f)); os.close(fd)
            time.sleep(0.005)

    def __enter__(self):
        _WATCHED.append(self.w); self.t = threading.Thread(target=self._watch, daemon=True); self.t.start(); return self

    def __exit__(self, *exc):
        self.stop.set(); self.t.join(5); _WATCHED.remove(self.w)

    @property
    def opened(self) -> list: return sorted(set(self.w['opened']))


def tree(root) -> dict:
    "{relative path: (kind, sha256 or target)} of everything under `root`, links not followed: what 'nothing changed' compares."
    out = {}
    for p in sorted(Path(root).rglob('*')):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink(): out[rel] = ('link', os.readlink(p))
        elif p.is_dir(): out[rel] = ('dir', '')
        elif stat.S_ISFIFO(p.lstat().st_mode): out[rel] = ('fifo', '')
        else: out[rel] = ('file', hashlib.sha256(p.read_bytes()).hexdigest() if p.stat().st_size < 2**30 else str(p.stat().st_size))
    return out


def cli_exit(capsys, *args) -> tuple[int, str]:
    "`cli`, for commands that end with `sys.exit(N)` (verify): the exit status and what was printed."
    try: return cli(capsys, *args)
    except SystemExit as e:
        got = capsys.readouterr(); return e.code, got.out + got.err


def tiny_bert(folder, tok, seed=0, **config):
    "A small BertForMaskedLM (hidden 32) with the English tokenizer, saved as safetensors into `folder`."
    from transformers import BertConfig, BertForMaskedLM
    from nl_embryo.models import quiet_transformers
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=128, architectures=['BertForMaskedLM'], **config)
    with quiet_transformers(): BertForMaskedLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return Path(folder)


def run_in_terminal(args, answer: bytes = b'y\n', timeout=240) -> tuple[int, str]:
    "Run `nl-embryo ARGS` with a pseudo-terminal as its stdin and stdout, typing `answer` at any prompt; its exit status and output."
    import pty, select
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(nl_embryo_cmd()[0], nl_embryo_cmd(*args))
    out, t0 = b'', time.time()
    while time.time() - t0 < timeout:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try: chunk = os.read(fd, 4096)
            except OSError: break
            if not chunk: break
            out += chunk
            if b'[y/N]' in chunk: os.write(fd, answer)
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors='replace')


# --- 1. foreign code never runs ----------------------------------------------------------------------------------------

def test_a_folder_that_asks_for_custom_code_is_refused_before_any_prompt(tmp_path, english_tokenizer):
    evil = tiny_bert(tmp_path/'evil', english_tokenizer)
    cfg = json.loads((evil/'config.json').read_text())
    cfg.update(model_type='evilbert', auto_map={'AutoConfig': 'configuration_evil.EvilConfig', 'AutoModelForMaskedLM': 'modeling_evil.EvilModel'})
    (evil/'config.json').write_text(json.dumps(cfg))
    marker = tmp_path/'ran'
    for name in ('configuration_evil.py', 'modeling_evil.py'): (evil/name).write_text(f"open({str(marker)!r}, 'w').write('the custom code ran')\n")
    before = tree(evil)
    rc, out = run_in_terminal(['analyze', evil, '--out', tmp_path/'out', '--attention'])          # a terminal: transformers would ask
    assert rc == 2 and 'Traceback' not in out, out[-3000:]
    assert 'custom code' in out and 'never runs code' in out and '[y/N]' not in out, out[-3000:]
    assert not marker.exists() and tree(evil) == before
    assert '--resume' not in out and 'remove' not in out           # no advice to delete or resume a folder nl_embryo did not write


def test_a_foreign_folder_that_does_not_load_gets_no_advice_to_remove_or_resume(tmp_path, capsys, english_tokenizer):
    bad = tiny_bert(tmp_path/'suite'/'step10', english_tokenizer)
    cfg = json.loads((bad/'config.json').read_text()); cfg['hidden_size'] = 64; cfg['intermediate_size'] = 128     # weights of another shape
    (bad/'config.json').write_text(json.dumps(cfg))
    before = tree(tmp_path/'suite')
    rc, out = cli(capsys, 'analyze', tmp_path/'suite', '--out', tmp_path/'out', '--attention', '--quiet')
    assert rc == 2 and 'cannot be loaded' in out and 'nl_embryo did not write this folder' in out, out[-2000:]
    assert '--resume' not in out and 'remove it' not in out and tree(tmp_path/'suite') == before


# --- 2. nothing outside the folder is read --------------------------------------------------------------------------------

@pytest.fixture
def hostile(tmp_path, english_tokenizer):
    "A suite with one genuine step and a link out of it in every form, its outside targets watched (FIFOs and a 1 TB sparse file)."
    out = Watched(tmp_path/'outside')
    secret = out.fifo('shadow')                                         # stands for /etc/shadow: opening it is seen
    huge = out.root/'huge.safetensors'
    with open(huge, 'wb') as f: f.truncate(2**40)                      # a 1 TB sparse file
    stepdir = tiny_bert(out.root/'stepdir', english_tokenizer, seed=9)
    (stepdir/'model.safetensors').unlink(); out.fifo('stepdir/model.safetensors')
    suite = tmp_path/'suite'
    tiny_bert(suite/'step10', english_tokenizer)
    tiny_bert(suite/'step20', english_tokenizer, seed=2); (suite/'step20'/'extra.safetensors').symlink_to(secret)
    (suite/'step30').symlink_to(stepdir, target_is_directory=True)
    tiny_bert(suite/'step40', english_tokenizer, seed=4); (suite/'step40'/'config.json').unlink(); (suite/'step40'/'config.json').symlink_to(out.root/'stepdir'/'config.json')
    tiny_bert(suite/'step50', english_tokenizer, seed=5); (suite/'step50'/'model.safetensors').unlink(); (suite/'step50'/'model.safetensors').symlink_to(huge)
    return suite, out


def test_links_out_of_a_suite_are_refused_and_nothing_outside_is_opened(tmp_path, capsys, hostile):
    suite, out = hostile
    before = tree(suite)
    with out:
        t0 = time.time()
        rc, said = cli(capsys, 'timeline', suite, '--out', tmp_path/'a')          # records digests by default: hashing
        took = time.time() - t0
        assert rc == 0, said
        rc2, said2 = cli(capsys, 'analyze', suite, '--out', tmp_path/'a', '--attention', '--quiet')
    assert out.opened == [], out.opened
    assert took < 30, took                                                 # the 1 TB file is never hashed
    assert rc2 == 0, said2[-2000:]
    assert '1 checkpoint(s) to analyse' in said and said.count('leaves the timeline') == 4, said
    assert 'extra.safetensors -> ' in said and 'step30 -> ' in said and '--follow-links' in said
    assert tree(suite) == before


def test_hub_cache_refs_and_snapshot_links_stay_in_the_cache(tmp_path, capsys, english_tokenizer):
    out = Watched(tmp_path/'outside')
    stepdir = tiny_bert(out.root/'stepdir', english_tokenizer); (stepdir/'model.safetensors').unlink(); out.fifo('stepdir/model.safetensors')
    repo = tmp_path/'hub'/'models--org--x'
    good, linked = 'a' * 40, 'b' * 40
    tiny_bert(repo/'snapshots'/good, english_tokenizer)
    tiny_bert(repo/'snapshots'/linked, english_tokenizer, seed=3)
    (repo/'snapshots'/linked/'model.safetensors').unlink(); (repo/'snapshots'/linked/'model.safetensors').symlink_to(out.root/'stepdir'/'model.safetensors')
    (repo/'refs').mkdir()
    (repo/'refs'/'step10').write_text(good); (repo/'refs'/'step20').write_text('../../../../outside/stepdir'); (repo/'refs'/'step30').write_text(linked)
    (repo/'refs'/'step40').symlink_to(out.root/'stepdir'/'config.json')
    before = tree(repo)
    with out:
        rc, said = cli(capsys, 'timeline', repo, '--out', tmp_path/'a')
    assert rc == 0 and out.opened == [], (said, out.opened)
    assert '1 checkpoint(s) to analyse' in said and "not a commit id" in said and 'link out of the cache' in said and 'leaves the timeline' in said, said
    assert tree(repo) == before


def test_a_mapping_file_cannot_reach_out_by_a_relative_path(tmp_path, capsys, english_tokenizer):
    out = Watched(tmp_path/'outside')
    stepdir = tiny_bert(out.root/'stepdir', english_tokenizer); (stepdir/'model.safetensors').unlink(); out.fifo('stepdir/model.safetensors')
    (tmp_path/'mine').mkdir(); tiny_bert(tmp_path/'mine'/'a', english_tokenizer)
    (tmp_path/'mine'/'map.csv').write_text('step,path\n10,a\n20,../outside/stepdir\n')
    with out:
        rc, said = cli(capsys, 'timeline', tmp_path/'mine'/'map.csv', '--out', tmp_path/'o')
    assert rc == 2 and "out of the mapping file's folder" in said and 'absolute path' in said and out.opened == [], said


def test_follow_links_reads_a_suite_of_your_own_through_its_links(tmp_path, capsys, english_tokenizer):
    disk = tiny_bert(tmp_path/'otherdisk'/'step20', english_tokenizer, seed=1)
    tiny_bert(tmp_path/'suite'/'step10', english_tokenizer); (tmp_path/'suite'/'step20').symlink_to(disk, target_is_directory=True)
    rc, said = cli(capsys, 'timeline', tmp_path/'suite', '--out', tmp_path/'a', '--no-record')
    assert rc == 0 and '1 checkpoint(s) to analyse' in said
    rc, said = cli(capsys, 'timeline', tmp_path/'suite', '--out', tmp_path/'a', '--no-record', '--follow-links')
    assert rc == 0 and '2 checkpoint(s) to analyse' in said, said


# --- 3. after a NaN, the last good checkpoint is good, and the printed fix works ---------------------------------------

CLI_MINI = ['--corpus', 'nested-zipf', '--block-size', 32, '--corpus-tokens', 40_000, '--batch-size', 8, '--preset', 'mini', '--eval-batches', 1]

def _good(run, step) -> bool:
    "Whether checkpoint `step` of `run` has finite weights and a finite eval loss in the metrics."
    m = {r['step']: r for r in map(json.loads, (Path(run)/'metrics.jsonl').read_text().splitlines())}
    return all(bool(torch.isfinite(t).all()) for t in weights(run, step).values()) and torch.isfinite(torch.tensor(m[step]['eval_mlm_loss'])).item()


@pytest.mark.filterwarnings('ignore:.*unigram plateau')
@pytest.mark.parametrize('lr', ['1e30', '1e6'])
def test_a_diverging_run_names_a_good_checkpoint_and_its_fix_completes_the_run(tmp_path, capsys, small_corpus, lr):
    run = tmp_path/'run'
    rc, said = cli(capsys, 'pretrain', *CLI_MINI, '--steps', 8, '--checkpoints', '0,1,2,4,8', '--lr', lr, '--max-grad-norm', 0, '--out', run, '--quiet')
    assert rc == 2 and 'Traceback' not in said, said
    good = int(said.split('the last good checkpoint is step')[1].split()[0])
    from nl_embryo.checkpoints import list_checkpoints
    assert max(list_checkpoints(run, warn=False)) == good and _good(run, good), said
    fix = said.split('fix: ')[1]
    new_lr = fix.split('--resume --lr ')[1].split()[0]
    assert '--max-grad-norm 1.0' in fix
    rc, again = cli(capsys, 'pretrain', *CLI_MINI, '--steps', 8, '--checkpoints', '0,1,2,4,8', '--out', run, '--resume', '--lr', new_lr, '--max-grad-norm', '1.0', '--quiet')
    assert rc == 0 and all(_good(run, s) for s in (0, 1, 2, 4, 8)), again          # the fix, followed, completes the run
    rc, still = cli(capsys, 'pretrain', *CLI_MINI, '--steps', 16, '--checkpoints', '0,1,2,4,8,16', '--out', run, '--resume', '--lr', lr, '--quiet')
    assert rc == 2 and 'the last good checkpoint is step8' in still and 'Traceback' not in still, still   # a diverging lr again: a clean error
    assert _good(run, 8) and not (run/'checkpoints'/'step16').exists()


# --- 4-6. a run is never overwritten, a removed checkpoint is written again, one writer at a time ------------------------

@pytest.mark.filterwarnings('ignore:.*unigram plateau')
def test_a_damaged_run_is_never_overwritten_by_a_new_one(tmp_path, capsys, reference):
    run = tmp_path/'run'; shutil.copytree(reference, run)
    for p in (run/'checkpoints').glob('step*/optimizer.safetensors'): p.write_bytes(p.read_bytes()[:100])   # every optimizer file cut
    before = tree(run)
    rc, said = cli(capsys, 'pretrain', *CLI_MINI, '--steps', 1, '--out', run, '--quiet')
    assert rc == 2 and 'already holds a run' in said and 'damaged' in said and '--resume' in said, said
    assert tree(run) == before
    (tmp_path/'mine').mkdir(); (tmp_path/'mine'/'notes.txt').write_text('my notes')
    rc, said = cli(capsys, 'pretrain', *CLI_MINI, '--steps', 1, '--out', tmp_path/'mine', '--quiet')
    assert rc == 2 and 'not a run of nl_embryo' in said and sorted(p.name for p in (tmp_path/'mine').iterdir()) == ['notes.txt'], said


@pytest.mark.filterwarnings('ignore:.*unigram plateau')
def test_the_printed_fix_for_a_damaged_middle_checkpoint_gives_the_run_that_never_failed(tmp_path, capsys, small_corpus):
    clean, run = tmp_path/'clean', tmp_path/'run'
    for r in (clean, run): train(r, steps=8, checkpoints='0,2,4,6,8')
    w = run/'checkpoints'/'step4'/'model.safetensors'
    with open(w, 'r+b') as f: f.seek(w.stat().st_size - 64); f.write(bytes(16))      # 16 bytes flipped, the size kept
    rc, said = cli_exit(capsys, 'verify', run)
    assert rc == 1 and 'damaged: step(s) 4' in said and 'remove them and continue the run' in said, said
    shutil.rmtree(run/'checkpoints'/'step4')                              # the fix, literally
    keep = {s: (run/'checkpoints'/f'step{s}'/'model.safetensors').stat().st_mtime_ns for s in (6, 8)}
    from nl_embryo.pretrain import PretrainConfig, pretrain
    with pytest.warns(UserWarning, match=r'writes checkpoint\(s\) step4 again .* continues from step2'):
        pretrain(PretrainConfig(out=str(run), steps=8, checkpoints='0,2,4,6,8', **MINI), resume=True, quiet=True)
    for s in (4, 6, 8):
        a, b = weights(clean, s), weights(run, s)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), s
    assert {s: (run/'checkpoints'/f'step{s}'/'model.safetensors').stat().st_mtime_ns for s in (6, 8)} == keep   # equal: kept, not rewritten
    assert [json.loads(l)['step'] for l in (run/'metrics.jsonl').read_text().splitlines()] == list(range(9))


@pytest.mark.filterwarnings('ignore:.*unigram plateau')
def test_two_writers_of_one_run_the_second_is_refused(tmp_path, reference):
    from nl_embryo.pretrain import PretrainConfig, pretrain
    run = tmp_path/'run'; shutil.copytree(reference, run)
    entered, release, errors = threading.Event(), threading.Event(), []
    def slow(row):
        entered.set(); release.wait(60)
    def first():
        try: pretrain(PretrainConfig(out=str(run), steps=6, checkpoints='0,2,4,6', **MINI), resume=True, quiet=True, on_step=slow)
        except Exception as e: errors.append(e)
    t = threading.Thread(target=first); t.start()
    assert entered.wait(120)
    with pytest.raises(NlEmbryoError, match=r'another process \(\d+\) is writing the run'):
        pretrain(PretrainConfig(out=str(run), steps=6, checkpoints='0,2,4,6', **MINI), resume=True, quiet=True)
    release.set(); t.join(120)
    assert not errors, errors
    assert [json.loads(l)['step'] for l in (run/'metrics.jsonl').read_text().splitlines()] == list(range(7))
    assert not (run/'.nl_embryo.lock').exists()


# --- 7. charts under an address-space limit ------------------------------------------------------------------------------

def test_analyze_under_an_address_space_limit_skips_the_charts_and_writes_the_tables(tmp_path, reference):
    run = tmp_path/'run'; shutil.copytree(reference, run)
    limit = 6 * 2**30
    r = subprocess.run(nl_embryo_cmd('analyze', run, '--attention', '--steps', '0,4', '--quiet'), capture_output=True, text=True, timeout=600,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY)),
                       env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'charts skipped' in r.stderr and 'address-space limit of 6.0 GB' in r.stderr and r.stderr.count('charts skipped') == 1, r.stderr
    assert (run/'analysis'/'attention.parquet').exists() and not list((run/'analysis').glob('*.png'))


# --- 8-9. grids counted before they are expanded; zip bombs capped -------------------------------------------------------

@pytest.mark.parametrize('grid, said', [
    (''.join(f"p{i}: [{', '.join(str(j) for j in range(10))}]\n" for i in range(8)) + '#' * 7800, 'names 100,000,000 jobs'),   # 8 KB, 10^8 points
    (''.join(f"p{i}: [0,1,2,3,4,5,6,7,8,9]\n" for i in range(10)), 'names 10,000,000,000 jobs'),                               # 260 bytes, 10^10
    ('x: ' + '[' * 5000 + ']' * 5000 + '\n', 'more than 32 deep'),
])
def test_a_huge_or_deep_grid_is_refused_before_it_is_expanded(tmp_path, capsys, grid, said):
    g = tmp_path/'grid.yaml'; g.write_text(grid)
    nb = Path(__file__).parent/'fixtures'/'sweep_toy.ipynb'
    t0 = time.time()
    rc, out = cli(capsys, 'sweep', nb, '--grid', g, '--out', tmp_path/'sw', '--quiet')
    assert rc == 2 and said in out and 'Traceback' not in out and time.time() - t0 < 10, out
    assert not (tmp_path/'sw').exists() or not any((tmp_path/'sw').rglob('*.ipynb'))


def test_a_zip_bomb_is_refused_by_the_conversion_before_it_inflates(tmp_path, english_tokenizer):
    import zipfile, tracemalloc
    from nl_embryo.models import convert_to_safetensors
    folder = tiny_bert(tmp_path/'m', english_tokenizer); (folder/'model.safetensors').unlink()
    torch.save({'w': torch.zeros(10)}, tmp_path/'plain.bin')
    with zipfile.ZipFile(tmp_path/'plain.bin') as src, zipfile.ZipFile(folder/'pytorch_model.bin', 'w') as dst:
        for n in src.namelist():
            if '/data/' in n and src.getinfo(n).file_size == 40: dst.writestr(n, bytes(2**28), compress_type=zipfile.ZIP_DEFLATED)  # 256 MiB of zeros
            else: dst.writestr(src.getinfo(n), src.read(n))
    assert (folder/'pytorch_model.bin').stat().st_size < 8 * 2**20
    t0 = time.time(); tracemalloc.start()
    with pytest.raises(NlEmbryoError, match='its tensor declares 40'): convert_to_safetensors(folder, out=tmp_path/'conv')
    peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
    assert time.time() - t0 < 10 and peak < 64 * 2**20 and not (tmp_path/'conv'/'model.safetensors').exists()


# --- 10. what ended in a traceback ends in a message ---------------------------------------------------------------------

@pytest.mark.parametrize('flags, said', [
    (['--seed', '-1'], '--seed -1 is not a seed'), (['--seed', '1180591620717411303424'], 'is not a seed'),
    (['--checkpoints', 'linear:-5'], 'bad checkpoint spec'), (['--mask-split', '-10/100/10'], "written with '=': --mask-split=-VALUE"),
    (['--mask-split=-10/100/10'], 'bad mask split'),
])
def test_bad_pretrain_values_are_named_before_anything_is_written(tmp_path, capsys, flags, said):
    rc, out = cli_exit(capsys, 'pretrain', *CLI_MINI, '--steps', 2, *flags, '--out', tmp_path/'r', '--quiet')
    assert rc == 2 and said in out and 'Traceback' not in out, out
    assert not (tmp_path/'r').exists()


@pytest.mark.parametrize('flags, said', [(['--timeout', '1.2.3'], "timeout '1.2.3' is not a duration"),
                                         (['--slurm', '--gpus-per-job', '-1'], '--gpus-per-job -1 must be a whole number')])
def test_bad_sweep_values_are_named(tmp_path, capsys, flags, said):
    g = tmp_path/'grid.yaml'; g.write_text('seed: [0, 1]\n')
    rc, out = cli(capsys, 'sweep', Path(__file__).parent/'fixtures'/'sweep_toy.ipynb', '--grid', g, '--out', tmp_path/'sw', *flags)
    assert rc == 2 and said in out and 'Traceback' not in out, out
    assert not list((tmp_path/'sw').rglob('*.sbatch'))


def test_foreign_configs_and_tokenizers_that_do_not_load_are_named(tmp_path, capsys, english_tokenizer):
    pipe = tiny_bert(tmp_path/'pipe'/'step1', english_tokenizer)
    cfg = json.loads((pipe/'config.json').read_text()); cfg['architectures'] = ['pipeline']; (pipe/'config.json').write_text(json.dumps(cfg))
    rc, out = cli(capsys, 'analyze', tmp_path/'pipe', '--out', tmp_path/'o1', '--attention', '--quiet')
    assert rc == 2 and "does not name a transformers model class (architectures='pipeline')" in out and 'Traceback' not in out, out
    tk = tiny_bert(tmp_path/'tk'/'step1', english_tokenizer)
    t = json.loads((tk/'tokenizer.json').read_text()); t.pop('added_tokens'); (tk/'tokenizer.json').write_text(json.dumps(t))
    for f in ('vocab.txt',): (tk/f).unlink(missing_ok=True)
    rc, out = cli(capsys, 'analyze', tmp_path/'tk', '--out', tmp_path/'o2', '--attention', '--quiet')
    assert rc == 2 and 'the tokenizer files of' in out and 'Traceback' not in out, out


def test_bad_python_calls_are_named(tmp_path, reference):
    from nl_embryo.timeline import Run
    for bad in (123, None):
        with pytest.raises(NlEmbryoError, match='takes the path of a timeline'): Run(bad)
    run = Run(reference)
    if not torch.cuda.is_available():
        with pytest.raises(NlEmbryoError, match='no CUDA device is available'): run.load(0, device='cuda')
    with pytest.raises(NlEmbryoError, match='needs an analysis function'): run.map(None)
    n = lambda model, tok, data: __import__('pandas').DataFrame([dict(n=model.num_parameters())])
    assert list(run.map(n, steps='0,4', cache=False, progress=False)['step']) == [0, 4]          # steps as the command line writes them
    with pytest.raises(NlEmbryoError, match='is not a step or a list of steps'): run.map(n, steps='0,x', progress=False)
    copy = tmp_path/'run'; shutil.copytree(reference, copy)
    (copy/'metrics.jsonl').write_bytes(os.urandom(4096) + b'\n{"step": 0, "loss": 1.0}\n[1, 2]\n')
    assert list(Run(copy).metrics()['step']) == [0]                                          # binary lines skipped, not a traceback
    (copy/'config.json').write_text((copy/'config.json').read_text()[:40])
    with pytest.raises(NlEmbryoError, match='cannot be read .* cut short or garbled'): Run(copy).config


# --- 11. what was silent or misleading -----------------------------------------------------------------------------------

def test_verify_says_when_there_is_nothing_to_verify_against(tmp_path, capsys, reference):
    run = tmp_path/'run'; shutil.copytree(reference, run)
    for m in (run/'checkpoints').glob('step*/manifest.json'): m.unlink()
    w = run/'checkpoints'/'step4'/'model.safetensors'
    with open(w, 'r+b') as f: f.seek(w.stat().st_size - 64); f.write(bytes(16))
    rc, said = cli_exit(capsys, 'verify', run)
    assert rc == 1 and 'nothing to verify their bytes against' in said and 'checkpoint(s) verify' not in said, said


def test_corpus_add_names_utf16_text(tmp_path, capsys):
    f = tmp_path/'notes.txt'; f.write_bytes('First line of my notes.\nA second one.\n'.encode('utf-16'))
    rc, said = cli(capsys, 'corpus', 'add', 'utf16-notes', f)
    assert rc == 2 and 'is UTF-16 text (UTF-16LE)' in said and 'iconv -f UTF-16' in said and 'latin1' not in said, said
