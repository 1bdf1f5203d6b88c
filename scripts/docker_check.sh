#!/usr/bin/env bash
# Build both images of the Dockerfile with podman and run them end to end, with no container registry
# (docs/guides/docker.md, "The check"):
#   bash scripts/docker_check.sh            (or: make docker-check)
# The bases are made here: debootstrap makes Debian bookworm (a user with uid 1000, as Ubuntu's images have) and
# Debian bookworm with Python 3.11, and `podman import` turns them into local images. The same Dockerfile is built
# with only its base build arguments swapped: the CPU image (--target cpu) and the GPU image, whose CUDA build of
# PyTorch comes from PyPI as on a GPU machine. Then, inside the images, as their uid 1000, with the corpus mirror
# and the outputs as volumes: `train.py --help`; `train.py experiment=smoke` and its test BLEU; translate.py on a
# 5-line file; serve.py host=0.0.0.0 and GET /health from the host; an unwritable outputs volume, a missing corpus
# volume without network and a bad setting, each one line and exit 2 with nothing written outside the volumes.
# Needs root, podman, debootstrap and the network (PyPI, Debian's packages), about 8 GB of disk, and on two cores
# half an hour or more. Too heavy for CI, which lints the Dockerfile instead (tests/test_docker.py).
#
# Environment:
#   NMT_DATA_MIRROR     the corpus mirror (docs/guides/data.md) to mount read-only; default ../shared/corpora
#   TORCH_WHEELS        a folder holding a CPU wheel of torch for Python 3.11, mounted into the CPU image's build;
#                       unset: the Dockerfile's default, PyTorch's CPU wheel index
#   EXPECTED_BLEU       the smoke run's test BLEU to match (default 6.08: the host's, deterministic on the CPU)
#   DOCKER_CHECK_CACHE  where the base tarballs are kept between runs (default ~/.cache/nmt-docker-check)
#   NO_CACHE=1          build every layer anew (what the build times in the docs measure); else podman's cache
#   SKIP_GPU=1          the CPU image only
#   KEEP_WORK=1         keep the volumes and logs (the folder is printed) instead of removing them
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
MIRROR=${NMT_DATA_MIRROR:-$(cd .. && pwd)/shared/corpora}
EXPECTED_BLEU=${EXPECTED_BLEU:-6.08}
CACHE=${DOCKER_CHECK_CACHE:-$HOME/.cache/nmt-docker-check}
SUITE=bookworm
DEBIAN_BASE=localhost/nmt-base/debian:$SUITE
PYTHON_BASE=localhost/nmt-base/python:3.11-$SUITE
CPU_IMAGE=localhost/nmt:cpu
GPU_IMAGE=localhost/nmt:gpu-on-debian

say() { printf '== %s\n' "$*"; }
ok() { printf 'ok    %s\n' "$*" >>"$WORK/summary"; printf 'ok: %s\n' "$*"; }
bad() { printf 'FAIL  %s\n' "$*" >>"$WORK/summary"; printf 'FAIL: %s\n' "$*" >&2; }
die() { printf 'docker_check: %s\n' "$*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "run as root (podman's overlay storage and debootstrap need it)"
for tool in podman debootstrap curl; do
    command -v "$tool" >/dev/null || die "$tool is missing: apt-get install podman buildah debootstrap curl"
done
[ -d "$MIRROR/multi30k" ] || die "no corpus mirror at $MIRROR (set NMT_DATA_MIRROR)"
[ -z "${TORCH_WHEELS:-}" ] || ls "$TORCH_WHEELS"/torch-*cp311*.whl >/dev/null 2>&1 \
    || die "TORCH_WHEELS=$TORCH_WHEELS holds no torch wheel for Python 3.11"

WORK=$(mktemp -d /tmp/nmt-docker-check.XXXXXX)
: >"$WORK/summary"
CONTAINERS=(smoke-gpu torch-gpu help-gpu)  # those that run in the background too
cleanup() {
    for name in "${CONTAINERS[@]}"; do podman rm -f -v "$name" >/dev/null 2>&1 || true; done
    if [ -n "${KEEP_WORK:-}" ]; then echo "kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# ---- the bases: debootstrap once, kept as tarballs in $CACHE
make_rootfs() {  # make_rootfs TARBALL EXTRA_PACKAGES
    local tarball=$1 packages=$2 rootfs=$WORK/rootfs
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$rootfs" http://deb.debian.org/debian >/dev/null
    # A machine whose TLS goes through an intercepting proxy trusts it with its own certificates: so must the base.
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
        chroot "$rootfs" update-ca-certificates >/dev/null
    fi
    chroot "$rootfs" useradd --create-home --uid 1000 --user-group ubuntu  # as in Ubuntu's images: uid 1000 is taken
    if [ -n "$packages" ]; then
        cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
        chroot "$rootfs" sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -q --no-install-recommends $packages && userdel --remove ubuntu" >/dev/null
        : >"$rootfs/etc/resolv.conf"
    fi
    chroot "$rootfs" apt-get clean
    rm -rf "$rootfs"/var/lib/apt/lists/*
    mkdir -p "$(dirname "$tarball")"
    tar -C "$rootfs" --numeric-owner -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$rootfs"
}
base_image() {  # base_image IMAGE TARBALL EXTRA_PACKAGES CMD
    podman image exists "$1" && return
    [ -f "$2" ] || { say "debootstrap $SUITE${3:+ + $3} -> $2"; make_rootfs "$2" "$3"; }
    podman import --quiet --change 'ENV LANG=C.UTF-8' --change "CMD $4" "$2" "$1" >/dev/null
}
base_image "$DEBIAN_BASE" "$CACHE/debian-$SUITE.tar" "" '["bash"]'
base_image "$PYTHON_BASE" "$CACHE/debian-$SUITE-python3.tar" "python3 python3-venv" '["python3"]'

# ---- how containers run here: podman's defaults, else (a VM whose cgroups or rlimits crun refuses) runc with the
# shell's own limits
PODMAN=(podman)
LIMITS=()
if ! podman run --rm "$DEBIAN_BASE" true >/dev/null 2>&1; then
    PODMAN=(podman --runtime runc)
    nproc_limit=$(ulimit -u); [ "$nproc_limit" = unlimited ] || [ "$nproc_limit" -gt 32768 ] && nproc_limit=32768
    LIMITS=(--ulimit "nofile=$(ulimit -n):$(ulimit -Hn)" --ulimit "nproc=$nproc_limit:$nproc_limit")
    "${PODMAN[@]}" run --rm "${LIMITS[@]}" "$DEBIAN_BASE" true || die "podman cannot run a container here"
    say "podman runs containers here with: ${PODMAN[*]:1} ${LIMITS[*]}"
fi

# ---- the builds: the same Dockerfile, the bases swapped
build() {  # build LABEL IMAGE TARGET [ARGS...]
    local label=$1 image=$2 target=$3 start seconds size
    shift 3
    say "build the $label image: podman build --target $target $* -t $image ."
    start=$(date +%s)
    if ! "${PODMAN[@]}" build --network=host "${LIMITS[@]}" ${NO_CACHE:+--no-cache} --target "$target" \
            --build-arg "BASE_IMAGE=$DEBIAN_BASE" --build-arg "CPU_BASE_IMAGE=$PYTHON_BASE" "$@" \
            -t "$image" . >"$WORK/build-$target.log" 2>&1; then
        tail -20 "$WORK/build-$target.log" >&2
        bad "$label image: the build failed"
        return 1
    fi
    seconds=$(($(date +%s) - start))
    size=$(podman image inspect --format '{{.Size}}' "$image")
    ok "$label image built in ${seconds} s${NO_CACHE:+ (no cache)}: $image, $(numfmt --to=si --suffix=B "$size")"
}
TORCH_ARGS=()
[ -z "${TORCH_WHEELS:-}" ] || TORCH_ARGS=(--build-arg "TORCH_PIP_ARGS=--find-links /wheels" -v "$TORCH_WHEELS:/wheels:ro")
build CPU "$CPU_IMAGE" cpu "${TORCH_ARGS[@]}" || exit 1
GPU_BUILT=0
if [ -z "${SKIP_GPU:-}" ]; then build "GPU (on Debian)" "$GPU_IMAGE" gpu && GPU_BUILT=1; fi

# ---- runs, as the image's user (uid 1000), with volumes; --network=none unless serving
volume() { mkdir -p "$1" && chown "${2:-1000:1000}" "$1" && printf '%s' "$1"; }
run() {  # run NAME IMAGE ARGS... : podman run, the container kept for `podman diff`
    local name=$1
    shift
    CONTAINERS+=("$name")
    "${PODMAN[@]}" run --name "$name" "${LIMITS[@]}" "$@"
}
nothing_written_outside_volumes() {  # a container's changes outside its volumes, which must be none
    # (podman's own: /etc, where it mounts hosts and resolv.conf, and the folder it makes to mount the corpus on;
    # /tmp changed with no file left in it: a temporary file made and removed)
    local changes
    changes=$(podman diff "$1" | grep -vxE 'C /etc|C /tmp|A /corpora' || true)
    [ -z "$changes" ] || { printf '%s wrote outside its volumes:\n%s\n' "$1" "$changes" >&2; return 1; }
}
test_bleu() {
    python3 -c 'import json, sys; print("%.2f" % json.load(open(sys.argv[1]))["test"]["test_2016_flickr"]["bleu"])' "$1"
}

smoke() {  # smoke LABEL IMAGE: train.py experiment=smoke, its BLEU; echoes the outputs folder
    local label=$1 image=$2 out data start
    out=$(volume "$WORK/$label/outputs"); data=$(volume "$WORK/$label/data")
    say "$label image: python train.py experiment=smoke (corpus mirror and outputs as volumes, no network)"
    start=$(date +%s)
    if run "smoke-$label" --network=none -v "$MIRROR:/corpora:ro" -e NMT_DATA_MIRROR=/corpora \
            -v "$data:/app/data" -v "$out:/app/outputs" "$image" \
            python train.py experiment=smoke hydra.run.dir=outputs/smoke >"$WORK/$label/smoke.log" 2>&1; then
        local bleu
        bleu=$(test_bleu "$out/smoke/results.json") || bleu="(no results.json)"
        if [ "$bleu" = "$EXPECTED_BLEU" ]; then
            ok "$label image: smoke training, test BLEU $bleu (the host's: $EXPECTED_BLEU), $(($(date +%s) - start)) s"
        else
            bad "$label image: smoke training gave test BLEU $bleu, the host $EXPECTED_BLEU"
        fi
    else
        tail -5 "$WORK/$label/smoke.log" >&2
        bad "$label image: smoke training failed"
    fi
}

# ---- the GPU image, base swapped for Debian: imports torch, trains the smoke run on the CPU and says so once; in the
# background, beside the CPU image's runs
gpu_runs() {
    say "GPU image (on Debian): import torch"
    local versions notes
    if versions=$(run torch-gpu --network=none "$GPU_IMAGE" python -c \
            'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: {torch.cuda.is_available()}")' 2>&1); then
        ok "GPU image: $versions"
    else
        bad "GPU image: import torch failed: $versions"
    fi
    if run help-gpu --network=none "$GPU_IMAGE" python train.py --help >"$WORK/help-gpu.txt" 2>&1 \
            && grep -q "== Config groups" "$WORK/help-gpu.txt"; then ok "GPU image: train.py --help"
    else bad "GPU image: train.py --help"; fi
    smoke gpu "$GPU_IMAGE"
    notes=$(grep -c "no CUDA GPU is visible" "$WORK/gpu/smoke.log" || true)
    if [ "$notes" = 1 ]; then ok "GPU image without a GPU: says once that it trains on the CPU: $(grep -o 'no CUDA GPU is visible.*' "$WORK/gpu/smoke.log")"
    else bad "GPU image without a GPU: said $notes times that it trains on the CPU"; fi
}
GPU_PID=""
if [ "$GPU_BUILT" = 1 ]; then gpu_runs >"$WORK/gpu-runs.log" 2>&1 & GPU_PID=$!; fi

say "CPU image: python train.py --help"
if run help-cpu --network=none "$CPU_IMAGE" python train.py --help >"$WORK/help.txt" 2>&1 \
        && grep -q "== Config groups" "$WORK/help.txt"; then ok "CPU image: train.py --help"; else bad "train.py --help"; fi

# ---- bad input: one line, exit 2, nothing written outside the volumes
refused() {  # refused WHAT NAME PODMAN_RUN_ARGS... -- : the container must exit 2 with one error line
    local what=$1 name=$2 status=0
    shift 2
    run "$name" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" || status=$?
    local last errors
    last=$(tail -1 "$WORK/$name.err"); errors=$(grep -c ': error: ' "$WORK/$name.err" || true)
    if [ "$status" = 2 ] && [ "$errors" = 1 ] && [[ $last == *": error: "* ]] \
            && ! grep -q Traceback "$WORK/$name.err" && nothing_written_outside_volumes "$name"; then
        ok "$what: exit 2, one line: $last"
    else
        cat "$WORK/$name.err" >&2
        bad "$what: exit $status, $errors error lines"
    fi
}
unwritable=$(volume "$WORK/unwritable" 0:0)
refused "unwritable outputs volume" bad-outputs --network=none -v "$MIRROR:/corpora:ro" -e NMT_DATA_MIRROR=/corpora \
    -v "$(volume "$WORK/bad-data")":/app/data -v "$unwritable:/app/outputs" "$CPU_IMAGE" python train.py experiment=smoke
refused "unwritable data volume" bad-data --network=none -v "$unwritable:/app/data" \
    -v "$(volume "$WORK/bad-out")":/app/outputs "$CPU_IMAGE" python train.py experiment=smoke
refused "missing corpus volume, no network" no-corpus --network=none -e NMT_DATA_MIRROR=/corpora \
    -v "$(volume "$WORK/nc-data")":/app/data -v "$(volume "$WORK/nc-out")":/app/outputs "$CPU_IMAGE" \
    python train.py experiment=smoke
refused "bad setting" bad-setting --network=none -v "$(volume "$WORK/bs-out")":/app/outputs "$CPU_IMAGE" \
    python train.py trainer.max_steps=many
[ -z "$(ls -A "$WORK/unwritable")" ] || bad "the unwritable volume got files"

smoke cpu "$CPU_IMAGE"
OUT=$WORK/cpu/outputs

if ! [ -f "$OUT/smoke/checkpoints/best.pt" ]; then
    bad "CPU image: no trained model, so translate.py and serve.py were not run"
else
    say "CPU image: translate.py on a 5-line file"
    printf '%s\n' "Ein Hund läuft durch den Schnee." "Zwei Männer spielen Fußball." "Eine Frau liest ein Buch." \
        "Ein Kind isst einen Apfel." "Drei Leute sitzen auf einer Bank." >"$WORK/in.de"
    if run translate-cpu -i --network=none -v "$OUT:/app/outputs" "$CPU_IMAGE" \
            python translate.py checkpoint=outputs/smoke <"$WORK/in.de" >"$WORK/out.en" 2>"$WORK/translate.err"; then
        lines=$(wc -l <"$WORK/out.en")
        if [ "$lines" = 5 ]; then ok "CPU image: translate.py, 5 lines in, 5 lines out"
        else bad "translate.py wrote $lines lines for 5"; fi
    else
        tail -5 "$WORK/translate.err" >&2
        bad "CPU image: translate.py failed"
    fi

    say "CPU image: serve.py host=0.0.0.0 (the model read-only at /model, as compose.yaml), GET /health from the host"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # Published as docker does (-p); where this machine's podman has no container network, on the host's.
    if run serve-probe --rm -p "127.0.0.1:$port:8000" "$DEBIAN_BASE" true >/dev/null 2>&1; then
        net=(-p "127.0.0.1:$port:8000"); serve_port=8000
    else
        net=(--network=host); serve_port=$port
    fi
    run serve-cpu -d "${net[@]}" -v "$OUT/smoke:/model:ro" "$CPU_IMAGE" \
        python serve.py checkpoint=/model host=0.0.0.0 port=$serve_port >/dev/null
    health=""
    for _ in $(seq 120); do
        health=$(curl -fsS "http://127.0.0.1:$port/health" 2>/dev/null) && break
        [ "$(podman inspect --format '{{.State.Running}}' serve-cpu)" = true ] || break
        sleep 1
    done
    if [ -n "$health" ]; then ok "CPU image: serve.py answers GET /health from the host ($(printf '%s' "${net[*]}")): $health"
    else podman logs serve-cpu 2>&1 | tail -5 >&2; bad "CPU image: serve.py did not answer /health"; fi
    podman stop -t 10 serve-cpu >/dev/null || true
fi


if [ -n "$GPU_PID" ]; then
    say "waiting for the GPU image's runs"
    wait "$GPU_PID" || true
    cat "$WORK/gpu-runs.log"
fi
say "summary ($(podman --version), $(nproc) cores $(uname -m), commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown))"
cat "$WORK/summary"
! grep -q '^FAIL' "$WORK/summary"
