#!/usr/bin/env bash
# Installs the real e2b JS SDK (E2B_SDK_VERSION, locked by integration/e2b/package-lock.json)
# into the cache for the E2B-compatibility tests (integration/e2b_test.go), with npm ci.
# Needs Node.js 20 or later (NODE_MIN_MAJOR, as hack/npm.sh; the e2b SDK needs 20).
#
#   hack/e2b-sdk.sh          install (a second run with the same lock file does nothing)
#   hack/e2b-sdk.sh path     print the node_modules directory (NODE_PATH for the tests)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SRC="${HACK_DIR}/../integration/e2b"
LOCK_KEY="$(cat "${SRC}/package.json" "${SRC}/package-lock.json" | sha256sum | cut -c1-16)"
DEST="${DELTABOX_CACHE}/e2b-sdk/e2b-${E2B_SDK_VERSION}-${LOCK_KEY}"

if [[ ${1:-} == path ]]; then
	echo "${DEST}/node_modules"
	exit 0
fi

step node "Node.js ${NODE_MIN_MAJOR}+ and npm"
have node || die "node is not installed (the e2b SDK needs Node ${NODE_MIN_MAJOR}+)"
have npm || die "npm is not installed"
major="$(node -p 'process.versions.node.split(".")[0]')"
[[ ${major} -ge ${NODE_MIN_MAJOR} ]] || die "node $(node --version) is too old: the e2b SDK needs Node ${NODE_MIN_MAJOR}+"

step sdk "e2b ${E2B_SDK_VERSION} in ${DEST}"
installed="$(node -p "require('${DEST}/node_modules/e2b/package.json').version" 2>/dev/null || true)"
if [[ ${installed} == "${E2B_SDK_VERSION}" ]]; then
	log "e2b ${installed} already installed; nothing to do"
	exit 0
fi
grep -q "\"e2b\": \"${E2B_SDK_VERSION}\"" "${SRC}/package.json" ||
	die "integration/e2b/package.json does not pin e2b ${E2B_SDK_VERSION} (hack/versions.env)"
tmp="${DEST}.tmp.$$"
rm -rf "${tmp}"
mkdir -p "${tmp}"
cp "${SRC}/package.json" "${SRC}/package-lock.json" "${tmp}/"
log "npm ci (e2b ${E2B_SDK_VERSION})"
(cd "${tmp}" && npm ci --cache "${DELTABOX_CACHE}/npm" --ignore-scripts --no-audit --no-fund --loglevel=error)
rm -rf "${DEST}"
mv "${tmp}" "${DEST}"
log "installed e2b $(node -p "require('${DEST}/node_modules/e2b/package.json').version")"
