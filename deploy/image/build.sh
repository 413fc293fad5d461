#!/usr/bin/env bash
# Builds the daemon image (the repository's Dockerfile) where no Docker engine runs and no
# registry can be reached: the base image debian:bookworm-slim is made with debootstrap from
# Debian's packages and imported into buildah's store, then `buildah bud --isolation chroot`
# builds the Dockerfile (its RUN steps reach Debian's mirror and PyPI).
#
#   deploy/image/build.sh [TAG]          TAG defaults to tiled:<version in pyproject.toml>
#
# Environment:
#   TILED_IMAGE_STORE   buildah's storage root (default: buildah's own, /var/lib/containers);
#                       tests give it a directory of their own so they never touch other images
#   TILED_IMAGE_ROOTFS  where the debootstrapped base is kept as a tarball between runs
#                       (default build/image/bookworm-rootfs.tar)
#   TILED_IMAGE_TMPDIR  buildah's temporary files (a commit writes each layer there first, up to
#                       2 GB) and debootstrap's root; default $TILED_IMAGE_STORE/tmp when a store
#                       is given, else TMPDIR or /var/tmp (a small tmpfs there fails the commit)
#   TILED_IMAGE_MIN_FREE_MB  free space the build checks for first (default 5120: measured peak
#                       4.9 GB on a first run, store and temporary files together)
#   DEBIAN_MIRROR       default http://deb.debian.org/debian
#   TILED_IMAGE_PIP_CA  CA bundle pip trusts in the build (the Dockerfile's pip_ca secret: in
#                       no layer); default PIP_CERT, else /etc/ssl/certs/ca-certificates.crt,
#                       so a host behind a TLS-inspecting proxy builds as its own pip works
# Needs root, buildah and debootstrap (Debian: apt-get install buildah debootstrap).
set -euo pipefail
cd "$(dirname "$0")/../.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
tag=${1:-tiled:$version}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
rootfs_tar=${TILED_IMAGE_ROOTFS:-build/image/bookworm-rootfs.tar}
base=docker.io/library/debian:bookworm-slim  # what `FROM debian:bookworm-slim` resolves to

bh=(buildah --storage-driver vfs)
store=/var/lib/containers/storage
tmp=${TILED_IMAGE_TMPDIR:-}
if [[ -n ${TILED_IMAGE_STORE:-} ]]; then
  bh+=(--root "$TILED_IMAGE_STORE/root" --runroot "$TILED_IMAGE_STORE/run")
  store=$TILED_IMAGE_STORE
  tmp=${tmp:-$TILED_IMAGE_STORE/tmp}
fi
if [[ -n $tmp ]]; then
  mkdir -p "$tmp"
  export TMPDIR=$tmp  # buildah's and mktemp's temporary files
fi
tmp=${TMPDIR:-/var/tmp}

free_mb() {  # free MiB on the filesystem holding $1 (or the nearest existing parent)
  local d=$1
  until [[ -e $d ]]; do d=$(dirname "$d"); done
  df -Pm "$d" | awk 'NR == 2 {print $4}'
}
need=${TILED_IMAGE_MIN_FREE_MB:-5120}
for d in "$store" "$tmp"; do
  have=$(free_mb "$d")
  if ((have < need)); then
    echo "deploy/image/build.sh: $d has $have MiB free; the build needs about $need MiB" \
      "(buildah's vfs store and its temporary layer files; TILED_IMAGE_STORE and" \
      "TILED_IMAGE_TMPDIR move them)" >&2
    exit 1
  fi
done

make_rootfs() {  # a minimal Debian bookworm, with security updates enabled, as a tarball
  local dir
  dir=$(mktemp -d "$tmp/tiled-rootfs.XXXXXX")
  trap 'rm -rf "$dir"' RETURN
  debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.log" 2>&1 ||
    { tail -20 "$dir.log"; rm -f "$dir.log"; return 1; }
  rm -f "$dir.log"
  rm -f "$dir/etc/apt/sources.list"
  cat >"$dir/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  # as Debian's -slim images: no docs, man pages or apt lists in the base
  rm -rf "$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/var/lib/apt/lists/* \
    "$dir"/var/cache/apt/*.bin "$dir"/var/log/*.log
  mkdir -p "$(dirname "$rootfs_tar")"
  tar -C "$dir" --numeric-owner -cf "$rootfs_tar.tmp" . && mv "$rootfs_tar.tmp" "$rootfs_tar"
}

t0=$SECONDS
if ! "${bh[@]}" inspect --type image "$base" >/dev/null 2>&1; then
  [[ -f $rootfs_tar ]] || { make_rootfs; echo "debootstrap: $((SECONDS - t0)) s"; }
  ctr=$("${bh[@]}" from scratch)
  "${bh[@]}" add "$ctr" "$rootfs_tar" / >/dev/null
  "${bh[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash --os linux --arch "$(dpkg --print-architecture)" "$ctr"
  "${bh[@]}" commit -q --rm "$ctr" "$base" >/dev/null
  echo "base image $base: $((SECONDS - t0)) s"
fi
t1=$SECONDS
secret=()
pip_ca=${TILED_IMAGE_PIP_CA:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}
[[ -s $pip_ca ]] && secret=(--secret "id=pip_ca,src=$pip_ca")
"${bh[@]}" bud --isolation chroot --format docker --pull=never --build-arg "VERSION=$version" \
  "${secret[@]}" -f Dockerfile -t "$tag" . >&2
echo "image $tag: $((SECONDS - t1)) s"
