# Sourced by images/*.sh and the image tests' helpers: pick a container engine and make it usable.
# `ensure_engine` sets ENGINE (docker or podman) or exits non-zero with one line on stderr.
ENGINE_PACKAGES="podman buildah runc fuse-overlayfs uidmap slirp4netns"

apt_install() {  # apt_install PACKAGE... (root on Debian/Ubuntu only)
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "images: error: $* missing and cannot be installed here (needs root and apt-get):" \
            "install them, or start a Docker engine" >&2
        return 1
    fi
    echo "images: installing $* (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
}

ensure_engine() {
    if [ -z "${ENGINE:-}" ]; then
        if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
            ENGINE=docker
        else
            ENGINE=podman
        fi
    fi
    if [ "$ENGINE" = podman ]; then

        { command -v podman && command -v runc; } >/dev/null 2>&1 || apt_install $ENGINE_PACKAGES || exit 1
        # images/containers.conf: runc and cgroupfs, rlimits a root without CAP_SYS_RESOURCE may set
        export CONTAINERS_CONF=${CONTAINERS_CONF:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/containers.conf}
    fi
    if ! $ENGINE info >/dev/null 2>&1; then
        echo "images: error: $ENGINE does not work here: $($ENGINE info 2>&1 | tail -n 1)" >&2
        exit 1
    fi
    export ENGINE
}
