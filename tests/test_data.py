"""Fault tests for nl_embryo.data: checksums, unreachable registries, crash-safe cache entries, offline fetches, fetched
files that changed afterwards (named with the fix, told apart from touched ones).

Each test uses a throw-away cache (NL_EMBRYO_DATA) and a tiny manifest (NL_EMBRYO_MANIFEST) in tmp_path. The
registry is a fake client (a Python one-liner registered in `registry_commands`), so the tests need no network;
two optional tests drive the real npm client and are skipped when npm or the registry is not reachable.
"""
import hashlib, io, json, os, shutil, subprocess, sys, tarfile, zipfile

import pytest

from conftest import cli
from nl_embryo import data
from nl_embryo.core import NlEmbryoError

COPY = 'import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])'
FAIL = ('import sys; sys.stderr.write("npm error code ECONNREFUSED\\nnpm error network request to '
        'http://127.0.0.1:9/toy failed\\n"); sys.exit(1)')


def make_tgz(path, files: dict) -> str:
    "Write a .tgz holding `files` ({name: bytes}); its sha256."
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, 'w:gz') as t:
        for name, content in files.items():
            info = tarfile.TarInfo(name); info.size = len(content)
            t.addfile(info, io.BytesIO(content))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def toml_source(**kw) -> str:
    lines = ['[[source]]']
    for k, v in kw.items():
        lines.append(f'{k} = {json.dumps(v)}')  # JSON strings, lists and booleans are valid TOML
    return '\n'.join(lines) + '\n'


@pytest.fixture
def toy(tmp_path, monkeypatch):
    "A fake registry serving toy-1.0.tgz, an empty cache and a one-source manifest; returns a helper namespace."
    cache = tmp_path/'cache'
    monkeypatch.setenv('NL_EMBRYO_DATA', str(cache))
    art = tmp_path/'registry'/'toy-1.0.tgz'
    sha = make_tgz(art, {'package/data/a.txt': b'hello\n', 'package/data/b.txt': b'world\n', 'package/README': b'x'})
    monkeypatch.setitem(data.registry_commands, 'fake', lambda src, dest: [sys.executable, '-c', COPY, str(art), src['filename']])
    monkeypatch.setitem(data.registry_commands, 'down', lambda src, dest: [sys.executable, '-c', FAIL])

    def manifest(**over):
        src = dict(name='toy', registry='fake', package='toy', version='1.0', filename='toy-1.0.tgz', sha256=sha,
                   members=['package/data/*.txt'], description='a toy source', default=True)
        src.update(over)
        p = tmp_path/'manifest.toml'
        p.write_text(toml_source(**src))
        monkeypatch.setenv('NL_EMBRYO_MANIFEST', str(p))
        return p

    class T: pass
    t = T(); t.cache, t.art, t.sha, t.manifest, t.tmp = cache, art, sha, manifest, tmp_path
    return t


def leftovers(cache):
    "The files under the cache but the lock files (there must be no entry and no download after a failure)."
    if not cache.exists(): return []
    return sorted(str(p.relative_to(cache)) for p in cache.rglob('*') if p.is_file() and '.locks' not in p.parts)


def test_fetch_unpacks_members_and_stamps(toy):
    toy.manifest()
    paths = data.fetch()
    entry = paths['toy']
    assert entry == toy.cache/'sources'/'toy' and data.fetched_path('toy') == entry
    assert (entry/'package/data/a.txt').read_text() == 'hello\n'
    assert not (entry/'package/README').exists()  # not a member
    stamp = json.loads((entry/'.complete.json').read_text())
    assert stamp['sha256'] == toy.sha and stamp['version'] == '1.0' and stamp['files'] == 2
    assert leftovers(toy.cache/'downloads') == []  # the checked download is removed after unpacking
    assert [p.name for p in (toy.cache/'sources').iterdir()] == ['toy']  # no temporary folders left


def test_second_fetch_is_a_no_op(toy, monkeypatch):
    toy.manifest()
    first = data.fetch(['toy'])
    def no_subprocess(*a, **k): raise AssertionError('a complete entry must not run any client')
    monkeypatch.setattr(subprocess, 'run', no_subprocess)
    monkeypatch.setattr(subprocess, 'Popen', no_subprocess)
    assert data.fetch(['toy']) == first
    assert data.fetch('toy', quiet=True) == first


def test_wrong_checksum_leaves_nothing(toy):
    toy.manifest(sha256='0' * 64)
    with pytest.raises(NlEmbryoError) as e:
        data.fetch(['toy'])
    msg = str(e.value)
    assert "checksum mismatch for data source 'toy'" in msg and '0' * 64 in msg and toy.sha in msg
    assert 'fix:' in msg and 'deleted' in msg
    assert leftovers(toy.cache) == []
    assert not (toy.cache/'sources'/'toy').exists()
    assert data.data_status().set_index('name').loc['toy', 'status'] == 'missing'


def test_unreachable_registry_leaves_nothing(toy):
    toy.manifest(registry='down')
    with pytest.raises(NlEmbryoError) as e:
        data.fetch(['toy'])
    msg = str(e.value)
    assert "fetching data source 'toy' failed" in msg and 'exited with status 1' in msg
    assert 'ECONNREFUSED' in msg                              # the client's last stderr lines
    assert sys.executable in msg                              # the command that was run
    assert 'check network access' in msg and str(toy.cache/'downloads'/'toy-1.0.tgz') in msg  # what to do
    assert leftovers(toy.cache) == []


def test_missing_client(toy, monkeypatch):
    monkeypatch.setitem(data.registry_commands, 'fake', lambda src, dest: ['nl-embryo-no-such-client', 'x'])
    toy.manifest()
    with pytest.raises(NlEmbryoError, match='is not installed'):
        data.fetch(['toy'])
    assert leftovers(toy.cache) == []


def test_download_placed_by_hand_needs_no_client(toy):
    "Offline: a checked artifact in downloads/ is unpacked without calling the (unreachable) registry."
    toy.manifest(registry='down')
    (toy.cache/'downloads').mkdir(parents=True)
    shutil.copy(toy.art, toy.cache/'downloads'/'toy-1.0.tgz')
    entry = data.fetch(['toy'])['toy']
    assert (entry/'package/data/b.txt').read_text() == 'world\n'


def test_half_unpacked_entry_is_missing_and_refetched(toy):
    toy.manifest()
    entry = toy.cache/'sources'/'toy'
    (entry/'package'/'data').mkdir(parents=True)
    (entry/'package'/'data'/'a.txt').write_text('hal')  # a crash mid-unpack: no .complete.json
    (toy.cache/'sources'/'.toy.tmp-dead1234').mkdir()  # what a killed unpack leaves
    (toy.cache/'downloads'/'.tmp-toy-dead1234').mkdir(parents=True)  # what a killed download leaves
    assert not data.is_fetched('toy')
    assert data.data_status().set_index('name').loc['toy', 'status'] == 'missing'
    with pytest.raises(NlEmbryoError, match='nl-embryo data fetch toy'):
        data.fetched_path('toy')
    data.fetch(['toy'])
    assert (entry/'package/data/a.txt').read_text() == 'hello\n' and (entry/'.complete.json').exists()
    assert [p.name for p in (toy.cache/'sources').iterdir()] == ['toy'] and not any((toy.cache/'downloads').iterdir())


def test_stale_entry_is_refetched(toy):
    "An entry stamped for another version (the manifest changed) counts as missing."
    toy.manifest()
    entry = data.fetch(['toy'])['toy']
    stamp = json.loads((entry/'.complete.json').read_text())
    stamp['sha256'] = 'f' * 64
    (entry/'.complete.json').write_text(json.dumps(stamp))
    assert not data.is_fetched('toy')
    with pytest.raises(NlEmbryoError, match='fetched for another version'):
        data.fetched_path('toy')
    data.fetch(['toy'])
    assert json.loads((entry/'.complete.json').read_text())['sha256'] == toy.sha


def test_concurrent_fetches_take_turns(toy):
    "Parallel fetches of one source (threads here, processes in parallel tests) give one complete entry."
    from concurrent.futures import ThreadPoolExecutor
    toy.manifest()
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda _: data.fetch(['toy'], quiet=True)['toy'], range(4)))
    assert len(set(results)) == 1 and data.is_fetched('toy')
    assert [p.name for p in (toy.cache/'sources').iterdir()] == ['toy'] and leftovers(toy.cache/'downloads') == []


def test_data_status(toy):
    p = toy.manifest()
    p.write_text(p.read_text() + toml_source(name='extra', registry='fake', package='toy', version='1.0',
                                             filename='toy-1.0.tgz', sha256=toy.sha, members=['package/README']))
    st = data.data_status().set_index('name')
    assert st.loc['toy', 'status'] == 'missing' and st.loc['extra', 'status'] == 'registered'
    assert list(st.columns) == ['registry', 'package', 'version', 'default', 'optional', 'status', 'bytes', 'size', 'path']
    data.fetch()  # the default set: toy only
    st = data.data_status().set_index('name')
    assert st.loc['toy', 'status'] == 'fetched' and st.loc['toy', 'bytes'] > 0 and st.loc['extra', 'status'] == 'registered'


def test_member_pattern_that_matches_nothing(toy):
    toy.manifest(members=['package/data/*.txt', 'package/nothing/*'])
    with pytest.raises(NlEmbryoError, match=r"package/nothing/\*"):
        data.fetch(['toy'])
    assert not (toy.cache/'sources'/'toy').exists()


def test_unknown_names_fail_before_fetching(toy):
    toy.manifest()
    with pytest.raises(NlEmbryoError, match="'nope' is not registered"):
        data.fetch(['toy', 'nope'])
    assert leftovers(toy.cache) == []


@pytest.mark.parametrize('bad, match', [
    (dict(sha256='abc'), 'not 64 lowercase hex'),
    (dict(registry='cran'), 'unknown registry'),
    (dict(members=None), 'missing members'),
    (dict(name='Bad Name'), 'bad or missing name'),
])
def test_manifest_validation(toy, bad, match):
    src = dict(name='toy', registry='fake', package='toy', version='1.0', filename='toy-1.0.tgz', sha256=toy.sha,
               members=['package/data/*.txt'])
    src.update(bad)
    p = toy.tmp/'bad.toml'
    p.write_text(toml_source(**{k: v for k, v in src.items() if v is not None}))
    with pytest.raises(NlEmbryoError, match=match) as e:
        data.load_manifest(p)
    assert str(p) in str(e.value)


def test_wheel_inner_archive_and_kept_artifact(toy, monkeypatch):
    "A wheel (zip) source with an inner tarball unpacked in place, keeping the wheel itself in the entry."
    inner = toy.tmp/'inner.tar.gz'
    make_tgz(inner, {'corpus/x.txt': b'inner text'})
    whl = toy.tmp/'registry'/'toy-1.0-py3-none-any.whl'
    with zipfile.ZipFile(whl, 'w') as z:
        z.writestr('toy/res/inner.tar.gz', inner.read_bytes()); z.writestr('toy/__init__.py', '')
    sha = hashlib.sha256(whl.read_bytes()).hexdigest()
    monkeypatch.setitem(data.registry_commands, 'fake', lambda src, dest: [sys.executable, '-c', COPY, str(whl), src['filename']])
    toy.manifest(filename=whl.name, sha256=sha, members=['toy/res/**'], inner=['toy/res/inner.tar.gz'], keep_artifact=True)
    entry = data.fetch(['toy'])['toy']
    assert (entry/'toy/res/corpus/x.txt').read_text() == 'inner text'
    assert (entry/whl.name).exists() and not (entry/'toy/__init__.py').exists()
    assert leftovers(toy.cache/'downloads') == []


def test_debian_package(toy, monkeypatch):
    "A .deb (an ar archive with data.tar.xz) is unpacked by streaming its data member."
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode='w:xz') as t:
        for name, content in {'./usr/share/toy/seqs.txt': b'MKV\n', './usr/share/doc/toy/copyright': b'GPL'}.items():
            info = tarfile.TarInfo(name); info.size = len(content); t.addfile(info, io.BytesIO(content))
    def member(name, content):
        hdr = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(content):<10}`\n".encode()
        return hdr + content + (b'\n' if len(content) % 2 else b'')
    deb = toy.tmp/'registry'/'toy_1.0_all.deb'
    deb.write_bytes(b'!<arch>\n' + member('debian-binary', b'2.0\n') + member('control.tar.xz', b'') +
                    member('data.tar.xz', payload.getvalue()))
    sha = hashlib.sha256(deb.read_bytes()).hexdigest()
    monkeypatch.setitem(data.registry_commands, 'fake', lambda src, dest: [sys.executable, '-c', COPY, str(deb), src['filename']])
    toy.manifest(filename=deb.name, sha256=sha, members=['usr/share/toy/*'])
    entry = data.fetch(['toy'])['toy']
    assert (entry/'usr/share/toy/seqs.txt').read_bytes() == b'MKV\n' and not (entry/'usr/share/doc').exists()


@pytest.mark.parametrize('loader, name', [
    (data.load_brown_tagged, 'brown'), (data.load_sotu, 'sotu'), (data.load_turkish_ud, 'turkish'),
    (data.load_proteins, 'protein-small'), (data.load_talmud_sentences, 'talmud'),
])
def test_loaders_name_the_fetch_command(toy, loader, name):
    "With the real manifest and an empty cache, a loader says how to fetch its source."
    with pytest.raises(NlEmbryoError, match=f'nl-embryo data fetch {name}'):
        loader()


# --- the real npm client (skipped without npm or without the registry) ---------------------------------------

def _npm_source(toy, **over):
    toy.manifest(name='isnum', registry='npm', package='is-number', version='7.0.0', filename='is-number-7.0.0.tgz',
                 members=['package/index.js'], **over)


@pytest.mark.skipif(shutil.which('npm') is None, reason='npm is not installed')
def test_real_npm_unreachable_registry(toy, monkeypatch):
    monkeypatch.setitem(data.registry_commands, 'npm', lambda src, dest: [
        'npm', 'pack', f"{src['package']}@{src['version']}", '--pack-destination', str(dest),
        '--registry', 'http://127.0.0.1:9/', '--fetch-retries', '0'])
    _npm_source(toy)
    with pytest.raises(NlEmbryoError) as e:
        data.fetch(['isnum'])
    assert "fetching data source 'isnum' failed" in str(e.value) and '127.0.0.1:9' in str(e.value)
    assert leftovers(toy.cache) == []


@pytest.mark.skipif(shutil.which('npm') is None, reason='npm is not installed')
def test_real_npm_wrong_checksum(toy):
    _npm_source(toy, sha256='1' * 64)
    with pytest.raises(NlEmbryoError) as e:
        data.fetch(['isnum'])
    if 'checksum mismatch' not in str(e.value): pytest.skip(f'npm registry not reachable: {e.value}')
    assert '1' * 64 in str(e.value)
    assert leftovers(toy.cache) == []


# --- fetched data that changed ------------------------------------------------------------------------------------

@pytest.fixture
def toy_source(tmp_path, monkeypatch):
    "A source fetched into a temporary data cache (NL_EMBRYO_DATA) from a zip placed in downloads/, so nothing is downloaded."
    import hashlib, zipfile
    cache = tmp_path/'cache'; (cache/'downloads').mkdir(parents=True)
    art = cache/'downloads'/'toy-1.0.zip'
    with zipfile.ZipFile(art, 'w') as z:
        z.writestr('toy/a.txt', 'alpha\n'); z.writestr('toy/sub/b.txt', 'beta\n'); z.writestr('other/c.txt', 'not kept\n')
    sha = hashlib.sha256(art.read_bytes()).hexdigest()
    toml = tmp_path/'manifest.toml'
    toml.write_text(f'[[source]]\nname = "toy"\nregistry = "pypi"\npackage = "toy"\nversion = "1.0"\nfilename = "toy-1.0.zip"\n'
                    f'sha256 = "{sha}"\nmembers = ["toy/*"]\n')
    monkeypatch.setenv('NL_EMBRYO_DATA', str(cache)); monkeypatch.setenv('NL_EMBRYO_MANIFEST', str(toml))
    from nl_embryo.data import fetch
    shutil.copy(art, tmp_path/'toy-1.0.zip')                               # fetch removes the artifact it unpacked
    return fetch(['toy'], quiet=True)['toy']


def test_a_changed_fetched_file_is_named_with_the_fix(toy_source, capsys):
    from nl_embryo.data import fetched_path, fetch, data_status, verify_data, FILE_MANIFEST
    listed = json.loads((toy_source/FILE_MANIFEST).read_text())['files']
    assert set(listed) == {'toy/a.txt', 'toy/sub/b.txt'} and all(len(v['sha256']) == 64 for v in listed.values())
    assert fetched_path('toy') == toy_source and verify_data(['toy'])['status'].tolist() == ['ok']
    (toy_source/'toy'/'sub'/'b.txt').write_text('BETA\n')                     # same size, new mtime: the cheap check sees it
    for call in (lambda: fetched_path('toy'), lambda: fetch(['toy'], quiet=True)):
        with pytest.raises(NlEmbryoError, match=r"data source 'toy' changed since it was fetched .*toy/sub/b.txt was modified") as e: call()
        assert '`nl-embryo data fetch toy --force`' in e.value.fix
    assert data_status().set_index('name').loc['toy', 'status'] == 'changed'
    rc, err = cli(capsys, 'data', 'verify', 'toy')
    assert rc == 2 and 'toy/sub/b.txt changed (its sha256 differs' in err and '`nl-embryo data fetch toy --force`' in err
    shutil.copy(toy_source.parent.parent.parent/'toy-1.0.zip', toy_source.parent.parent/'downloads')   # offline: the artifact by hand
    fetch(['toy'], force=True, quiet=True)                                     # the fix
    assert fetched_path('toy') == toy_source and (toy_source/'toy'/'sub'/'b.txt').read_text() == 'beta\n'


def test_full_check_tells_a_touched_file_from_a_changed_one(toy_source):
    from nl_embryo.data import source_changes
    a = toy_source/'toy'/'a.txt'
    os.utime(a, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns + 10**9))       # touched, not changed
    assert source_changes('toy') == ['toy/a.txt was modified after the fetch'] and source_changes('toy', full=True) == []
    a.write_text('ALPHA\n')
    assert source_changes('toy', full=True) == ["toy/a.txt changed (its sha256 differs from the fetched file's)"]
    a.unlink()
    assert source_changes('toy') == ['toy/a.txt is missing']


@pytest.mark.parametrize('order', [('package/x', 'package/x/y'), ('package/x/y', 'package/x')])
def test_an_archive_with_a_file_and_a_folder_of_one_name(toy, order):
    "`pkg/x` both a file and a folder: named with the fix, and the entry fetched before is left as it was."
    toy.manifest(members=['package/**'])
    entry = data.fetch(['toy'], quiet=True)['toy']
    before = {p.relative_to(entry): p.read_bytes() for p in entry.rglob('*') if p.is_file()}
    sha = make_tgz(toy.art, {name: b'data' for name in order})
    toy.manifest(members=['package/**'], sha256=sha)
    with pytest.raises(data.NlEmbryoError) as e: data.fetch(['toy'], force=True, quiet=True)
    assert 'toy-1.0.tgz holds a file and a folder of the same name (package/x' in e.value.problem
    assert 'check its package, version and filename' in e.value.fix
    assert {p.relative_to(entry): p.read_bytes() for p in entry.rglob('*') if p.is_file()} == before


def test_pretrain_fetches_the_sources_its_corpus_reads(tmp_path, monkeypatch, capsys):
    "On a fresh clone (an empty cache) `nl-embryo pretrain --corpus english` fetches brown and sotu first, as the demo does."
    import nl_embryo.pretrain as P
    monkeypatch.setenv('NL_EMBRYO_DATA', str(tmp_path/'cache'))            # nothing fetched, nothing built
    asked = []
    def fake_fetch(names, quiet=False, **kw):
        asked.append((list(names), quiet))
        raise NlEmbryoError('stopped after the fetch', 'this test fetches nothing')   # the real data is in the project's cache
    monkeypatch.setattr(P, 'fetch', fake_fetch)
    rc, out = cli(capsys, 'pretrain', '--corpus', 'english', '--preset', 'mini', '--steps', 2, '--out', tmp_path/'run')
    assert asked == [(['brown', 'sotu'], False)] and rc == 2 and 'stopped after the fetch' in out and 'is not fetched' not in out


def test_processes_that_ask_for_one_corpus_at_once_build_it_once(tmp_path):
    """Two processes (a sweep's workers on a fresh machine, say) build the same corpus at the same moment: one builds it,
    the other waits for it (saying so) and reads its build; both get the same blocks. Each build is slowed (its packing
    sleeps, and both start it together once both have imported) so that the second arrives while the first is building."""
    from nl_embryo.core import data_dir
    cache = tmp_path/'cache'; cache.mkdir()
    (cache/'tokenizers').symlink_to(data_dir()/'tokenizers')        # the English tokenizer the artificial corpora use
    script = tmp_path/'build.py'
    script.write_text(
        "import time, sys\n"
        "from pathlib import Path\n"
        "import nl_embryo.corpora as C\n"
        "real = C.pack_blocks\n"
        "def slow(*a, **k): print('packing', flush=True); time.sleep(1.5); return real(*a, **k)\n"
        "C.pack_blocks = slow\n"
        "open(sys.argv[1], 'w').close()\n"                                       # ready; then start together
        "while len(list(Path(sys.argv[1]).parent.glob('ready-*'))) < 2: time.sleep(0.01)\n"
        "pc = C.build_corpus('random', block_size=32, n_tokens=50_000)\n"
        "print('blocks', int(pc.train.sum()), len(pc.train))\n")
    env = {**os.environ, 'NL_EMBRYO_DATA': str(cache), 'OMP_NUM_THREADS': '1'}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path/f'ready-{i}')], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sum(o.count('packing') for o in outs) == 2, outs                  # one build: its train and eval packing, once
    assert sum("waiting for another process to finish building corpus 'random'" in o for o in outs) == 1, outs
    blocks = [next(l for l in o.splitlines() if l.startswith('blocks')) for o in outs]
    assert blocks[0] == blocks[1], blocks
    assert [p.name for p in (cache/'corpora').iterdir() if not p.name.startswith('.')] == ['random-b32-v8000-n50000-s0']
