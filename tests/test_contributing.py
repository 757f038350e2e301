"""The contributing chapter, followed literally: its OPT entry (an architecture nl_embryo does not ship: one
`Architecture` with a config builder and a parts map, taken from the chapter's own cell) pre-trains and gets every
default analysis, surgery included; an entry without a builder or a parts map is refused, naming what is missing."""
import json, warnings
from pathlib import Path

import pytest

from nl_embryo.core import NlEmbryoError

CHAPTER = Path(__file__).resolve().parent.parent/'nbs'/'19_contributing.ipynb'
SMALL = dict(probes=dict(n_words=300), attention=dict(n_sentences=24, map_len=16), reconstruction=dict(per_group=12), minimal_pairs=dict(max_pairs=4),
             icl=dict(n_blocks=8), similarity=dict(n_blocks=8, n_tokens=128, n_boot=10))


def chapter_cell(marker: str) -> str:
    "The source of the one cell of the contributing chapter that holds `marker`."
    cells = [''.join(c['source']) for c in json.loads(CHAPTER.read_text())['cells'] if marker in ''.join(c['source'])]
    assert len(cells) == 1, f"{len(cells)} cells hold {marker!r}"
    return cells[0]


@pytest.fixture
def opt_entry():
    "The chapter's OPT entry, registered by running its cell; removed afterwards."
    from nl_embryo.architectures import ARCHITECTURES, PARTS
    ns = {}
    exec(chapter_cell('def opt_config('), ns)
    yield ns['OPT']
    ARCHITECTURES.pop('opt', None); PARTS.pop('opt', None)


@pytest.mark.usefixtures('one_torch_thread')
def test_the_chapter_s_opt_entry_trains_and_gets_every_default_analysis(tmp_path, small_corpus, opt_entry):
    from nl_embryo.analysis import analyses, analyze
    from nl_embryo.pretrain import PretrainConfig, pretrain
    from nl_embryo.timeline import Run
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        run = Run(pretrain(PretrainConfig(out=str(tmp_path/'opt'), arch='opt', preset='mini', corpus='nested-zipf', corpus_tokens=40_000, block_size=32,
                                          batch_size=8, steps=4, checkpoints='0,4', eval_batches=1, position_init='sinusoidal'), quiet=True))
    assert run.model_config()['architectures'] == ['OPTForCausalLM'] and run.is_causal()
    ran = {}
    for name, a in analyses().items():
        if not a.default: continue
        df = analyze(run, name, progress=False, charts=False, **SMALL.get(name, {}))
        ran[name] = sorted(df['step'].unique())
    assert set(ran) == {'probes', 'reconstruction', 'attention', 'knowledge', 'surgery', 'weights', 'syntax_heads', 'minimal_pairs', 'icl', 'similarity'} and all(s == [0, 4] for s in ran.values()), ran
    surgery = run.table('surgery')
    assert {'reverse', 'clean:block1', 'remove:1'} <= set(surgery['surgery'])          # the interventions found its layers through its parts map


def test_an_incomplete_entry_is_refused_naming_what_is_missing():
    from nl_embryo.architectures import ARCHITECTURES, Architecture, PartsMap, register_architecture
    from nl_embryo.models import build_model
    for entry, said in [(Architecture('opt', 'clm', family='causal'), "architecture 'opt' has no config builder"),
                        (Architecture('opt', 'clm', 'nl_embryo.models:gpt2_config', family='causal'), "architecture 'opt' has no parts map"),
                        (Architecture('deberta', 'mlm'), "architecture 'deberta' has no config builder")]:
        with pytest.raises(NlEmbryoError, match=said): register_architecture(entry)
        assert entry.name not in ARCHITECTURES
    with pytest.raises(NlEmbryoError, match="unknown architecture 'opt'"): build_model('opt', 'mini')
    # a builder that makes a model type its parts map does not name is refused when it builds
    register_architecture(Architecture('gpt2-mislabelled', 'clm', 'nl_embryo.models:gpt2_config', family='causal',
                                       parts={'not-gpt2': PartsMap(layers='h', word='wte', position='wpe', attention='attn', final_norm='ln_f')}))
    try:
        with pytest.raises(NlEmbryoError, match=r"architecture 'gpt2-mislabelled': its builder makes a GPT2LMHeadModel of model type 'gpt2', which its parts map does not name"):
            build_model('gpt2-mislabelled', 'mini', vocab_size=200)
    finally:
        from nl_embryo.architectures import PARTS
        ARCHITECTURES.pop('gpt2-mislabelled'); PARTS.pop('not-gpt2', None)
