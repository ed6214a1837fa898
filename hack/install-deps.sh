#!/usr/bin/env bash
# Installs everything DeltaBox needs on a Debian 12 host (docs/design.md, "The stack"):
# apt packages, containerd + shim + ctr, runc, CRIU (built from Debian trixie's
# source), CNI plugins, versitygw, the distribution registry and staticcheck. Idempotent: binaries are
# cached under /var/cache/deltabox/bin and a second run only checks versions.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN_DIR=/usr/local/bin
CNI_DIR=/opt/cni/bin
BIN_CACHE="${DELTABOX_CACHE}/bin"
CRIU_SRC_LIST=/etc/apt/sources.list.d/deltabox-criu-src.sources
CHANGED=0

APT_PACKAGES=(
	iptables iproute2 debootstrap busybox-static libseccomp-dev pkg-config
	e2fsprogs # mkfs.ext4 for the sandboxes' size-limited disks ([sandbox] disk)
	python3 python3-venv # the Python SDK's suite (TestPythonSDK: a fresh venv, pip install --no-index)
	curl ca-certificates build-essential dpkg-dev xz-utils tar
	# CRIU build dependencies
	libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
	python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev
	libgnutls28-dev libnftables-dev uuid-dev
)
CNI_PLUGINS=(main/bridge ipam/host-local main/loopback meta/firewall meta/portmap)

export GOFLAGS=-buildvcs=false
export DEBIAN_FRONTEND=noninteractive
export PATH="${BIN_DIR}:${PATH}"

apt_install() {
	step apt "checking ${#APT_PACKAGES[@]} Debian packages"
	local missing=() p
	for p in "${APT_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	if ((${#missing[@]} == 0)); then
		log "all Debian packages already installed"
		return
	fi
	log "missing: ${missing[*]}"
	log "apt-get update"
	apt-get update -qq
	log "apt-get install ${missing[*]}"
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	CHANGED=1
}

# go_mod_version FILE: prints "<module path> <version>" recorded in a Go binary.
go_mod_version() {
	go version -m "$1" 2>/dev/null | awk '$1 == "mod" { print $2, $3; exit }'
}

go_build_tags() {
	go version -m "$1" 2>/dev/null | awk '$1 == "build" && $2 ~ /^-tags=/ { sub(/^-tags=/, "", $2); print $2 }'
}

# go_binary_ok FILE MODULE VERSION [TAGS]: true when FILE was built from MODULE@VERSION (with TAGS).
go_binary_ok() {
	local file=$1 mod=$2 ver=$3 tags=${4:-}
	[[ -x ${file} ]] || return 1
	[[ "$(go_mod_version "${file}")" == "${mod} ${ver}" ]] || return 1
	[[ -z ${tags} || ",$(go_build_tags "${file}")," == *",${tags},"* ]]
}

# install_cached NAME VERSION DESTDIR: copies the cached build into DESTDIR when it differs.
install_cached() {
	local name=$1 ver=$2 dest=$3
	local src="${BIN_CACHE}/${name}-${ver}"
	if cmp -s "${src}" "${dest}/${name}"; then
		return
	fi
	log "installing ${name} ${ver} -> ${dest}/${name}"
	install -D -m 0755 "${src}" "${dest}/${name}.tmp.$$"
	mv -f "${dest}/${name}.tmp.$$" "${dest}/${name}"
	CHANGED=1
}

# go_tool STEP MODULE VERSION DESTDIR TAGS PKG:NAME...: go installs the listed
# packages of MODULE@VERSION unless DESTDIR already holds that build.
go_tool() {
	local stepname=$1 mod=$2 ver=$3 dest=$4 tags=$5
	shift 5
	step "${stepname}" "${mod}@${ver}"
	local spec pkg name todo=() cached_all=1
	for spec in "$@"; do
		name=${spec##*:}
		if go_binary_ok "${dest}/${name}" "${mod}" "${ver}" "${tags}"; then
			continue
		fi
		todo+=("${spec}")
		go_binary_ok "${BIN_CACHE}/${name}-${ver}" "${mod}" "${ver}" "${tags}" || cached_all=0
	done
	if ((${#todo[@]} == 0)); then
		log "${mod} ${ver} already installed"
		return
	fi
	if ((cached_all == 0)); then
		local gobin pkgs=()
		gobin=$(mktemp -d)
		for spec in "${todo[@]}"; do pkgs+=("${spec%%:*}@${ver}"); done
		log "go install ${tags:+-tags ${tags} }${pkgs[*]}"
		GOBIN="${gobin}" go install ${tags:+-tags "${tags}"} "${pkgs[@]}"
		mkdir -p "${BIN_CACHE}"
		for spec in "${todo[@]}"; do
			pkg=${spec%%:*}
			mv -f "${gobin}/${pkg##*/}" "${BIN_CACHE}/${spec##*:}-${ver}"
		done
		rm -rf "${gobin}"
	else
		log "using cached builds from ${BIN_CACHE}"
	fi
	for spec in "${todo[@]}"; do install_cached "${spec##*:}" "${ver}" "${dest}"; done
}

install_go_tools() {
	local c=github.com/containerd/containerd/v2
	go_tool containerd "${c}" "${CONTAINERD_VERSION}" "${BIN_DIR}" "" \
		"${c}/cmd/containerd:containerd" \
		"${c}/cmd/containerd-shim-runc-v2:containerd-shim-runc-v2" \
		"${c}/cmd/ctr:ctr"
	go_tool runc github.com/opencontainers/runc "${RUNC_VERSION}" "${BIN_DIR}" seccomp \
		"github.com/opencontainers/runc:runc"
	local cni=github.com/containernetworking/plugins specs=() p
	for p in "${CNI_PLUGINS[@]}"; do specs+=("${cni}/plugins/${p}:${p##*/}"); done
	go_tool cni-plugins "${cni}" "${CNI_PLUGINS_VERSION}" "${CNI_DIR}" "" "${specs[@]}"
	go_tool versitygw github.com/versity/versitygw "${VERSITYGW_VERSION}" "${BIN_DIR}" "" \
		"github.com/versity/versitygw/cmd/versitygw:versitygw"
	go_tool distribution-registry github.com/distribution/distribution/v3 "${DISTRIBUTION_VERSION}" "${BIN_DIR}" "" \
		"github.com/distribution/distribution/v3/cmd/registry:distribution-registry"
	go_tool staticcheck honnef.co/go/tools "${STATICCHECK_VERSION}" "${BIN_DIR}" "" \
		"honnef.co/go/tools/cmd/staticcheck:staticcheck"
}

criu_version_of() {
	"$1" --version 2>/dev/null | awk '/^Version:/ { print $2; exit }'
}

build_criu() {
	local out=$1 work
	log "adding deb-src for ${CRIU_DEBIAN_SUITE} in ${CRIU_SRC_LIST}"
	cat >"${CRIU_SRC_LIST}" <<-SRC
		# Added by deltabox hack/install-deps.sh: CRIU ${CRIU_VERSION} source only.
		Types: deb-src
		URIs: $(debian_mirror)
		Suites: ${CRIU_DEBIAN_SUITE}
		Components: main
		Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
	SRC
	log "apt-get update (only ${CRIU_SRC_LIST})"
	apt-get update -qq -o Dir::Etc::sourcelist="${CRIU_SRC_LIST}" \
		-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0
	work=$(mktemp -d)
	chmod 0755 "${work}" # let apt's _apt user write downloads there
	log "apt-get source --download-only criu/${CRIU_DEBIAN_SUITE} (in ${work})"
	(cd "${work}" && apt-get source -qq --download-only "criu/${CRIU_DEBIAN_SUITE}") ||
		log "apt-get source reported an error; continuing if the orig tarball arrived"
	local orig
	orig=$(compgen -G "${work}/criu_${CRIU_VERSION}*.orig.tar.*" | head -n1) ||
		die "criu_${CRIU_VERSION} orig tarball not downloaded (is ${CRIU_DEBIAN_SUITE} still at ${CRIU_VERSION}?)"
	log "unpacking $(basename "${orig}")"
	mkdir "${work}/src"
	tar -xf "${orig}" -C "${work}/src" --strip-components=1
	local lock=NETWORK_LOCK_${CRIU_NETWORK_LOCK^^}
	log "make criu NETWORK_LOCK_DEFAULT=${lock} (this takes ~20 s)"
	make -C "${work}/src" -j"$(nproc)" criu NETWORK_LOCK_DEFAULT="${lock}" >"${work}/build.log" 2>&1 ||
		{ tail -n 30 "${work}/build.log" >&2; die "make criu failed"; }
	mkdir -p "$(dirname "${out}")"
	install -m 0755 "${work}/src/criu/criu" "${out}"
	rm -rf "${work}"
}

# The build's version names its network lock too: a cached or installed build of the same
# CRIU with another lock default is replaced (install_cached compares the files).
install_criu() {
	local build="${CRIU_VERSION}-${CRIU_NETWORK_LOCK}-lock"
	step criu "CRIU ${CRIU_VERSION} (network lock ${CRIU_NETWORK_LOCK})"
	local cached="${BIN_CACHE}/criu-${build}"
	if [[ "$(criu_version_of "${cached}")" != "${CRIU_VERSION}" ]]; then
		build_criu "${cached}"
	elif cmp -s "${cached}" "${BIN_DIR}/criu"; then
		log "criu ${build} already installed"
		return
	else
		log "using cached build ${cached}"
	fi
	install_cached criu "${build}" "${BIN_DIR}"
}

# check_go_bin NAME MODULE VERSION [TAGS] [DIR]: the binary on PATH (or in DIR) is that build.
check_go_bin() {
	local name=$1 mod=$2 ver=$3 tags=${4:-} dir=${5:-}
	local file=${dir:+${dir}/${name}}
	file=${file:-$(command -v "${name}" || true)}
	[[ -n ${file} ]] || die "${name} not found on PATH"
	go_binary_ok "${file}" "${mod}" "${ver}" "${tags}" || die "${file} is not ${mod}@${ver}${tags:+ with tags ${tags}}"
}

verify() {
	step verify "checking installed tools"
	local c=github.com/containerd/containerd/v2 out p
	check_go_bin containerd "${c}" "${CONTAINERD_VERSION}"
	check_go_bin containerd-shim-runc-v2 "${c}" "${CONTAINERD_VERSION}"
	check_go_bin ctr "${c}" "${CONTAINERD_VERSION}"
	out=$(containerd --version)
	log "containerd: ${out}"
	out=$(ctr --version)
	log "ctr: ${out}"
	containerd-shim-runc-v2 -v >/dev/null
	check_go_bin runc github.com/opencontainers/runc "${RUNC_VERSION}" seccomp
	out=$(runc --version)
	log "runc: ${out//$'\n'/; }"
	[[ ${out} == *libseccomp:* ]] || die "runc was built without seccomp support"
	out=$(criu --version)
	log "criu: ${out//$'\n'/; }"
	[[ "$(criu_version_of "$(command -v criu)")" == "${CRIU_VERSION}" ]] || die "criu on PATH is not ${CRIU_VERSION}"
	have iptables-restore || die "iptables-restore is not on PATH (restores of snapshots dumped with CRIU's iptables lock need it)"
	out=$(criu check 2>&1) || { printf '%s\n' "${out}" >&2; die "criu check failed"; }
	if [[ ${CRIU_NETWORK_LOCK} == nftables ]]; then
		criu check --feature network_lock_nftables >/dev/null 2>&1 || die "criu's nftables network lock does not work here (criu check --feature network_lock_nftables)"
	fi
	log "criu check: ${out##*$'\n'}"
	check_go_bin versitygw github.com/versity/versitygw "${VERSITYGW_VERSION}"
	out=$(versitygw --version 2>&1)
	log "versitygw: ${out//$'\n'/; }"
	check_go_bin distribution-registry github.com/distribution/distribution/v3 "${DISTRIBUTION_VERSION}"
	check_go_bin staticcheck honnef.co/go/tools "${STATICCHECK_VERSION}"
	out=$(staticcheck -version)
	log "staticcheck: ${out}"
	for p in "${CNI_PLUGINS[@]}"; do
		[[ -x "${CNI_DIR}/${p##*/}" ]] || die "CNI plugin ${CNI_DIR}/${p##*/} is missing or not executable"
		check_go_bin "${p##*/}" github.com/containernetworking/plugins "${CNI_PLUGINS_VERSION}" "" "${CNI_DIR}"
	done
	log "CNI plugins ${CNI_PLUGINS_VERSION}: ${CNI_PLUGINS[*]##*/} in ${CNI_DIR}"
}

main() {
	need_root
	step preflight "checking Go toolchain"
	have go || die "go is not on PATH (Go 1.26 is required)"
	log "$(go version)"
	apt_install
	install_go_tools
	install_criu
	verify
	if ((CHANGED == 0)); then
		log "nothing to do: everything already installed at the pinned versions"
	else
		log "done: dependencies installed"
	fi
}

main "$@"
