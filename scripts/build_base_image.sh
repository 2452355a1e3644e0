#!/usr/bin/env bash
# Build glm5's offline base image for `glm5 bench --env docker`: a minimal Debian (debootstrap from the Debian
# mirror apt already uses, so no Docker registry is needed) with bash, git, patch, Python 3, pip and pytest, imported
# as glm5-bench-base:bookworm. The root filesystem tarball is cached (GLM5_BASE_CACHE, default
# ~/.cache/glm5/base-bookworm.tar) so CI builds it once. Needs root, debootstrap and a running Docker daemon.
# Usage: scripts/build_base_image.sh [TAG]
set -euo pipefail
TAG=${1:-glm5-bench-base:bookworm}
SUITE=${GLM5_BASE_SUITE:-bookworm}
MIRROR=${GLM5_BASE_MIRROR:-http://deb.debian.org/debian}
CACHE=${GLM5_BASE_CACHE:-$HOME/.cache/glm5/base-$SUITE.tar}
PKGS=bash,coreutils,git,patch,tar,python3,python-is-python3,python3-pip,python3-venv,python3-pytest,ca-certificates,procps
if docker image inspect "$TAG" >/dev/null 2>&1; then echo "$TAG is already built"; exit 0; fi
if [ ! -s "$CACHE" ]; then
  command -v debootstrap >/dev/null || { echo "needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
  ROOT=$(mktemp -d /var/tmp/glm5-base.XXXXXX)
  trap 'rm -rf "$ROOT"' EXIT
  debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$ROOT" "$MIRROR" >&2
  rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
  mkdir -p "$(dirname "$CACHE")"
  tar -C "$ROOT" --numeric-owner -cf "$CACHE.tmp" . && mv "$CACHE.tmp" "$CACHE"
fi
docker import --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  "$CACHE" "$TAG" >/dev/null
echo "built $TAG from $CACHE"
