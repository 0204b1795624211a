#!/usr/bin/env bash
# Build ortpack's images: `images/build.sh [serve] [serve-slim] [component] [steps]` (all by
# default), as `make images` does, printing each tag on stdout. Fails (non-zero, one line on stderr)
# when an image could not be built; never "skips".
#   serve       ortpack-serve:<version>: the server with signature verification and oci:// pulls
#   serve-slim  ortpack-serve:<version>-slim: the server without them (docs/images.md)
#   component   ortpack-component:<version>: every pipeline step, PyTorch included
#   steps       ortpack-steps:<version>: the pipeline steps that need no PyTorch
#
# Chosen here, each overridable from the environment:
#   ENGINE      docker when a Docker engine answers, else podman (installed with apt-get when
#               missing and this is root on Debian/Ubuntu); podman runs with images/containers.conf.
#   BASE_IMAGE  the component image's base: its Dockerfile's default (the public Python slim image)
#               when the engine has it or can pull it; else a local Debian bookworm base made once
#               with debootstrap (localhost/ortpack-base:bookworm, images/base.sh).
#   SERVE_BASE  the build stage of the serving and steps images, whose Debian packages make their
#               root (images/rootfs.py): debian:bookworm-slim when it can be had, else the same
#               local base.
#   ARCH        a Debian architecture to build for (default this machine's): another one, e.g.
#               arm64, is built under emulation (qemu-user-static under binfmt) and tagged -ARCH.
#   NUMPY       Dockerfile.serve's numpy: noblas (default) or wheel (e.g. under emulation, where
#               building numpy takes long).
#   TORCH       cpu when PyTorch's CPU wheel index answers, else pypi (the CUDA build; see
#               Dockerfile.component).
#   PIP_CA      a CA bundle handed to pip as the build secret `pip_ca` (default: the system bundle,
#               when present), for package indexes behind a proxy with its own CA.
#   IMAGE_REPO  tag prefix (default ghcr.io/ortpack): <IMAGE_REPO>/ortpack-{serve,component}:<version>
#   FLAVOUR     cpu (default) or gpu (tags get -gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
here=images
# shellcheck source=images/engine.sh
source "$here/engine.sh"

IMAGE_REPO=${IMAGE_REPO:-ghcr.io/ortpack}
FLAVOUR=${FLAVOUR:-cpu}
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
PUBLIC_BASE=python:3.11.11-slim-bookworm
DEBIAN_BASE=debian:bookworm-slim
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' ortpack/__init__.py)
suffix=$([ "$FLAVOUR" = gpu ] && echo -gpu || true)
which=("$@")
[ ${#which[@]} -gt 0 ] || which=(serve serve-slim component steps)

ensure_engine

native=$(dpkg --print-architecture 2>/dev/null || echo amd64)
platform=()
if [ -n "${ARCH:-}" ] && [ "$ARCH" != "$native" ]; then
    platform=(--platform "linux/$ARCH")  # built under emulation (qemu-user-static, images/base.sh)
    suffix="$suffix-$ARCH"
fi
export ARCH=${ARCH:-$native}

pick_base() {  # pick_base PUBLIC: PUBLIC when the engine has it (native ARCH) or can pull it, else the local base
    if { [ "$ARCH" = "$native" ] && $ENGINE image inspect "$1" >/dev/null 2>&1; } \
        || timeout 120 $ENGINE pull -q "${platform[@]}" "$1" >/dev/null 2>&1; then
        echo "$1"
    else
        echo "images: $1 ($ARCH) cannot be pulled here: using a local Debian bookworm base (images/base.sh)" >&2
        "$here/base.sh"
    fi
}
needs() { [[ " ${which[*]} " == *" $1 "* ]]; }
if [ -z "${BASE_IMAGE:-}" ] && needs component; then
    BASE_IMAGE=$(pick_base "$PUBLIC_BASE")
fi
if [ -z "${SERVE_BASE:-}" ] && { needs serve || needs serve-slim || needs steps; }; then
    SERVE_BASE=$(pick_base "$DEBIAN_BASE")
fi

if [ -z "${TORCH:-}" ] && needs component; then
    if curl -fsS -o /dev/null --max-time 15 "$TORCH_CPU_INDEX/torch/"; then
        TORCH=cpu
    else
        TORCH=pypi
        echo "images: PyTorch's CPU wheel index ($TORCH_CPU_INDEX) does not answer: the component image" \
            "takes torch from the package index (the CUDA build, ~5 GB more)" >&2
    fi
fi

secret=()
PIP_CA=${PIP_CA-/etc/ssl/certs/ca-certificates.crt}
if [ -n "$PIP_CA" ] && [ -f "$PIP_CA" ]; then
    secret=(--secret "id=pip_ca,src=$PIP_CA")
fi

build() {  # build NAME[:TAG-SUFFIX] DOCKERFILE BASE [ARGS...]
    local name=${1%%:*} variant="" dockerfile=$2 base=$3 tag start
    [[ "$1" == *:* ]] && variant="-${1#*:}"
    shift 3
    tag="$IMAGE_REPO/ortpack-$name:$version$variant$suffix"
    start=$(date +%s)
    # podman writes OCI images by default, which have no HEALTHCHECK or SHELL: ask for Docker's format
    [ "$ENGINE" = podman ] && set -- --format docker "$@"
    echo "images: building $tag ($ENGINE, base $base)" >&2
    [ -n "${NUMPY:-}" ] && set -- --build-arg "NUMPY=$NUMPY" "$@"
    if ! $ENGINE build -f "$dockerfile" -t "$tag" "${platform[@]}" --build-arg "BASE_IMAGE=$base" \
        --build-arg "FLAVOUR=$FLAVOUR" "${secret[@]}" "$@" . >&2; then
        echo "images: error: building $tag failed (see the build output above)" >&2
        exit 1
    fi
    # An engine may answer 0 without an image (a tag it cannot resolve is then pulled, and fails
    # with a registry error that hides the build's): check that the tag exists.
    if ! $ENGINE image inspect "$tag" >/dev/null 2>&1; then
        echo "images: error: $ENGINE reported success but $tag does not exist" >&2
        exit 1
    fi
    echo "images: built $tag in $(($(date +%s) - start)) s, $($ENGINE image inspect --format '{{.Size}}' "$tag") bytes" >&2
    echo "$tag"
}

for name in "${which[@]}"; do
    case "$name" in
        serve) build serve Dockerfile.serve "$SERVE_BASE" --build-arg "EXTRAS=serve,image,sign,oci" ;;
        serve-slim) build serve:slim Dockerfile.serve "$SERVE_BASE" --build-arg "EXTRAS=serve,image" ;;
        component) build component Dockerfile.component "$BASE_IMAGE" --build-arg "TORCH=$TORCH" \
            --build-arg "TORCH_CPU_INDEX=$TORCH_CPU_INDEX" ;;
        steps) build steps Dockerfile.steps "$SERVE_BASE" ;;
        *) echo "images: error: unknown image $name (serve, serve-slim, component, steps)" >&2; exit 2 ;;
    esac
done
