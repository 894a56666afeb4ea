# onmt-ext: setup, demo, tests.
#
#   make demo     prepare the shipped Tatoeba zh-en sample, train a small
#                 Transformer on the CPU, translate the test set, score it
#   make test     unit + integration tests (runs setup and data preparation first)
#   make smoke    train every config of yaml_configs/smoke/ for a few steps
#   make setup    create .venv with pinned packages (done by the two above)
#   make bench    speed/memory of the mechanisms against the baseline (CPU, smoke
#                 size; BENCH_ARGS="--size paper --gpu 0" for the paper size)
#   make reproduce-li2019-table2 (-table3, -table4-wmt14_ende, -table4-wmt17_zhen),
#        reproduce-cao2019-table1 (-table2-wmt17_zhen, -table2-wmt14_ende)
#                 train, translate and score a paper table on GPUS GPUs (default 1;
#                 gradient accumulation keeps the paper's batch); reproduce-li2019,
#                 reproduce-cao2019: all tables of a paper
#   make paper-configs  rewrite yaml_configs/<paper>/ from tools/paper_configs.py
#
# Variables: PYTHON (interpreter used to create the venv), VENV, TORCH (pip
# requirement for torch; pick your CUDA build here, e.g.
# TORCH="torch==2.13.0 --index-url <your torch index>"), GPUS, BENCH_ARGS.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DELETE_ON_ERROR:
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
ONMT_PY ?= OpenNMT-py==3.5.1
BIN := $(VENV)/bin
PY := $(BIN)/python
SETUP_STAMP := $(VENV)/.onmt-ext-setup

TATOEBA_SRC := data/tatoeba-zh-en
TATOEBA := build/tatoeba
DEMO_CONFIG := yaml_configs/demo/tatoeba_zhen.yaml
DEMO := build/demo
DEMO_STEPS := $(shell sed -n 's/^train_steps: *\([0-9]*\).*/\1/p' $(DEMO_CONFIG))
DEMO_MODEL := $(DEMO)/model_step_$(DEMO_STEPS).pt
SMOKE_CONFIGS := $(shell find yaml_configs/smoke -name '*.yaml' | sort)

GPUS ?= 1
BENCH_ARGS ?=
REPRODUCE_TABLES := li2019-table2 li2019-table3 li2019-table4-wmt14_ende li2019-table4-wmt17_zhen \
	cao2019-table1 cao2019-table2-wmt17_zhen cao2019-table2-wmt14_ende

.PHONY: help setup data demo test test-unit smoke bench paper-configs clean distclean \
	reproduce-li2019 reproduce-cao2019 $(addprefix reproduce-,$(REPRODUCE_TABLES))

help:
	@awk 'NR > 1 && !/^#/ {exit} NR > 1' Makefile | sed 's/^# \{0,1\}//'

# ---------------------------------------------------------------- setup
setup: $(SETUP_STAMP)

# torch first (pinned, overridable), then the exact versions of everything
# else, then OpenNMT-py without its torch<2.3 pin, then onmt-ext (editable)
# and its start-up hook.  A second run finds the stamp and does nothing.
$(SETUP_STAMP): requirements.txt pyproject.toml
	@echo "== setup: creating $(VENV) (torch: $(TORCH))"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(ONMT_PY)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(PY) -m onmt_ext.hook install
	$(PY) -c "import onmt, onmt_ext.plugin as p; assert p.is_active(), 'onmt-ext did not load'"
	touch $@

# ---------------------------------------------------------------- data
data: $(TATOEBA)/vocab.en

$(TATOEBA)/stats.json: Makefile tools/prepare_tatoeba.py $(TATOEBA_SRC)/cmn.txt $(TATOEBA_SRC)/zh2en.multiref.tsv | $(SETUP_STAMP)
	@echo "== data: splitting and segmenting the Tatoeba zh-en sample into $(TATOEBA)"
	$(PY) tools/prepare_tatoeba.py --data-dir $(TATOEBA_SRC) --out-dir $(TATOEBA) --zh-vocab 4000 --en-vocab 4000

# One vocabulary for the demo and every smoke config (they share the data section).
$(TATOEBA)/vocab.en: $(TATOEBA)/stats.json $(DEMO_CONFIG) | $(SETUP_STAMP)
	@echo "== data: building the vocabularies with onmt_build_vocab"
	$(BIN)/onmt_build_vocab -config $(DEMO_CONFIG) -n_sample -1 -overwrite -num_threads 2

# ---------------------------------------------------------------- demo
demo: $(DEMO)/report.txt
	@cat $<

$(DEMO_MODEL): $(TATOEBA)/vocab.en $(DEMO_CONFIG) | $(SETUP_STAMP)
	@echo "== demo: training (progress every 100 steps; about 8 minutes on 2 CPU cores)"
	mkdir -p $(DEMO)
	date +%s > $(DEMO)/train.start
	$(BIN)/onmt_train -config $(DEMO_CONFIG) -log_file $(DEMO)/train.log
	date +%s > $(DEMO)/train.end

$(DEMO)/test.hyp.en: $(DEMO_MODEL)
	@echo "== demo: translating $$(wc -l < $(TATOEBA)/test.zh) test sentences (beam 5)"
	date +%s > $(DEMO)/translate.start
	$(BIN)/onmt_translate -model $< -src $(TATOEBA)/test.zh -output $@ \
	  -beam_size 5 -batch_size 64 -batch_type sents -max_length 100 \
	  -transforms sentencepiece -src_subword_model $(TATOEBA)/spm.zh.model \
	  -tgt_subword_model $(TATOEBA)/spm.en.model -log_file $(DEMO)/translate.log
	date +%s > $(DEMO)/translate.end

$(DEMO)/report.txt: $(DEMO)/test.hyp.en tools/demo_report.py
	$(PY) tools/demo_report.py --demo-dir $(DEMO) --data-dir $(TATOEBA) > $@

# ---------------------------------------------------------------- tests
test: $(TATOEBA)/vocab.en | $(SETUP_STAMP)
	$(PY) -m pytest -q tests

test-unit: | $(SETUP_STAMP)
	$(PY) -m pytest -q tests/unit

smoke: $(TATOEBA)/vocab.en | $(SETUP_STAMP)
	@for c in $(SMOKE_CONFIGS); do \
	  echo "== smoke: $$c"; \
	  $(BIN)/onmt_train -config $$c -log_file_level WARNING || exit 1; \
	done

# ---------------------------------------------------------------- benchmark
BENCH_SUITES ?= li2019 cao2019

# the cost of cao2019's horizontal routing as the length grows, then every
# suite (each runs and reports even when an earlier one misses a target)
bench: $(TATOEBA)/vocab.en | $(SETUP_STAMP)
	$(PY) tools/layer_cost.py
	@status=0; for suite in $(BENCH_SUITES); do \
	  $(PY) tools/bench.py --suite $$suite $(BENCH_ARGS) || status=1; \
	done; exit $$status

# ---------------------------------------------------------------- paper tables
paper-configs:
	$(PYTHON) tools/paper_configs.py

reproduce-li2019: $(addprefix reproduce-,$(filter li2019-%,$(REPRODUCE_TABLES)))
reproduce-cao2019: $(addprefix reproduce-,$(filter cao2019-%,$(REPRODUCE_TABLES)))

$(addprefix reproduce-,$(REPRODUCE_TABLES)): reproduce-%: | $(SETUP_STAMP)
	$(PY) tools/reproduce.py $* --gpus $(GPUS)

# ---------------------------------------------------------------- cleaning
clean:
	rm -rf build

distclean: clean
	rm -rf $(VENV)
