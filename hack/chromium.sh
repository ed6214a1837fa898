#!/usr/bin/env bash
# Installs Debian's chromium (CHROMIUM_VERSION) for the browser test of `deltabox ui`
# (integration/ui_test.go, headless). Idempotent: a second run with chromium installed does
# nothing.
#
#   hack/chromium.sh          install
#   hack/chromium.sh path     print the chromium binary
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ ${1:-} == path ]]; then
	command -v chromium || true
	exit 0
fi

step chromium "Debian's chromium ${CHROMIUM_VERSION} (headless browser test of deltabox ui)"
installed="$(dpkg-query -W -f '${Version}' chromium 2>/dev/null || true)"
if [[ -n ${installed} ]] && have chromium; then
	log "chromium ${installed} already installed; nothing to do"
	exit 0
fi
need_root
apt-get -o DPkg::Lock::Timeout=600 update -qq
if ! apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "chromium=${CHROMIUM_VERSION}" >/dev/null; then
	# Debian replaces a security-updated package in place; the pinned version may be gone.
	log "chromium ${CHROMIUM_VERSION} is not available; installing the suite's current one"
	apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium >/dev/null
fi
log "chromium $(dpkg-query -W -f '${Version}' chromium) installed"
