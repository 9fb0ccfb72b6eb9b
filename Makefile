# Two commands do all set-up on a fresh clone: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The default model: SqueezeNet from the ONNX model zoo, shipped inside the onnx package.
MODEL  ?= light:squeezenet
JOBS   ?= 2

.PHONY: run test install clean

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

clean:
	rm -rf $(VENV) build *.egg-info
