#!/usr/bin/env bash
# Installs the pinned Temporal CLI (TEMPORAL_CLI_VERSION in versions.env), whose
# `temporal server start-dev` is the Temporal server of the multi-node pipeline
# test (integration/scaleout_test.go). Idempotent: the build is cached under
# /var/cache/deltabox/bin and a second run only checks the version (~4 min cold).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MOD=github.com/temporalio/cli
BIN_DIR=${TEMPORAL_BIN_DIR:-/usr/local/bin}
CACHED="${DELTABOX_CACHE}/bin/temporal-${TEMPORAL_CLI_VERSION}"
export GOFLAGS=-buildvcs=false

# built_from FILE: true when FILE is a Go binary built from MOD@TEMPORAL_CLI_VERSION.
built_from() {
	[[ -x $1 ]] || return 1
	[[ "$(go version -m "$1" 2>/dev/null | awk '$1 == "mod" { print $2, $3; exit }')" == "${MOD} ${TEMPORAL_CLI_VERSION}" ]]
}

main() {
	step temporal "${MOD}@${TEMPORAL_CLI_VERSION}"
	have go || die "go is not on PATH"
	if built_from "${BIN_DIR}/temporal"; then
		log "temporal ${TEMPORAL_CLI_VERSION} already installed"
		return
	fi
	if ! built_from "${CACHED}"; then
		local gobin
		gobin=$(mktemp -d)
		log "go install ${MOD}/cmd/temporal@${TEMPORAL_CLI_VERSION} (about 4 min)"
		GOBIN="${gobin}" go install "${MOD}/cmd/temporal@${TEMPORAL_CLI_VERSION}"
		mkdir -p "$(dirname "${CACHED}")"
		mv -f "${gobin}/temporal" "${CACHED}"
		rm -rf "${gobin}"
	else
		log "using cached build ${CACHED}"
	fi
	install -D -m 0755 "${CACHED}" "${BIN_DIR}/temporal.tmp.$$"
	mv -f "${BIN_DIR}/temporal.tmp.$$" "${BIN_DIR}/temporal"
	built_from "${BIN_DIR}/temporal" || die "${BIN_DIR}/temporal is not ${MOD}@${TEMPORAL_CLI_VERSION}"
	log "installed $("${BIN_DIR}/temporal" --version)"
}

main "$@"
