#!/usr/bin/env bash
# Builds DeltaBox's test images without a registry and imports them into the
# private containerd (hack/containerd.sh), namespace "deltabox":
#
#   deltabox.local/busybox:latest  busybox-static, its applets, /tmp, /etc/passwd, /etc/group
#   deltabox.local/python:3        debootstrap --variant=minbase bookworm + python3, pip, git, curl, ca-certificates
#                                  (pip installs system-wide: the sandbox is the environment)
#
# Each image is a single uncompressed layer in an OCI archive, cached under
# /var/cache/deltabox/images keyed by a hash of its recipe. A second run does
# nothing when containerd already holds the same image; with the archive cached
# but containerd new, it only imports.
#
#   hack/images.sh            build (if needed) and import both images
#   hack/images.sh busybox    only the busybox image (or: python)
#   hack/images.sh verify     run a command in each image
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NS=deltabox
BUSYBOX_REF=deltabox.local/busybox:latest
PYTHON_REF=deltabox.local/python:3
IMAGE_CACHE="${DELTABOX_CACHE}/images"
# Fixed timestamp for image metadata; file mtimes are clamped to it.
SOURCE_DATE_EPOCH=1747699200 # 2025-05-20T00:00:00Z
CREATED=2025-05-20T00:00:00Z
DEFAULT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH="/usr/local/bin:${PATH}"

WORK=""
cleanup() {
	[[ -z ${WORK} ]] || rm -rf "${WORK}"
}
trap cleanup EXIT

# ctr_ns ARGS...: ctr against the private containerd, namespace deltabox,
# without the cgroup v1 deprecation notice it prints on every call here.
ctr_ns() {
	ctr --address "${ADDRESS}" -n "${NS}" "$@" 2> >(grep -v 'DEPRECATION: The support for cgroup v1' >&2 || true)
}

# recipe_key NAME EXTRA...: a short hash of everything the image is built from.
recipe_key() {
	{
		cat "${HACK_DIR}/images.sh" "${HACK_DIR}/versions.env"
		printf '%s\n' "$@"
	} | sha256sum | cut -c1-16
}

# tar_dir DIR OUT: a reproducible tar of DIR's contents.
tar_dir() {
	tar --create --file="$2" --directory="$1" \
		--sort=name --format=posix --numeric-owner \
		--mtime="@${SOURCE_DATE_EPOCH}" --clamp-mtime \
		--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
		.
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }

# add_blob LAYOUT FILE: moves FILE into LAYOUT's blob store; prints its digest.
add_blob() {
	local d
	d=$(sha256_of "$2")
	mkdir -p "$1/blobs/sha256"
	mv -f "$2" "$1/blobs/sha256/${d}"
	echo "${d}"
}

# write_oci_archive ROOTFS REF CMD_JSON ENV_JSON OUT: packs ROOTFS as a
# one-layer OCI image named REF into the archive OUT.
write_oci_archive() {
	local rootfs=$1 ref=$2 cmd=$3 env=$4 out=$5
	local layout="${WORK}/layout" layer cfg man
	mkdir -p "${layout}"
	log "packing layer from ${rootfs}"
	tar_dir "${rootfs}" "${WORK}/layer.tar"
	local layer_size
	layer_size=$(size_of "${WORK}/layer.tar")
	layer=$(add_blob "${layout}" "${WORK}/layer.tar")
	log "layer sha256:${layer} ($((layer_size / 1024 / 1024)) MiB)"

	printf '{"created":"%s","architecture":"amd64","os":"linux","config":{"Env":%s,"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"%s","created_by":"deltabox hack/images.sh"}]}' \
		"${CREATED}" "${env}" "${cmd}" "${layer}" "${CREATED}" >"${WORK}/config.json"
	local cfg_size
	cfg_size=$(size_of "${WORK}/config.json")
	cfg=$(add_blob "${layout}" "${WORK}/config.json")

	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
		"${cfg}" "${cfg_size}" "${layer}" "${layer_size}" >"${WORK}/manifest.json"
	local man_size
	man_size=$(size_of "${WORK}/manifest.json")
	man=$(add_blob "${layout}" "${WORK}/manifest.json")

	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
		"${man}" "${man_size}" "${ref}" "${ref##*:}" >"${layout}/index.json"
	printf '{"imageLayoutVersion":"1.0.0"}' >"${layout}/oci-layout"

	tar_dir "${layout}" "${out}.tmp"
	mv -f "${out}.tmp" "${out}"
	echo "sha256:${man}" >"${out%.tar}.digest"
	log "wrote ${out} (manifest sha256:${man})"
}

build_busybox_rootfs() {
	local root=$1 applet
	local bb=/bin/busybox
	if [[ ! -x ${bb} ]] || ! "${bb}" --list-full >/dev/null; then
		die "busybox-static missing; run hack/install-deps.sh"
	fi
	log "populating busybox rootfs from ${bb} ($("${bb}" 2>&1 | sed -n 1p))"
	mkdir -p "${root}"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,root,proc,sys,dev,var/tmp}
	chmod 1777 "${root}/tmp" "${root}/var/tmp"
	chmod 0700 "${root}/root"
	install -m 0755 "${bb}" "${root}/bin/busybox"
	while read -r applet; do
		[[ ${applet} == bin/busybox ]] && continue
		mkdir -p "${root}/$(dirname "${applet}")"
		ln -sfn /bin/busybox "${root}/${applet}"
	done < <("${bb}" --list-full)
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"${root}/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"${root}/etc/group"
}

build_python_rootfs() {
	local root=$1 mirror
	mirror=$(debian_mirror)
	have debootstrap || die "debootstrap missing; run hack/install-deps.sh"
	log "debootstrap --variant=minbase ${PYTHON_IMAGE_SUITE} from ${mirror} (takes a few minutes)"
	debootstrap --variant=minbase --include=python3,python3-pip,git,curl,ca-certificates \
		"${PYTHON_IMAGE_SUITE}" "${root}" "${mirror}" >"${WORK}/debootstrap.log" 2>&1 ||
		{ tail -n 30 "${WORK}/debootstrap.log" >&2; die "debootstrap failed"; }
	log "stripping apt lists and caches, docs, man pages, locales, logs"
	(
		cd "${root}"
		rm -rf var/lib/apt/lists/* var/cache/apt/* var/cache/debconf/*-old \
			usr/share/doc/* usr/share/man/* usr/share/info/* usr/share/locale/* \
			usr/share/lintian/* var/log/* dev/* run/* tmp/* var/tmp/* debootstrap
	)
	: >"${root}/etc/machine-id"
	# Debian marks its python as externally managed (PEP 668); in a throwaway sandbox, `pip
	# install` going to the system is what agents expect.
	printf '[global]\nbreak-system-packages = true\n' >"${root}/etc/pip.conf"
	[[ -x ${root}/usr/bin/git && -x ${root}/usr/bin/pip3 ]] || die "python rootfs has no git or pip3"
	[[ -s ${root}/etc/ssl/certs/ca-certificates.crt ]] || die "python rootfs has no /etc/ssl/certs/ca-certificates.crt"
	grep -q '^root:' "${root}/etc/passwd" || die "python rootfs has no /etc/passwd"
	local size
	size=$(du -sm "${root}" | cut -f1)
	log "python rootfs is ${size} MiB"
	((size < 250)) || die "python rootfs is ${size} MiB, over the 250 MiB budget"
}

# prune_cache NAME KEY: removes NAME's cached archives of other recipes.
prune_cache() {
	local f
	for f in "${IMAGE_CACHE}/$1"-*.tar "${IMAGE_CACHE}/$1"-*.digest; do
		[[ -e ${f} && ${f} != "${IMAGE_CACHE}/$1-$2".* ]] || continue
		log "removing stale cache ${f}"
		rm -f "${f}"
	done
}

# image_digest REF: prints the target digest containerd holds for REF.
image_digest() {
	ctr_ns images ls 2>/dev/null | awk -v r="$1" '$1 == r { print $3 }'
}

image_unpacked() {
	ctr_ns images check "name==$1" 2>/dev/null | awk -v r="$1" '$1 == r { print $NF }' | grep -qx true
}

# ensure_image NAME REF BUILDER CMD_JSON ENV_JSON KEYDATA...
ensure_image() {
	local name=$1 ref=$2 builder=$3 cmd=$4 env=$5
	shift 5
	step "${name}" "${ref}"
	local key archive
	key=$(recipe_key "${name}" "${ref}" "${cmd}" "${env}" "$@")
	archive="${IMAGE_CACHE}/${name}-${key}.tar"
	if [[ -s ${archive} && -s ${archive%.tar}.digest ]]; then
		local want have
		want=$(<"${archive%.tar}.digest")
		have=$(image_digest "${ref}")
		if [[ ${have} == "${want}" ]] && image_unpacked "${ref}"; then
			log "${ref} (${want}) already imported and unpacked; nothing to do"
			return
		fi
		log "cached archive ${archive} found; importing only"
	else
		log "no cached archive for recipe ${key}; building"
		mkdir -p "${IMAGE_CACHE}"
		WORK=$(mktemp -d "${IMAGE_CACHE}/build.XXXXXX")
		"${builder}" "${WORK}/rootfs"
		write_oci_archive "${WORK}/rootfs" "${ref}" "${cmd}" "${env}" "${archive}"
		rm -rf "${WORK}"
		WORK=""
		prune_cache "${name}" "${key}"
	fi
	log "ctr -n ${NS} images import ${archive}"
	ctr_ns images import --platform linux/amd64 "${archive}" >/dev/null
	[[ $(image_digest "${ref}") == "$(<"${archive%.tar}.digest")" ]] || die "${ref} missing after import"
	if ! image_unpacked "${ref}"; then
		log "unpacking ${ref} for overlayfs"
		ctr_ns images unpack --snapshotter overlayfs "${ref}" >/dev/null
	fi
	image_unpacked "${ref}" || die "${ref} is not unpacked for overlayfs"
	log "${ref} imported and unpacked"
}

verify() {
	step verify "running a command in each image"
	local out
	out=$(ctr_ns run --rm "${BUSYBOX_REF}" "deltabox-images-t1-$$" echo hi)
	[[ ${out} == hi ]] || die "busybox: expected 'hi', got '${out}'"
	log "${BUSYBOX_REF}: echo hi -> ${out}"
	out=$(ctr_ns run --rm "${PYTHON_REF}" "deltabox-images-t2-$$" python3 -c 'print(1)')
	[[ ${out} == 1 ]] || die "python: expected '1', got '${out}'"
	log "${PYTHON_REF}: python3 -c 'print(1)' -> ${out}"
	out=$(ctr_ns run --rm "${PYTHON_REF}" "deltabox-images-t3-$$" git --version)
	[[ ${out} == "git version "* ]] || die "python: expected git, got '${out}'"
	log "${PYTHON_REF}: ${out}"
}

busybox_image() {
	ensure_image busybox "${BUSYBOX_REF}" build_busybox_rootfs '["sh"]' \
		"[\"PATH=${DEFAULT_PATH}\"]" \
		"busybox-static $(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || true)"
}

python_image() {
	ensure_image python "${PYTHON_REF}" build_python_rootfs '["python3"]' \
		"[\"PATH=${DEFAULT_PATH}\",\"LANG=C.UTF-8\"]" \
		"suite ${PYTHON_IMAGE_SUITE}" "mirror $(debian_mirror)"
}

main() {
	need_root
	step preflight "private containerd"
	ADDRESS=$("${HACK_DIR}/containerd.sh" address)
	"${HACK_DIR}/containerd.sh" status >/dev/null ||
		die "containerd is not running; start it with hack/containerd.sh start"
	case "${1:-all}" in
	all)
		busybox_image
		python_image
		verify
		;;
	busybox) busybox_image ;;
	python) python_image ;;
	verify) verify ;;
	*)
		echo "usage: $0 [all|busybox|python|verify]" >&2
		exit 2
		;;
	esac
}

main "$@"
