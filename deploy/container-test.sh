#!/usr/bin/env bash
# Build the nmt-serve image with podman on a machine with no Docker engine and no container
# registry (this project's machines and CI). tests/deploy/test_container.py runs it; so can you.
#
#   deploy/container-test.sh base     make the base image once (debootstrap), reuse it after
#   deploy/container-test.sh build    base + `podman build`; prints one JSON line: image, build
#                                     seconds, size, the runtime stage's packages
#
# Needs (Debian): podman runc debootstrap. Environment: IMAGE (default localhost/nmt-serve:test),
# BASE_IMAGE (default docker.io/library/debian:bookworm-slim), CONTAINERS_CONF (default: the
# file beside this script).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
IMAGE="${IMAGE:-localhost/nmt-serve:test}"
BASE_IMAGE="${BASE_IMAGE:-docker.io/library/debian:bookworm-slim}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$ROOT/deploy/podman/containers.conf}"

log() { echo "container-test: $*" >&2; }

need() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || {
            log "$tool not found (apt-get install podman runc debootstrap)"
            exit 3
        }
    done
}

# The Debian mirrors apt is configured with (deb822 sources, then sources.list): the main
# archive (`debian_mirror`) or the security one (`debian_mirror -security`).
debian_mirror() {
    local uris
    uris="$( (grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
        grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}') || true)"
    if [[ "${1:-}" == -security ]]; then
        uris="$(grep -- '-security' <<<"$uris" | head -n1 || true)"
        echo "${uris:-http://deb.debian.org/debian-security}"
    else
        uris="$(grep -v -- '-security' <<<"$uris" | head -n1 || true)"
        echo "${uris:-http://deb.debian.org/debian}"
    fi
}

# No registry serves base images here, so the base is a real Debian bookworm root made by
# debootstrap and slimmed the way the official -slim image is (no docs, man pages, locales).
# Done once: a base image already in podman's store is reused.
ensure_base() {
    if podman image exists "$BASE_IMAGE"; then
        log "base image $BASE_IMAGE present, reused"
        return
    fi
    need debootstrap
    local rootfs mirror started
    rootfs="$(mktemp -d /var/tmp/nmt-rootfs.XXXXXX)"
    # shellcheck disable=SC2064  # expand now: the path is fixed
    trap "rm -rf '$rootfs'" EXIT
    mirror="$(debian_mirror)"
    started=$SECONDS
    log "debootstrap bookworm from $mirror"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
    cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $(debian_mirror -security) bookworm-security main
EOF
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
    # As in the official image: apt keeps no .deb files or package caches, and no translations.
    cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
    find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda,locale}/* \
        "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
        "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman import --quiet - "$BASE_IMAGE" >/dev/null
    log "base image $BASE_IMAGE made in $((SECONDS - started)) s"
}

# What pip needs inside the build on this machine, as the host's pip is configured: its CA
# bundle, its local wheel folders (a CPU torch) and file:// indexes. Each is mounted read-only
# and named in a build arg; nothing of it is copied into the image.
pip_value() {
    python3 -m pip config list 2>/dev/null | grep -E "^[^=]*\.$1=" | head -n1 | cut -d= -f2- \
        | tr -d "'" || true
}

# Fills PIP_OPTIONS with podman build options.
pip_build_options() {
    local cert path dir links=() extra=() torch_found=0
    PIP_OPTIONS=()
    cert="${PIP_CERT:-$(pip_value cert)}"
    if [[ -n "$cert" && -f "$cert" ]]; then
        PIP_OPTIONS+=("--volume=$cert:/run/pip/ca.crt:ro" "--build-arg=PIP_CERT=/run/pip/ca.crt")
    fi
    for path in ${PIP_FIND_LINKS:-$(pip_value find-links)}; do
        [[ -d "$path" ]] || continue
        PIP_OPTIONS+=("--volume=$path:/run/pip/wheels${#links[@]}:ro")
        links+=("/run/pip/wheels${#links[@]}")
        compgen -G "$path/torch-*+cpu-*.whl" >/dev/null && torch_found=1
    done
    if ((${#links[@]})); then
        PIP_OPTIONS+=("--build-arg=PIP_FIND_LINKS=${links[*]}")
    fi
    # A local CPU torch makes PyTorch's index (unreachable here) unnecessary.
    if ((torch_found)); then
        PIP_OPTIONS+=("--build-arg=TORCH_INDEX_URL=")
    fi
    for path in ${PIP_EXTRA_INDEX_URL:-$(pip_value extra-index-url)}; do
        if [[ "$path" == file://* ]]; then
            dir="${path#file://}"
            [[ -d "$dir" ]] || continue
            # Mounted at the same path: such an index may name its files by absolute path.
            PIP_OPTIONS+=("--volume=$(dirname "$dir"):$(dirname "$dir"):ro")
        fi
        extra+=("$path")
    done
    if ((${#extra[@]})); then
        PIP_OPTIONS+=("--build-arg=PIP_EXTRA_INDEX_URL=${extra[*]}")
    fi
}

build() {
    need podman runc
    ensure_base
    local version revision source started seconds size
    version="$(python3 -c 'import tomllib; print(tomllib.load(open("'"$ROOT"'/pyproject.toml", "rb"))["project"]["version"])')"
    revision="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    source="$(git -C "$ROOT" remote get-url origin 2>/dev/null || true)"
    pip_build_options
    started=$SECONDS
    log "podman build -t $IMAGE ${PIP_OPTIONS[*]}"
    podman build --network host --format docker --layers \
        --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "VERSION=$version" \
        --build-arg "REVISION=$revision" --build-arg "SOURCE=$source" \
        "${PIP_OPTIONS[@]}" -t "$IMAGE" "$ROOT" >&2
    seconds=$((SECONDS - started))
    size="$(podman image inspect --format '{{.Size}}' "$IMAGE")"
    local packages debs
    packages="$(podman run --rm --no-healthcheck --entrypoint python3 "$IMAGE" -c \
        'import json, importlib.metadata as m; print(json.dumps(sorted(f"{d.name}=={d.version}" for d in m.distributions())))')"
    debs="$(podman run --rm --no-healthcheck --entrypoint dpkg-query "$IMAGE" -W -f '${Package}\n' | wc -l)"
    printf '{"image": "%s", "build_seconds": %d, "size_bytes": %s, "debian_packages": %s, "python_packages": %s}\n' \
        "$IMAGE" "$seconds" "$size" "$debs" "$packages"
}

case "${1:-}" in
base) need podman runc && ensure_base ;;
build) build ;;
*)
    echo "usage: $0 base|build" >&2
    exit 2
    ;;
esac
