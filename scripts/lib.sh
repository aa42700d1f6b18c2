# shellcheck shell=bash disable=SC2034 # variables are used by the scripts that source this file
# Shared helpers for boxrt's scripts. Source it; it changes nothing by itself.

export PATH="$PATH:/usr/local/go/bin:$HOME/go/bin"

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 1; }

is_root() { [[ $(id -u) == 0 ]]; }

# need_pkgs installs the Debian packages that are missing (root only).
need_pkgs() {
	local missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	((${#missing[@]} == 0)) && return 0
	is_root || die "missing packages: ${missing[*]} (run as root, or: sudo apt-get install -y ${missing[*]})"
	log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# ensure_dockerd starts dockerd when no engine answers, and waits for it.
ensure_dockerd() {
	docker info >/dev/null 2>&1 && return 0
	is_root || die "no Docker engine answers and we are not root: start dockerd or set DOCKER_HOST"
	log "starting dockerd (log: /var/log/boxrt-dockerd.log)"
	nohup dockerd >/var/log/boxrt-dockerd.log 2>&1 &
	for _ in $(seq 1 60); do
		docker info >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	tail -20 /var/log/boxrt-dockerd.log >&2 || true
	die "dockerd did not come up in 30 s"
}

# The images the scripts build, and the label every one of them carries so
# scripts/clean can find them whatever their tag (build-image --tag).
TEST_IMAGE=${BOXRT_TEST_IMAGE:-boxrt-test:busybox}
SANDBOX_IMAGE=boxrt-sandbox:latest
IMAGE_LABEL=boxrt.built-by=boxrt-scripts

# default_state_dir prints the state directory boxrt uses when --state-dir
# is not given; it mirrors defaultStateDir in serve.go.
default_state_dir() {
	if [[ -n ${BOXRT_STATE_DIR:-} ]]; then
		echo "$BOXRT_STATE_DIR"
	elif is_root; then
		echo /var/lib/boxrt
	elif [[ -n ${XDG_STATE_HOME:-} ]]; then
		echo "$XDG_STATE_HOME/boxrt"
	elif [[ -n ${HOME:-} ]]; then
		echo "$HOME/.local/state/boxrt"
	else
		echo "${TMPDIR:-/tmp}/boxrt"
	fi
}

# elapsed prints the seconds since $1 (a $SECONDS value) as "1 min 5 s".
elapsed() {
	local s=$((SECONDS - $1))
	if ((s >= 60)); then echo "$((s / 60)) min $((s % 60)) s"; else echo "$s s"; fi
}
