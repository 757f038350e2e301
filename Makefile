# nl_embryo: the two set-up commands of the README live here.
#   make demo   -> create/update .venv, then run `nl-embryo demo`
#   make test   -> create/update .venv, then run the whole test suite (what CI runs)
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.nl_embryo-installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test env docs
env: $(STAMP)

$(STAMP): settings.ini setup.py constraints.txt
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/nl-embryo demo

test: $(STAMP)
	bash tools/test.sh

docs: $(STAMP)
	$(VENV)/bin/nl-embryo docs
