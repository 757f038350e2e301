"""What the notebooks show: their stored outputs (they are the docs pages) carry no machine paths, and those of the README
and the tutorials no warnings; every `nl-embryo` command the tutorials and the README's command block document exists as
written; and each tutorial runs top to bottom from a folder outside the checkout."""
import argparse, json, re, shlex, shutil, tempfile
from pathlib import Path

import pytest

from conftest import ROOT, cli

PAGES = [ROOT/'nbs'/'index.ipynb', *sorted((ROOT/'nbs'/'tutorials').glob('*.ipynb'))]   # the README source and the tutorials
NOTEBOOKS = sorted(p for p in (ROOT/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)   # every page of the docs
README_COMMANDS = 'e426ddef'   # the id of the README source's "## The command line" cell (nbs/index.ipynb)


def _text(o) -> str:
    "The text of a stored output: a stream's, or a display's text/plain and text/html."
    if o.get('output_type') == 'stream': parts = [o.get('text', '')]
    elif o.get('output_type') == 'error': parts = [o.get('evalue', ''), *o.get('traceback', [])]
    else: parts = [(o.get('data') or {}).get(m, '') for m in ('text/plain', 'text/html', 'text/markdown')]
    return ''.join(''.join(p) if isinstance(p, list) else p for p in parts)


def _machine_paths(text: str) -> list[str]:
    "The machine's paths in `text`: temporary folders (`/tmp/...`, `tmpXXXXXXXX`), the checkout's own path and the home folder."
    tmp = {'/tmp/', tempfile.gettempdir().rstrip('/') + '/', str(ROOT.resolve()) + '/', str(Path.home()) + '/'}
    return [t for t in tmp if t in text] + re.findall(r'\btmp[a-z0-9_]{8}\b', text)


def _stored_outputs(paths):
    "(where, text) for every stored output of the notebooks at `paths`: where names the notebook, the cell and its id."
    for nb_path in paths:
        for i, c in enumerate(json.loads(nb_path.read_text())['cells']):
            for o in c.get('outputs', []): yield f"{nb_path.relative_to(ROOT)} cell {i} ({c.get('id')})", _text(o)


def test_no_stored_output_carries_a_machine_path():
    "No notebook under nbs/ (chapters, tutorials, experiments, infra, the README) shows a temporary folder, the checkout's path or the home folder in a stored output."
    bad = [f"{where}: {sorted(set(found))}" for where, text in _stored_outputs(NOTEBOOKS) if (found := _machine_paths(text))]
    assert bad == [], '\n'.join(bad)


def test_no_stored_output_of_the_readme_and_tutorials_carries_a_warning():
    "The README and the tutorials show no `...Warning:` line."
    bad = [f"{where}: {sorted(set(found))}" for where, text in _stored_outputs(PAGES) if (found := re.findall(r'\w*Warning:', text))]
    assert bad == [], '\n'.join(bad)


def _documented():
    "(page, cell text, command line) for every `nl-embryo` command in the tutorials' markdown and the README's command block."
    cells = [(p.relative_to(ROOT).as_posix(), ''.join(c['source'])) for p in sorted((ROOT/'nbs'/'tutorials').glob('*.ipynb'))
             for c in json.loads(p.read_text())['cells'] if c['cell_type'] == 'markdown']
    index = json.loads((ROOT/'nbs'/'index.ipynb').read_text())['cells']
    cells += [('nbs/index.ipynb', ''.join(c['source'])) for c in index if c.get('id') == README_COMMANDS]
    out = []
    for page, text in cells:
        blocks = re.findall(r'```(?:sh|bash|console)\n(.*?)```', text, re.S)
        lines = [l.split('  #')[0].split(' # ')[0] for b in blocks for l in b.splitlines()]
        inline = re.findall(r'`(nl-embryo [^`]+)`', re.sub(r'```.*?```', '', text, flags=re.S).replace('\n  ', ' '))
        for line in lines + inline:
            m = re.search(r'(?:^|[\s(])nl-embryo\s+(.*)', line)
            if m: out.append((page, text, m.group(1).strip().rstrip(')')))
    return out


def _argv(command: str) -> list[str]:
    "The arguments of a documented command, placeholders filled: `[--out DIR]` -> `--out DIR`, `N` and `$VAR` -> 8, `...` dropped."
    command = re.sub(r'\[([^\]]*)\]', r'\1', command).replace('$SLURM_ARRAY_TASK_ID', '8')
    return ['8' if w == 'N' else w for w in shlex.split(command) if w not in ('...', 'NAME') and not w.endswith('...')]


def test_documented_commands_work_as_written(capsys):
    """Every documented `nl-embryo` command parses (its subcommand and every flag it uses exist: `make_parser`); those that
    read only the manifest run; and one on `runs/demo` asks for steps the demo keeps (its committed config's checkpoint
    steps) and for a probing task that parses with spaCy (`dep`, `spans`) only where the page says to fetch `spacy-en`
    first: `make demo` does not."""
    from nl_embryo.cli import make_parser
    from nl_embryo.demo import DEMO_SOURCES
    commands = _documented()
    pages = {page for page, _, _ in commands}
    assert len(commands) >= 20 and 'nbs/index.ipynb' in pages and 'nbs/tutorials/probing_timeline.ipynb' in pages, pages
    subcommands = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    kept = set(json.loads((ROOT/'nbs'/'data'/'demo'/'config.json').read_text())['checkpoint_steps'])
    bad = []
    for page, text, command in commands:
        argv = _argv(command)
        if '...' in command or len(argv) == 1:   # elided (`sweep ... --workers 8`) or named in prose: its subcommand and flags exist
            sub = subcommands.get(argv[0])
            flags = {o for a in sub._actions for o in a.option_strings} if sub else set()
            if not sub or {w for w in argv if w.startswith('-')} - flags: bad.append(f"{page}: nl-embryo {command}")
            continue
        try: a = make_parser().parse_args(argv)
        except SystemExit: bad.append(f"{page}: nl-embryo {command}"); continue
        if argv[:2] == ['analyze', 'runs/demo']:
            steps = {int(s) for s in (a.steps or '').split(',') if s.strip().isdigit()}
            if steps - kept: bad.append(f"{page}: nl-embryo {command}: the demo keeps no step {sorted(steps - kept)}")
            spacy = {'dep', 'spans'} & set((a.probes or '').split(','))
            if spacy and 'spacy-en' not in DEMO_SOURCES and 'data fetch spacy-en' not in text:
                bad.append(f"{page}: nl-embryo {command}: {sorted(spacy)} need spacy-en, which the page does not fetch")
    assert bad == [], bad
    for command, expect in [('data list', 'brown'), ('corpus list', 'english')]:   # documented, and cheap: run as written
        assert any(c == command for _, _, c in commands), command
        rc, out = cli(capsys, *command.split())
        assert rc in (0, None) and expect in out, out[-2000:]


TUTORIALS = sorted((ROOT/'nbs'/'tutorials').glob('*.ipynb'))


@pytest.mark.parametrize('name', [p.name for p in TUTORIALS])
def test_each_tutorial_runs_top_to_bottom_from_a_folder_outside_the_checkout(tmp_path, monkeypatch, name):
    """Each tutorial, copied to a temporary folder outside the checkout, runs every cell as `nbdev_test --flags slow` does
    (the `gpu` cells aside): its data comes from the data cache, a run it makes, or the checkout's stored tables found
    through the package (`checkout_path`), never from a path relative to nbs/. `tools/nbtest.py` leaves the tutorials
    to this test, so the suite runs each once."""
    import torch
    from nbdev.test import test_nb
    elsewhere = tmp_path/'elsewhere'; elsewhere.mkdir()
    assert not elsewhere.resolve().is_relative_to(ROOT.resolve())
    copy = Path(shutil.copy(ROOT/'nbs'/'tutorials'/name, elsewhere/name))
    monkeypatch.setenv('IN_TEST', '1'); monkeypatch.setenv('OMP_NUM_THREADS', '1')
    n = torch.get_num_threads(); torch.set_num_threads(1)          # two test workers on two cores
    try: ok, seconds = test_nb(copy, skip_flags=['gpu'], force_flags=['slow'], showerr=True)
    finally: torch.set_num_threads(n)
    assert ok, f"{name} failed when run from {elsewhere} (its traceback is above)"
