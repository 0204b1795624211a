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
tag=${BASE_TAG:-localhost/ortpack-base:bookworm}
if $ENGINE image inspect "$tag" >/dev/null 2>&1; then
    echo "$tag"
    exit 0
fi
command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap || exit 1
mirror=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | grep -v security | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}
root=$(mktemp -d /var/tmp/ortpack-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
start=$(date +%s)
echo "images: making $tag with debootstrap from $mirror" >&2
if ! debootstrap --variant=minbase --include=python3,python3-venv bookworm "$root" "$mirror" >"$root.log" 2>&1; then
    echo "images: error: debootstrap failed: $(tail -n 1 "$root.log") (log: $root.log)" >&2
    exit 1
fi
rm -f "$root.log"
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
    "$root"/usr/share/locale/* "$root"/usr/share/info/* "$root"/var/log/*
tar -C "$root" -c . | $ENGINE import --change 'CMD ["python3"]' - "$tag" >/dev/null
echo "images: made $tag in $(($(date +%s) - start)) s" >&2
echo "$tag"
