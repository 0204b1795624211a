#!/usr/bin/env bash
# Make the local base image (once; cached by the engine) and print its tag: Debian bookworm's
# minbase with python3 and python3-venv, made with debootstrap from the Debian mirror apt uses and
# imported with `$ENGINE import`. For machines where no container registry answers; elsewhere the
# Dockerfiles' default base (the public Python slim image) is used. Docs, man pages, locales and
# apt's lists are left out (~130 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=images/engine.sh
source images/engine.sh
ensure_engine
# ARCH (a Debian architecture, default this machine's): another one is bootstrapped through
# qemu-user-static under binfmt (installed with apt-get when missing) and tagged bookworm-ARCH.
native=$(dpkg --print-architecture 2>/dev/null || echo amd64)
ARCH=${ARCH:-$native}
tag=${BASE_TAG:-localhost/ortpack-base:bookworm$([ "$ARCH" = "$native" ] || echo "-$ARCH")}
if $ENGINE image inspect "$tag" >/dev/null 2>&1; then
    echo "$tag"
    exit 0
fi
command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap || exit 1
if [ "$ARCH" != "$native" ] && ! compgen -G "/proc/sys/fs/binfmt_misc/qemu-*" >/dev/null; then
    apt_install qemu-user-static binfmt-support || exit 1
fi
mirror=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | grep -v security | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}
root=$(mktemp -d /var/tmp/ortpack-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
start=$(date +%s)
echo "images: making $tag with debootstrap from $mirror" >&2
if ! debootstrap --arch="$ARCH" --variant=minbase --include=python3,python3-venv bookworm "$root" "$mirror" >"$root.log" 2>&1; then
    echo "images: error: debootstrap failed: $(tail -n 1 "$root.log") (log: $root.log)" >&2
    exit 1
fi
rm -f "$root.log"
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
    "$root"/usr/share/locale/* "$root"/usr/share/info/* "$root"/var/log/*
tar -C "$root" -c . | $ENGINE import --arch "$ARCH" --change 'CMD ["python3"]' - "$tag" >/dev/null
echo "images: made $tag in $(($(date +%s) - start)) s" >&2
echo "$tag"
