"""The shape of the package, read from its source: the module import graph has no cycle, no module imports another's
private name, and the science modules do not import the infrastructure (the sweep runner `batch`, the docs-site builder
`docs`) or the applications on top (`cli`, `demo`). The chapters keep nbdev's rhythm: no exported cell over 60 lines,
and every public definition followed by a line of prose and then an example that uses it."""
import ast, json, re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent/'nl_embryo'
CHAPTERS = sorted([*(PKG.parent/'nbs').glob('*.ipynb'), *(PKG.parent/'nbs'/'infra').glob('*.ipynb')])   # the library's notebooks
INFRASTRUCTURE = {'batch', 'docs'}
APPLICATIONS = {'cli', 'demo'}


def _imports():
    "{module: [(imported module, names)]} over every import of nl_embryo's modules, those inside functions included."
    out = {}
    for f in sorted(PKG.glob('*.py')):
        if f.name.startswith('_'): continue
        edges = []
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ''
                if node.level == 1 or mod.startswith('nl_embryo'):
                    target = mod.removeprefix('nl_embryo').lstrip('.') if node.level == 0 else mod
                    if target: edges.append((target.split('.')[0], [a.name for a in node.names]))
                    else: edges += [(a.name, []) for a in node.names]          # from . import x / from nl_embryo import x
            elif isinstance(node, ast.Import):
                edges += [(a.name.split('.')[1], []) for a in node.names if a.name.startswith('nl_embryo.')]
        out[f.stem] = edges
    return out


def test_the_import_graph_has_no_cycle():
    graph = {m: {t for t, _ in e if t != m} for m, e in _imports().items()}
    state = {}
    def visit(m, path):
        if state.get(m) == 'done': return
        assert state.get(m) != 'open', f"import cycle: {' -> '.join(path + [m])}"
        state[m] = 'open'
        for t in sorted(graph.get(m, ())): visit(t, path + [m])
        state[m] = 'done'
    for m in graph: visit(m, [])
    assert len(graph) > 20


def test_no_module_imports_a_private_name_of_another():
    bad = [(m, t, n) for m, e in _imports().items() for t, names in e for n in names if n.startswith('_') and t != m and n != '__version__']
    assert not bad, bad


def test_the_science_modules_import_no_infrastructure():
    imports = _imports()
    assert INFRASTRUCTURE | APPLICATIONS <= set(imports)
    bad = [(m, t) for m, e in imports.items() if m not in INFRASTRUCTURE | APPLICATIONS for t, _ in e if t in INFRASTRUCTURE | APPLICATIONS]
    assert not bad, f"science modules importing infrastructure or applications: {bad}"


def _exported(cell) -> bool:
    return cell['cell_type'] == 'code' and re.match(r'\s*#\|\s*export', ''.join(cell['source'])) is not None


def test_no_exported_cell_is_longer_than_60_lines():
    long = [(nb.name, len(''.join(c['source']).splitlines())) for nb in CHAPTERS for c in json.loads(nb.read_text())['cells']
            if _exported(c) and len(''.join(c['source']).splitlines()) > 60]
    assert not long, long


def rhythm_gaps(nb: Path) -> list:
    "(name, what is missing) for each public definition of `nb` whose exported cell is not followed by prose, then a cell using it."
    cells, gaps = json.loads(nb.read_text())['cells'], []
    for i, c in enumerate(cells):
        if not _exported(c): continue
        tree = ast.parse('\n'.join(l for l in ''.join(c['source']).splitlines() if not l.startswith(('#|', '%'))))
        for name in [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not n.name.startswith('_')]:
            prose, shown = False, None
            for c2 in cells[i + 1:]:
                if _exported(c2):
                    if prose: break
                    continue                                               # private helpers it calls may come first
                if c2['cell_type'] == 'markdown': prose = True
                elif re.search(rf'\b{re.escape(name)}\b', ''.join(c2['source'])): shown = prose; break
            if not shown: gaps.append((name, 'no example' if shown is None else 'no prose before its example'))
    return gaps


def test_every_public_definition_has_prose_and_an_example():
    gaps = {nb.relative_to(PKG.parent/'nbs').as_posix(): g for nb in CHAPTERS if (g := rhythm_gaps(nb))}
    assert len(CHAPTERS) > 25 and not gaps, gaps


def test_the_suites_schedules_name_files_that_exist():
    """The suite runs the longest notebooks and test files first, by the seconds `tools/nbtest.py` and `conftest.py`
    list: a renamed or deleted file there would silently lose its place in the order."""
    import sys
    sys.path.insert(0, str(PKG.parent/'tools'))
    import nbtest
    from conftest import FILE_SECONDS
    nbs, tests = PKG.parent/'nbs', PKG.parent/'tests'
    assert [k for k in nbtest.SECONDS if not (nbs/k).is_file()] == []
    assert [k for k in nbtest.FIRST if not (nbs/k).is_file()] == []
    assert [k for k in FILE_SECONDS if not (tests/k).is_file()] == []
    assert list(nbtest.SECONDS.values()) == sorted(nbtest.SECONDS.values(), reverse=True)


SITE = 'https://nl-embryo.github.io/nl_embryo/'
REFERENCES = {'Chiang and Lee 2020': 'chiang-lee-2020', 'Shao 2020': 'shao-2020', 'Chiang et al. 2020': 'chiang-et-al-2020',
              'Zhang 2021': 'zhang-2021', 'Nijkamp et al. 2021': 'nijkamp-et-al-2021'}


def test_the_papers_are_cited_by_name_and_linked_to_the_references_page():
    "No text cites a design document the repository lacks or a paper by a file number; every citation in a page's prose links its entry."
    root = PKG.parent
    texts = [*root.glob('nbs/**/*.ipynb'), *root.glob('nl_embryo/*.py'), *root.glob('tests/*.py'), *root.glob('bench/*.py'),
             *root.glob('tools/*'), root/'settings.ini', root/'README.md', root/'_quarto.yml']
    stale = [f"{p.relative_to(root)}: {m.group(0)}" for p in texts if p.is_file() and '.ipynb_checkpoints' not in str(p)
             for m in re.finditer(r'DESIGN §|\b[Pp]apers? 00[0-4]\b', p.read_text(encoding='utf-8', errors='replace')) if p.name != 'test_house.py']
    assert not stale, stale[:10]
    refs = (root/'nbs'/'references.ipynb').read_text(encoding='utf-8')
    assert all(f'<a id=\\"{a}\\"></a>' in refs and f'## {n}' in refs for n, a in REFERENCES.items())
    unlinked = []
    for nb in root.glob('nbs/**/*.ipynb'):
        if nb.name == 'references.ipynb' or '.ipynb_checkpoints' in str(nb): continue
        rel = '../' * (len(nb.relative_to(root/'nbs').parts) - 1)
        for cell in json.loads(nb.read_text(encoding='utf-8'))['cells']:
            if cell['cell_type'] != 'markdown': continue
            prose = ''.join(re.split(r'`[^`]*`', ''.join(cell['source']))[::2])          # outside code spans
            for name, anchor in REFERENCES.items():
                bare = prose.replace(f'[{name}]({rel}references.html#{anchor})', '')
                bare = bare.replace(f'[{name}]({SITE}references.html#{anchor})', '')   # the index is also the README: its links are the site's
                if name in bare: unlinked.append(f"{nb.relative_to(root)}: {name}")
    assert not unlinked, unlinked[:10]
