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

# The E2B SDK (test/e2b, the bench's e2b scenario) needs Node.js 20.18.1 or
# later, and Debian bookworm's is 18: scripts/setup then installs a newer
# one from the npm registry (the node-linux-<arch> package, a plain node
# binary) into SDK_NODE_DIR, and scripts/test and scripts/bench name it in
# BOXRT_SDK_NODE (use_sdk_node), which runs the SDK's scripts (npm keeps
# running on the machine's node).
SDK_NODE_VERSION=22.23.5
if is_root; then SDK_NODE_DIR=/var/cache/boxrt-node; else SDK_NODE_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/boxrt-node; fi

# node_fits_sdk is true when the node named $1 (default: node on PATH)
# satisfies the SDK's engines field, ">=20.18.1 <21 || >=22".
node_fits_sdk() {
	local v major minor patch
	v=$("${1:-node}" --version 2>/dev/null) || return 1
	IFS=. read -r major minor patch <<<"${v#v}"
	patch=${patch%%[!0-9]*}
	((major >= 22 || (major == 20 && (minor > 18 || (minor == 18 && ${patch:-0} >= 1)))))
}

# ensure_sdk_node installs the SDK's Node.js into SDK_NODE_DIR when the
# machine's is too old (npm, Debian's, must be there).
ensure_sdk_node() {
	node_fits_sdk && return 0
	node_fits_sdk "$SDK_NODE_DIR/bin/node" && return 0
	local arch
	case $(uname -m) in
	x86_64) arch=x64 ;;
	aarch64) arch=arm64 ;;
	*) log "no Node.js package for $(uname -m): the E2B SDK's tests will fail on node $(node --version)"; return 0 ;;
	esac
	log "node $(node --version) is older than the E2B SDK needs (20.18.1): installing node $SDK_NODE_VERSION into $SDK_NODE_DIR"
	mkdir -p "$SDK_NODE_DIR"
	npm install --no-audit --no-fund --no-save --prefix "$SDK_NODE_DIR/pkg" "node-linux-$arch@$SDK_NODE_VERSION" >&2
	ln -sfn "pkg/node_modules/node-linux-$arch/bin" "$SDK_NODE_DIR/bin.tmp"
	mv -T "$SDK_NODE_DIR/bin.tmp" "$SDK_NODE_DIR/bin"
	node_fits_sdk "$SDK_NODE_DIR/bin/node" || die "the installed $SDK_NODE_DIR/bin/node does not run"
}

# use_sdk_node exports BOXRT_SDK_NODE, the node that runs the SDK's
# scripts: the machine's when it fits, else the one setup installed.
use_sdk_node() {
	if ! node_fits_sdk && [[ -x $SDK_NODE_DIR/bin/node ]]; then
		export BOXRT_SDK_NODE=$SDK_NODE_DIR/bin/node
	else
		export BOXRT_SDK_NODE=node
	fi
}

# default_state_dir prints the state directory boxrt uses when --state-dir
# is not given; it mirrors defaultStateDir in internal/cli/flags.go.
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

# runsc_needs_network_host is true for a runsc older than release-20240801
# (Debian's 0.0~2022… included) on a kernel that shows
# /proc/sys/net/core/rmem_default in every network namespace: such a runsc
# takes every namespace for the host's and refuses to start a container.
runsc_needs_network_host() {
	local date
	date=$(runsc --version 2>/dev/null | head -1 | grep -oE '[0-9]{8}' | head -1)
	[[ -n $date ]] && ((date < 20240801)) || return 1
	unshare -n test -e /proc/sys/net/core/rmem_default
}

# dockerd_pid prints the pid of the running dockerd, if any.
dockerd_pid() {
	local pid
	pid=$(cat /var/run/docker.pid 2>/dev/null) && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# configure_dockerd merges boxrt's keys into /etc/docker/daemon.json
# (scripts/docker-daemon-config: experimental, the runsc runtime) and, when
# a dockerd already runs, applies a change the cheapest way: SIGHUP when only
# runtimes changed (containers keep running), a restart when experimental
# changed (dockerd reads it only at start; containers without a restart
# policy stop). Setup time only; a dockerd that is not running yet just
# reads the file when ensure_dockerd starts it.
configure_dockerd() {
	is_root || { log "not root: leaving /etc/docker/daemon.json alone"; return 0; }
	local flags=() action pid
	runsc_needs_network_host && flags+=(--runsc-network-host)
	action=$(scripts/docker-daemon-config --runsc "$(command -v runsc)" "${flags[@]}" | tail -1)
	pid=$(dockerd_pid) || return 0
	case $action in
	reload)
		log "daemon.json: runtimes changed, reloading dockerd (SIGHUP)"
		kill -HUP "$pid"
		for _ in $(seq 1 20); do
			docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q -- '--host-uds=open' && return 0
			sleep 0.5
		done
		die "dockerd did not pick up the runsc runtime after SIGHUP (see its log)"
		;;
	restart)
		log "daemon.json: experimental changed, restarting dockerd (running containers stop)"
		if command -v systemctl >/dev/null && systemctl is-active --quiet docker 2>/dev/null; then
			systemctl restart docker
		else
			kill -TERM "$pid"
			for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
			kill -0 "$pid" 2>/dev/null && die "dockerd (pid $pid) did not stop in 30 s"
		fi
		;;
	esac
}

# PODMAN_SOCKET is where Podman's Docker-compatible API listens (Podman's
# own default for root); DOCKER_HOST=unix://$PODMAN_SOCKET points boxrt's
# docker backend at it.
PODMAN_SOCKET=/run/podman/podman.sock

# PODMAN_CONF is the containers.conf the API service runs with
# (CONTAINERS_CONF): runc as the OCI runtime, since crun refuses this host's
# hybrid cgroup v1/v2 layout ("cgroups in hybrid mode not supported"), and
# default ulimits the service can really grant. Podman asks for
# nofile/nproc of up to 1048576 while its own hard limits here are lower
# (RLIMIT_NPROC 32768 in the service process), and root without
# CAP_SYS_RESOURCE (as on these VMs) cannot raise them: every container
# then fails with "error setting rlimits … operation not permitted".
PODMAN_CONF=/etc/boxrt/podman-containers.conf
# PODMAN_SECCOMP is Podman's default seccomp profile without user
# namespaces, mount and setns (scripts/podman-seccomp says why).
PODMAN_SECCOMP=/etc/boxrt/podman-seccomp.json

# write_podman_conf writes PODMAN_SECCOMP and PODMAN_CONF (temp names, then
# rename); it prints "changed" when either changed.
write_podman_conf() {
	local nofile nproc want before
	before=$(cat "$PODMAN_SECCOMP" 2>/dev/null | md5sum)
	scripts/podman-seccomp "$PODMAN_SECCOMP"
	[[ $(md5sum <"$PODMAN_SECCOMP") == "$before" ]] || echo changed
	nofile=$(ulimit -Hn)
	nproc=$(ulimit -Hu)
	[[ $nofile == unlimited ]] && nofile=1048576
	[[ $nproc == unlimited ]] || ((nproc > 32768)) && nproc=32768
	want=$(printf '%s\n' '# Written by boxrt scripts/setup for `podman system service`; see scripts/lib.sh.' \
		'[containers]' "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]" \
		"seccomp_profile = \"$PODMAN_SECCOMP\"" \
		'[engine]' 'runtime = "runc"')
	[[ -f $PODMAN_CONF && $(cat "$PODMAN_CONF") == "$want" ]] && return 0
	mkdir -p "$(dirname "$PODMAN_CONF")"
	printf '%s\n' "$want" >"$PODMAN_CONF.tmp"
	mv "$PODMAN_CONF.tmp" "$PODMAN_CONF"
	echo changed
}

podman_answers() { curl -sf --unix-socket "$PODMAN_SOCKET" http://d/_ping >/dev/null 2>&1; }

# ensure_podman_service starts `podman system service` on PODMAN_SOCKET
# with PODMAN_CONF when nothing answers there; one that answers is restarted
# only when PODMAN_CONF changed and it was started by this function
# (its pid file). Log: /var/log/boxrt-podman.log.
ensure_podman_service() {
	is_root || { podman_answers && return 0; die "Podman's API socket $PODMAN_SOCKET does not answer and we are not root"; }
	local changed pidfile=/run/boxrt-podman.pid pid
	changed=$(write_podman_conf)
	if podman_answers; then
		[[ -z $changed ]] && return 0
		pid=$(cat "$pidfile" 2>/dev/null) && kill -0 "$pid" 2>/dev/null || return 0
		log "restarting podman system service (pid $pid) for the new $PODMAN_CONF"
		kill -TERM "$pid"
		for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
	fi
	mkdir -p "$(dirname "$PODMAN_SOCKET")"
	log "starting podman system service on $PODMAN_SOCKET (log: /var/log/boxrt-podman.log)"
	# In the socket's directory: conmon writes an "oom" file into the
	# service's working directory when a container is OOM-killed.
	(cd "$(dirname "$PODMAN_SOCKET")" && CONTAINERS_CONF=$PODMAN_CONF exec nohup podman system service --time=0 "unix://$PODMAN_SOCKET" >/var/log/boxrt-podman.log 2>&1) &
	echo $! >"$pidfile"
	for _ in $(seq 1 60); do
		podman_answers && return 0
		sleep 0.5
	done
	tail -20 /var/log/boxrt-podman.log >&2 || true
	die "podman system service did not answer in 30 s"
}

# podman_import copies an image from dockerd into Podman's store unless
# Podman already has one with the same id.
podman_import() {
	local ref=$1 want have
	want=$(docker image inspect --format '{{.Id}}' "$ref") || die "$ref is not in dockerd; build it first"
	have=$(podman image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)
	[[ "sha256:$have" == "$want" || "$have" == "$want" ]] && return 0
	log "importing $ref into Podman's store"
	docker save "$ref" | podman load -q >/dev/null
}
