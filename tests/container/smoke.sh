#!/usr/bin/env bash
# The container image, built and run as an operator would, with podman (no Docker engine here).
#
#   sudo tests/container/smoke.sh          # root: podman, buildah, runc, debootstrap installed
#
# 1. podman configured for this machine by a generated containers.conf (CONTAINERS_CONF).
# 2. A local stand-in for python:3.12-slim (no registry is reachable): Debian bookworm from the
#    machine's apt mirror by debootstrap, with the machine's CA bundle (a TLS-inspecting proxy
#    re-signs PyPI), imported as localhost/recall-base:bookworm. Built once, then kept.
# 3. The embedded target built on it: recall-server:embedded (kept too); with EXTRAS set, the
#    Dockerfile's EXTRAS build argument, as recall-server:embedded-EXTRAS.
# 4. Run with a named volume, the demo tokens mounted read-only, a generated INGEST_KEY, a
#    loopback port and a read-only root filesystem without tmpfs (nothing but the volume is
#    writable: no model cache is derived at run time); the process is not root; /healthz and
#    /readyz; the demo seeded from the host;
#    alice and bob recall through an MCP client; restart; recall again. The container and its
#    volume are removed at the end, whatever happens.
#
# Environment: RECALL_PYTHON, the host Python with fastmcp (default: the repository's .venv);
# DEBIAN_MIRROR, to override the mirror read from apt's sources; REBUILD_BASE=1, to rebuild the
# base image; EXTRAS, the image's extras (EXTRAS=multilingual); EMBED_MODEL, the server's model
# (EMBED_MODEL=multilingual-e5-small needs EXTRAS=multilingual).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BASE_IMAGE=localhost/recall-base:bookworm
EXTRAS=${EXTRAS:-}
APP_IMAGE=recall-server:embedded${EXTRAS:+-${EXTRAS//,/-}}
SUITE=bookworm
N11_DECISION="go ahead with the N-11 upgrade"  # alice's 2026-10-08 capacity check
WAIT_SECONDS=240  # startup, seeding and a first index run on a loaded 2-core machine

say() { printf 'smoke: %s\n' "$*"; }
fail() { printf 'smoke: FAILED: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "run as root (rootful podman; debootstrap needs root)"
for tool in podman debootstrap tar; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (apt-get install podman buildah runc debootstrap)"
done
PYTHON=${RECALL_PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=$(command -v python3)
"$PYTHON" -c 'import fastmcp' 2>/dev/null \
    || fail "$PYTHON cannot import fastmcp: set RECALL_PYTHON to the project's venv Python"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/recall-smoke.XXXXXX")
SUFFIX=$(basename "$WORK" | cut -d. -f2 | tr '[:upper:]' '[:lower:]')
CONTAINER=recall-smoke-$SUFFIX
VOLUME=recall-smoke-$SUFFIX
cleanup() {
    local status=$?
    if [ "$status" != 0 ] && podman container exists "$CONTAINER" 2>/dev/null; then
        say "the container's log (last 40 lines):"
        podman logs --tail 40 "$CONTAINER" 2>&1 | sed 's/^/    /' || true
    fi
    podman rm --force --time 5 "$CONTAINER" >/dev/null 2>&1 || true
    podman volume rm --force "$VOLUME" >/dev/null 2>&1 || true
    rm -rf "$WORK"
    say "removed the container, its volume and $WORK (the images stay cached)"
}
trap cleanup EXIT

# --- 1. podman for this machine ------------------------------------------------------------------
# A container may not get higher limits than podman has: runc's setrlimit fails without
# CAP_SYS_RESOURCE. podman lowers its own nproc to kernel.pid_max when that is lower, so cap there.
limit() { # ulimit flag -> its value, "unlimited" as a number
    local value
    value=$(ulimit "$1")
    [ "$value" = unlimited ] && value=1048576
    printf '%s' "$value"
}
nofile_soft=$(limit -Sn) nofile_hard=$(limit -Hn)
nproc=$(limit -Su)
[ "$(limit -Hu)" -lt "$nproc" ] && nproc=$(limit -Hu)
pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo "$nproc")
[ "$pid_max" -lt "$nproc" ] && nproc=$pid_max
cat > "$WORK/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile_soft:$nofile_hard", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF=$WORK/containers.conf
say "podman configured by $CONTAINERS_CONF: runc, cgroupfs, nofile=$nofile_soft:$nofile_hard, nproc=$nproc"

# --- 2. the stand-in base image ------------------------------------------------------------------
debian_mirror() { # the machine's apt mirror for $SUITE (one-line or deb822 sources)
    local file
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$file" ] || continue
        awk -v suite="$SUITE" '$1 == "deb" { for (i = 2; i < NF; i++) if ($i !~ /^\[/ && $(i+1) == suite) { print $i; exit } }' "$file"
    done
    for file in /etc/apt/sources.list.d/*.sources; do
        [ -f "$file" ] || continue
        awk -v suite="$SUITE" '
            /^$/ { if (ok && uri) { found = 1; exit } ok = 0; uri = "" }
            /^URIs:/ { uri = $2 }
            /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
            END { if (found || (ok && uri)) print uri }' "$file"
    done
}
if [ "${REBUILD_BASE:-0}" != 1 ] && podman image exists "$BASE_IMAGE"; then
    say "base image $BASE_IMAGE is cached: no debootstrap"
else
    mirror=${DEBIAN_MIRROR:-$(debian_mirror | head -n 1)}
    mirror=${mirror:-http://deb.debian.org/debian}
    say "building $BASE_IMAGE: debootstrap $SUITE from $mirror (a few minutes)"
    started=$SECONDS
    rootfs=$WORK/rootfs
    if ! debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
        "$SUITE" "$rootfs" "$mirror" > "$WORK/debootstrap.log" 2>&1; then
        tail -n 30 "$WORK/debootstrap.log" >&2
        fail "debootstrap failed (log above)"
    fi
    # pip in the build trusts only this bundle: it must hold the proxy's CA, as the host's does.
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
    # What python:3.12-slim leaves out too: downloaded packages and apt's lists.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman import --quiet \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["python3"]' - "$BASE_IMAGE" > /dev/null
    rm -rf "$rootfs"
    say "base image built in $((SECONDS - started))s"
fi

# --- 3. the embedded image -----------------------------------------------------------------------
# pip inside the build reaches PyPI the way the host's pip does. Only an http(s) index helps
# there (file:// indexes and find-links are on the host's disk); a URL with credentials is not
# passed, because build arguments are recorded in the image history.
build_args=(--build-arg "PYTHON_IMAGE=$BASE_IMAGE")
index_url=${PIP_INDEX_URL:-$("$PYTHON" -m pip config get global.index-url 2>/dev/null || true)}
case "$index_url" in
    "") say "pip in the build uses pypi.org (the host's pip sets no index-url)" ;;
    *://*@*) say "not passing the host's pip index-url: it holds credentials" ;;
    http://* | https://*) build_args+=(--build-arg "PIP_INDEX_URL=$index_url")
        say "pip in the build uses the host's index $index_url" ;;
    *) say "not passing the host's pip index-url $index_url: not reachable from a build" ;;
esac
[ -n "${PIP_DEFAULT_TIMEOUT:-}" ] && build_args+=(--build-arg "PIP_DEFAULT_TIMEOUT=$PIP_DEFAULT_TIMEOUT")
[ -n "$EXTRAS" ] && build_args+=(--build-arg "EXTRAS=$EXTRAS")
say "building $APP_IMAGE (target embedded${EXTRAS:+, extras $EXTRAS}) on $BASE_IMAGE"
previous=$(podman image inspect --format '{{.Id}}' "$APP_IMAGE" 2>/dev/null || true)
started=$SECONDS
# --format docker: the OCI format has no HEALTHCHECK and podman would drop the image's.
if ! podman build --format docker "${build_args[@]}" --target embedded -t "$APP_IMAGE" \
    "$ROOT" > "$WORK/build.log" 2>&1; then
    tail -n 40 "$WORK/build.log" >&2
    fail "podman build failed (log above)"
fi
size=$(podman image inspect --format '{{.Size}}' "$APP_IMAGE")
# The build it replaced, with its layers: a changed source would otherwise leave ~300 MB each run.
if [ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$APP_IMAGE")" ]; then
    podman rmi "$previous" > /dev/null 2>&1 || true
fi
say "app image built in $((SECONDS - started))s; $APP_IMAGE is $((size / 1000000)) MB"

# --- 4. run it as an operator would --------------------------------------------------------------
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
INGEST_KEY=$("$PYTHON" -c 'import secrets; print(secrets.token_hex(16))')
export INGEST_KEY  # passed by name (-e INGEST_KEY), so the key never appears in a command line
run_env=()
[ -n "${EMBED_MODEL:-}" ] && run_env+=(-e "EMBED_MODEL=$EMBED_MODEL")
podman volume create "$VOLUME" > /dev/null
say "starting $CONTAINER on $url (volume $VOLUME, demo tokens read-only, root filesystem read-only${EMBED_MODEL:+, EMBED_MODEL=$EMBED_MODEL})"
# podman's stderr holds two harmless complaints where no systemd runs its health-check timers.
podman run -d --name "$CONTAINER" --read-only --read-only-tmpfs=false \
    -p "127.0.0.1:$port:8000" \
    -v "$VOLUME:/data/memories" \
    -v "$ROOT/examples/tokens.json:/app/examples/tokens.json:ro" \
    -e INGEST_KEY \
    -e AUTH_TOKENS_FILE=/app/examples/tokens.json \
    -e RECALL_K=3 -e RECALL_CANDIDATES=8 "${run_env[@]}" \
    "$APP_IMAGE" > /dev/null 2> "$WORK/run.log" \
    || { cat "$WORK/run.log" >&2; fail "podman run failed"; }

status_of() { # URL -> its HTTP status, 000 when nothing answers
    "$PYTHON" - "$1" <<'EOF'
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as response:
        print(response.status)
except urllib.error.HTTPError as error:
    print(error.code)
except OSError:
    print("000")
EOF
}
wait_healthy() {
    local deadline=$((SECONDS + WAIT_SECONDS))
    until [ "$(status_of "$url/healthz")" = 200 ]; do
        [ "$SECONDS" -lt "$deadline" ] || fail "/healthz did not answer 200 within ${WAIT_SECONDS}s"
        podman container exists "$CONTAINER" && [ "$(podman inspect --format '{{.State.Running}}' "$CONTAINER")" = true ] \
            || fail "the container stopped"
        sleep 1
    done
}
wait_healthy
say "/healthz answers 200"
readyz=$(status_of "$url/readyz")
[ "$readyz" = 200 ] || fail "/readyz answered $readyz, not 200"
say "/readyz answers 200"

uids=$(podman exec "$CONTAINER" cat /proc/1/status | awk '/^Uid:/ { print $2, $3, $4, $5 }')
[ -n "$uids" ] || fail "could not read the server process's uid"
for uid in $uids; do [ "$uid" != 0 ] || fail "the server process runs as root (Uid: $uids)"; done
say "the server process runs as uid ${uids%% *}, not root"
podman healthcheck run "$CONTAINER" > /dev/null 2>&1 || fail "the image's HEALTHCHECK fails"
say "the image's HEALTHCHECK passes"

say "seeding the demo from the host"
"$PYTHON" "$ROOT/seeds/seed.py" --url "$url" --wait "$WAIT_SECONDS" | sed 's/^/    /'

# The tool's fail-soft answers: neither counts as a recall, even where nothing is expected.
mapfile -t FAIL_SOFT < <(PYTHONPATH=$ROOT "$PYTHON" -c \
    'from recall.domain.answers import NO_MEMORY, UNAVAILABLE; print(NO_MEMORY); print(UNAVAILABLE)')
[ "${#FAIL_SOFT[@]}" = 2 ] || fail "could not read the tool's fail-soft answers from recall/"
recall_as() { # user query wanted... ; a wanted text that starts with ! must be absent
    local user=$1 query=$2 answer want
    shift 2
    answer=$("$PYTHON" "$ROOT/examples/search.py" --url "$url" --token "demo-token-$user" "$query") \
        || fail "$user could not recall '$query' through MCP"
    for want in "${FAIL_SOFT[@]}"; do
        [ "$answer" != "$want" ] || fail "$user asked '$query' and got: $answer"
    done
    for want in "$@"; do
        if [ "${want#!}" != "$want" ]; then
            [[ "$answer" != *"${want#!}"* ]] || fail "$user asked '$query' and got '${want#!}', not theirs"
        else
            [[ "$answer" == *"$want"* ]] || fail "$user asked '$query': no '$want' in: ${answer:0:400}"
        fi
    done
}
recall_both() {
    recall_as alice "N-11 upgrade" "$N11_DECISION"
    # (the other's text, not the identifier asked: "No earlier conversation mentions P-7." names it)
    recall_as alice "P-7 motor" '!drive-end' '!MT-5120'
    recall_as bob "P-7 motor" "P-7" "MT-5120"
    recall_as bob "N-11 upgrade" '!2,185' '!MT-4471'
    say "$1: alice recalls the N-11 decision, bob his P-7 motor chat, neither the other's"
}
recall_both "recall through MCP"

say "restarting the container"
podman restart --time 10 "$CONTAINER" > /dev/null 2>> "$WORK/run.log"
wait_healthy
recall_both "after the restart"
say "OK: $APP_IMAGE built, ran as uid ${uids%% *}, served both users, survived a restart"
