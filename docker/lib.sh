# shellcheck shell=bash
# Shared by docker/build and docker/e2e: the Docker engine and client this deployment is built and proven with.
# Sourced, not run. Debian's docker.io (dockerd 20.10, its `docker` client with BuildKit) and docker-compose 1.29.
#
#   ensure_docker        install docker.io / docker-compose / debootstrap when missing (as root), start dockerd when
#                        nothing answers on its socket; a dockerd started here is stopped by stop_own_dockerd
#   stop_own_dockerd     stops the dockerd this shell started (by PID), nothing else
#   build_hosts          --add-host NAME:IP for the package hosts, as this host resolves them
#   compose ARGS...      docker-compose with this deployment's file, project name and env file

DOCKER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$DOCKER_DIR/.." && pwd)
DOCKER=/usr/bin/docker # Debian's client: BuildKit included (the one under /usr/local may have no buildx)
DOCKER_PACKAGES=(docker.io docker-compose debootstrap)
OWN_DOCKERD_PID=""
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/fleet-doctor-dockerd.log}

say() { printf '[docker] %s\n' "$*" >&2; }
die() {
  say "$*"
  exit 1
}

ensure_docker() {
  local missing=() p
  for p in "${DOCKER_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing Debian packages (run as root to install): apt-get install -y ${missing[*]}"
    say "installing ${missing[*]}"
    local policy=/usr/sbin/policy-rc.d own_policy=0 rc=0
    if [ ! -e "$policy" ]; then # no service starts on install: dockerd is started below, on our terms
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
    if [ $rc != 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get update -qq && rc=0
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
        rc=$?
    fi
    [ $own_policy = 1 ] && rm -f "$policy"
    [ $rc = 0 ] || die "apt-get install ${missing[*]} failed ($rc)"
  fi
  if "$DOCKER" info >/dev/null 2>&1; then
    return
  fi
  [ "$(id -u)" = 0 ] || die "no Docker engine answers on /var/run/docker.sock, and only root may start one here"
  say "starting dockerd (no default bridge: every container here uses the host's network), log $DOCKERD_LOG"
  # --bridge=none: no docker0 and no address from a private range; builds and containers use the host network
  setsid dockerd --bridge=none >>"$DOCKERD_LOG" 2>&1 </dev/null &
  OWN_DOCKERD_PID=$!
  local i
  for i in $(seq 1 60); do
    "$DOCKER" info >/dev/null 2>&1 && return
    kill -0 "$OWN_DOCKERD_PID" 2>/dev/null || die "dockerd exited: $(tail -5 "$DOCKERD_LOG")"
    sleep 1
  done
  die "dockerd did not answer within 60 s: $(tail -5 "$DOCKERD_LOG")"
}

stop_own_dockerd() {
  [ -n "$OWN_DOCKERD_PID" ] || return 0
  say "stopping the dockerd started here (pid $OWN_DOCKERD_PID)"
  kill "$OWN_DOCKERD_PID" 2>/dev/null || true
  local i
  for i in $(seq 1 30); do
    kill -0 "$OWN_DOCKERD_PID" 2>/dev/null || {
      OWN_DOCKERD_PID=""
      return 0
    }
    sleep 1
  done
  kill -9 "$OWN_DOCKERD_PID" 2>/dev/null || true
  OWN_DOCKERD_PID=""
}

# The package hosts a build reaches: Debian's mirrors (apt's sources on this host) and the Python package index
# (pip's configured index, else pip's own default and its file host). Each is passed as this host resolves it.
package_hosts() {
  {
    grep -rhoE '^(URIs:|deb(-src)?)[[:space:]]+[^ ]+' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
      /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{print $2}'
    "$REPO/.venv/bin/python" - <<'PY' 2>/dev/null || python3 - <<'PY2' 2>/dev/null
import subprocess, sys
from pip._internal.models.index import PyPI
out = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True)
print(out.stdout.strip() or PyPI.simple_url)
print("https://" + PyPI.file_storage_domain + "/")
PY
from pip._internal.models.index import PyPI
print(PyPI.simple_url)
print("https://" + PyPI.file_storage_domain + "/")
PY2
  } | sed -nE 's#^[a-z+]+://([^/:@]+@)?([^/:]+).*#\2#p' | sort -u
}

build_hosts() {
  local h ip
  for h in $(package_hosts); do
    ip=$(getent hosts "$h" | awk '{print $1; exit}')
    [ -n "$ip" ] && printf -- '--add-host %s:%s ' "$h" "$ip"
  done
}

compose() {
  local env_file=${FLEET_DOCTOR_DOCKER_ENV:-$DOCKER_DIR/.env}
  [ -f "$env_file" ] || die "no env file $env_file: copy docker/.env.example to docker/.env and fill it in"
  docker-compose --project-name "${COMPOSE_PROJECT_NAME:-fleet-doctor}" --project-directory "$DOCKER_DIR" \
    --env-file "$env_file" -f "$DOCKER_DIR/compose.yaml" "$@"
}
