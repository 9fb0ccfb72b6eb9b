# Two commands do all set-up on a fresh clone: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The default model: SqueezeNet from the ONNX model zoo, shipped inside the onnx package.
MODEL  ?= light:squeezenet
JOBS   ?= 2
# `make fuzz N=1000`: N random graphs at every -O level, N/4 random int8 models, MUTANTS malformed
# files and tampered artifacts (tests/fuzz/); SEED replays a run (default: a new seed, printed)
N       ?= 200
MUTANTS ?= $(N)
SEED    ?=

.PHONY: run test fuzz install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/kiln run $(MODEL)

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) -q tests

fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz $(N) --mutants $(MUTANTS) $(if $(SEED),--seed $(SEED)) --out tests/fuzz/failures

clean:
	rm -rf $(VENV) build *.egg-info
