#!/usr/bin/env bash
# Runs a private containerd for DeltaBox development and tests, with its own
# root, state, sockets, config and log under $DELTABOX_DEV_ROOT/containerd
# (default /var/lib/deltabox-dev/containerd). Never touches a host containerd.
#
#   hack/containerd.sh start    start it (no-op when running); waits until it answers
#   hack/containerd.sh stop     SIGTERM, wait, SIGKILL after 15 s
#   hack/containerd.sh status   prints running/stopped; exit 0 when running, 3 when not
#   hack/containerd.sh address  prints the gRPC socket path
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DEV_ROOT="${DELTABOX_DEV_ROOT:-/var/lib/deltabox-dev}"
DIR="${DEV_ROOT}/containerd"
SOCK="${DIR}/containerd.sock"
CONFIG="${DIR}/config.toml"
LOG="${DIR}/containerd.log"
PIDFILE="${DIR}/containerd.pid"
START_TIMEOUT=20
STOP_TIMEOUT=15
export PATH="/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"

# CRIU runs under runc, under the shim, under this containerd, and inherits its environment.
# CRIU_FAULT=130 (FI_NO_BREAKPOINTS) makes CRIU stop a process leaving the parasite with
# PTRACE_SYSCALL instead of a hardware breakpoint: some virtual machines never deliver
# debug-register breakpoints, and every dump there hung in wait4 (a CI run's criu package
# hung 60 min). The syscall stop costs the same: the parasite's last step is a syscall
# (rt_sigreturn). The daemon refuses L3 on such a host when containerd lacks it (criu/bpcheck_linux.go).
CRIU_ENV="CRIU_FAULT=130"

# pid: prints the pid of our containerd when it is running.
pid() {
	local p
	[[ -f ${PIDFILE} ]] || return 1
	p=$(<"${PIDFILE}")
	[[ ${p} =~ ^[0-9]+$ && -d /proc/${p} ]] || return 1
	tr '\0' ' ' <"/proc/${p}/cmdline" | grep -q -- "containerd --config ${CONFIG}" || return 1
	echo "${p}"
}

answers() {
	ctr --address "${SOCK}" --timeout 2s version >/dev/null 2>&1
}

render_config() {
	local tmp="${CONFIG}.tmp"
	sed "s|@DIR@|${DIR}|g" "${HACK_DIR}/containerd-config.toml" >"${tmp}"
	if cmp -s "${tmp}" "${CONFIG}"; then
		rm -f "${tmp}"
	else
		log "writing ${CONFIG}"
		mv -f "${tmp}" "${CONFIG}"
		! pid >/dev/null || log "config changed while containerd runs: 'stop' then 'start' to apply it"
	fi
}

start() {
	step start "containerd on ${SOCK}"
	need_root
	have containerd || die "containerd not found; run hack/install-deps.sh"
	mkdir -p "${DIR}"
	render_config
	if pid >/dev/null && ! grep -qz "^${CRIU_ENV}\$" "/proc/$(pid)/environ"; then
		log "containerd (pid $(pid)) runs without ${CRIU_ENV}: restarting it"
		stop
	fi
	if pid >/dev/null; then
		if answers; then
			log "already running (pid $(pid)); nothing to do"
			return
		fi
		log "process $(pid) is up but the socket does not answer yet"
	else
		rm -f "${SOCK}" "${SOCK}.ttrpc"
		log "starting containerd (config ${CONFIG}, log ${LOG})"
		printf '\n=== %s hack/containerd.sh start\n' "$(date -Is)" >>"${LOG}"
		env "${CRIU_ENV}" setsid nohup containerd --config "${CONFIG}" >>"${LOG}" 2>&1 </dev/null &
		echo $! >"${PIDFILE}"
	fi
	local deadline=$((SECONDS + START_TIMEOUT))
	until answers; do
		if ! pid >/dev/null; then
			tail -n 30 "${LOG}" >&2
			die "containerd exited during start (log ${LOG})"
		fi
		if ((SECONDS >= deadline)); then
			tail -n 30 "${LOG}" >&2
			die "containerd did not answer on ${SOCK} within ${START_TIMEOUT}s (log ${LOG})"
		fi
		sleep 0.1
	done
	log "running (pid $(pid)); socket ${SOCK}"
}

stop() {
	step stop "containerd on ${SOCK}"
	local p
	if ! p=$(pid); then
		log "not running; nothing to do"
		rm -f "${PIDFILE}"
		return
	fi
	log "sending SIGTERM to ${p}"
	kill -TERM "${p}"
	local deadline=$((SECONDS + STOP_TIMEOUT))
	while [[ -d /proc/${p} ]]; do
		if ((SECONDS >= deadline)); then
			log "still running after ${STOP_TIMEOUT}s; sending SIGKILL"
			kill -KILL "${p}" 2>/dev/null || true
			break
		fi
		sleep 0.1
	done
	rm -f "${PIDFILE}"
	log "stopped"
}

status() {
	local p
	if p=$(pid) && answers; then
		echo "running (pid ${p}, socket ${SOCK})"
		exit 0
	fi
	echo "stopped"
	exit 3
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
address) echo "${SOCK}" ;;
*)
	echo "usage: $0 start|stop|status|address" >&2
	exit 2
	;;
esac
