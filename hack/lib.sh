# shellcheck shell=bash
# Shared helpers for the hack/ scripts. Source it; it sets strict mode and
# loads hack/versions.env.
set -Eeuo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"

DELTABOX_CACHE="${DELTABOX_CACHE:-/var/cache/deltabox}"
CURRENT_STEP="init"
SCRIPT_NAME="$(basename "$0")"

log() { printf '[%s] %s\n' "${SCRIPT_NAME}" "$*" >&2; }

# step NAME [description...]: names the step that a failure is reported against.
step() {
	CURRENT_STEP="$1"
	shift
	log "== ${CURRENT_STEP}${*:+: $*}"
}

die() {
	log "ERROR in step ${CURRENT_STEP}: $*"
	exit 1
}

_on_err() {
	local rc=$? cmd=$BASH_COMMAND line=${BASH_LINENO[0]}
	log "FAILED in step ${CURRENT_STEP} (exit ${rc}, line ${line}): ${cmd}"
	exit "${rc}"
}
trap _on_err ERR

need_root() {
	[[ ${EUID} -eq 0 ]] || die "must run as root"
}

have() { command -v "$1" >/dev/null 2>&1; }

# debian_mirror: the Debian archive URI this machine's apt uses.
debian_mirror() {
	local f uri=""
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
		[[ -f ${f} ]] || continue
		uri=$(grep -E '^(URIs:|deb )' "${f}" | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -n1 | tr -d ' ' || true)
		[[ -z ${uri} ]] || break
	done
	echo "${uri:-http://deb.debian.org/debian}"
}
