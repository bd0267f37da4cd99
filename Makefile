# `make demo` and `make test` create or reuse .venv and install everything they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.bnfold-installed

# torch: the CPU wheel these machines carry, the pair of executorch 1.5.1 (the core also takes torch 2.14).
TORCH_PIN := torch==2.13.0
# trained PaddleOCR .onnx models for the audit tests and the demo; --no-deps: only the model files are used, and
# their dependencies (opencv, shapely, ...) are not needed
RAPIDOCR := rapidocr==3.10.0 rapidocr-onnxruntime==1.4.4
# the model code users export, for the library zoo (tests/library_models.py, `make zoo`); --no-deps: torchvision's
# wheel would pull its own torch build (it is a CUDA build; tests/library_models.py says how it imports next to the
# CPU torch), and timm's other requirements come with the extras (safetensors only loads weights: not needed)
MODEL_CODE := timm==1.0.31 torchvision==0.28.0

# the core suite (all but tests/executorch) on the other torch release the core takes, in a venv of its own
TORCH_NEXT := torch==2.14.1
VENV_NEXT := .venv-torch214
MODEL_CODE_NEXT := timm==1.0.31 torchvision==0.29.1

.PHONY: demo test test-torch214 lint readme bench bench-update zoo install clean

# `make bench` writes here (ignored by git); `make bench-update` refreshes the committed tables.
BENCH_OUT := benchmarks/results/local

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_PIN)
	$(PY) -m pip install --quiet $(TORCH_PIN) -e '.[executorch,onnx,numerics,test]'
	$(PY) -m pip install --quiet --no-deps $(RAPIDOCR)
	$(PY) -m pip install --quiet --no-deps $(MODEL_CODE)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/bnfold demo

# two pytest-xdist workers (torch single-threaded in each, tests/conftest.py); worksteal: a worker that runs out of
# tests takes the other's remaining ones, so the long tests (the README, the library zoo) do not end the run alone
XDIST := -n 2 --dist worksteal

test: $(STAMP)
	$(PY) -m pytest -q $(XDIST) tests

# by hand, not in CI (README, "Quick start"): the torch 2.14.1 wheel is a CUDA build of several GB
test-torch214:
	test -x $(VENV_NEXT)/bin/python || $(PYTHON) -m venv $(VENV_NEXT)
	$(VENV_NEXT)/bin/python -m pip install --quiet $(TORCH_NEXT)
	$(VENV_NEXT)/bin/python -m pip install --quiet $(TORCH_NEXT) -e '.[onnx,numerics,test]'
	$(VENV_NEXT)/bin/python -m pip install --quiet --no-deps $(RAPIDOCR) $(MODEL_CODE_NEXT)
	$(VENV_NEXT)/bin/python -m pytest -q $(XDIST) --ignore=tests/executorch tests \
	  --deselect tests/readme/test_readme.py::test_the_readme_runs_as_written  # its ExecuTorch snippets need the extra

# ruff checks and format checks only: it never rewrites files (run `ruff format` yourself).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# rewrite the command outputs README.md shows with what the commands print now (tests/readme checks them)
readme: $(STAMP)
	$(PY) tests/readme/readme_blocks.py --update

bench: $(STAMP)
	$(PY) benchmarks/run_all.py --out $(BENCH_OUT)

bench-update: $(STAMP)
	$(PY) benchmarks/run_all.py

# torchvision's and timm's own classes folded in every IR and in ONNX, against their own deploy form: a table
zoo: $(STAMP)
	$(PY) benchmarks/model_zoo.py --jobs 2

clean:
	rm -rf $(VENV) $(VENV_NEXT) build *.egg-info src/*.egg-info .pytest_cache
