#!/usr/bin/env bash
# Installs the pinned npm dependencies (package-lock.json) of the TypeScript packages under sdk/
# and builds them: hack/npm.sh [DIR...] (default: every sdk/* with a package.json). npm's cache
# lives in ${DELTABOX_CACHE}/npm, so a second run needs no network; a package whose lock file
# and sources did not change since its last build is skipped. Needs Node 20+ and npm.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROOT="$(cd "${HACK_DIR}/.." && pwd)"
NPM_CACHE="${DELTABOX_CACHE}/npm"

step node "checking Node and npm"
have node || die "node is not installed (the TypeScript SDK needs Node ${NODE_MIN_MAJOR}+)"
have npm || die "npm is not installed"
major=$(node -p 'process.versions.node.split(".")[0]')
((major >= NODE_MIN_MAJOR)) || die "node $(node --version) is too old: the TypeScript SDK needs Node ${NODE_MIN_MAJOR}+"

dirs=("$@")
if ((${#dirs[@]} == 0)); then
	# The SDK first: the other packages depend on it (file:../typescript).
	dirs=("${ROOT}/sdk/typescript")
	for f in "${ROOT}"/sdk/*/package.json; do
		[[ ${f} == "${ROOT}/sdk/typescript/package.json" ]] || dirs+=("$(dirname "${f}")")
	done
fi

# fingerprint DIR: a hash of what a build of DIR depends on.
fingerprint() {
	(cd "$1" && find package.json package-lock.json tsconfig*.json src -type f 2>/dev/null | sort | xargs sha256sum; node --version) | sha256sum | cut -d' ' -f1
}

mkdir -p "${NPM_CACHE}"
for dir in "${dirs[@]}"; do
	dir="$(cd "${dir}" && pwd)"
	name="${dir#"${ROOT}/"}"
	stamp="${dir}/node_modules/.deltabox-build"
	fp=$(fingerprint "${dir}")
	if [[ -f ${stamp} && $(cat "${stamp}") == "${fp}" ]] && { [[ -d ${dir}/dist ]] || ! grep -q '"build"' "${dir}/package.json"; }; then
		log "${name}: up to date"
		continue
	fi
	step "${name}" "npm ci (cache ${NPM_CACHE})"
	(cd "${dir}" && npm ci --cache "${NPM_CACHE}" --prefer-offline --no-audit --no-fund --loglevel=error >&2)
	if (cd "${dir}" && node -e 'process.exit(require(process.cwd() + "/package.json").scripts?.build ? 0 : 1)'); then
		step "${name}" "npm run build"
		(cd "${dir}" && npm run --silent build >&2)
	fi
	echo "${fp}" >"${stamp}"
done
