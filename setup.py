"""Build nl_embryo from settings.ini (the nbdev 2.4 convention)."""
from configparser import ConfigParser
from pathlib import Path
import shlex
import setuptools

cfg = ConfigParser(delimiters=['='])
cfg.read(Path(__file__).with_name('settings.ini'), encoding='utf-8')
c = cfg['DEFAULT']
reqs = shlex.split(c.get('requirements', ''))
dev_reqs = shlex.split(c.get('dev_requirements', ''))
scripts = [s.strip() for s in c.get('console_scripts', '').split('\n') if s.strip()]

setuptools.setup(
    name=c['lib_name'], version=c['version'], description=c['description'],
    long_description=Path(__file__).with_name('README.md').read_text(encoding='utf-8') if Path(__file__).with_name('README.md').exists() else '',
    long_description_content_type='text/markdown',
    author=c['author'], license='Apache-2.0', url=c['git_url'],
    packages=setuptools.find_packages(include=[c['lib_name'], c['lib_name'] + '.*']),
    include_package_data=True, python_requires='>=' + c['min_python'],
    install_requires=reqs, extras_require={'dev': dev_reqs},
    entry_points={'console_scripts': scripts, 'nbdev': [f"{c['lib_path']}={c['lib_path']}._modidx:d"]},
    zip_safe=False,
)
