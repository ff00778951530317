# Sourced by scripts/test-matrix, scripts/package and scripts/test-kernels: the cached
# debootstrap chroot of each Debian release and nftrec installed into a venv inside it.
# Expects CACHE (the cache directory) set; build_chroot needs MIRROR (apt_mirror), and
# install_nftrec needs NFTREC_WHEEL and HOST_CA.

# What the tests run inside the chroot: iproute2 (ip netns), conntrack and procps (sysctl)
# for the data plane, util-linux (unshare -rn for nft_scratch), git (the watch tests' oracle
# and signed revisions), gnupg and openssh-client (the signing keys of signed revisions),
# gpgv and openssh-client's ssh-keygen (what nftrec checks signatures with),
# docker-registry (the OCI registry on 127.0.0.1 that the OCI source's tests pull from).
PACKAGES=python3,python3-venv,libnftables1,nftables,iproute2,conntrack,procps,util-linux,git,gnupg,gpgv,openssh-client,docker-registry
MARKER=.nftrec-matrix-complete
RUN=/opt/nftrec-matrix       # inside each chroot: src/, wheels/, venv/, results/

# The first Debian archive URI (not security, updates or backports) in apt's sources.
apt_mirror() {
    python3 - <<'EOF'
import glob, re

def sources():
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        for block in re.split(r"\n\s*\n", open(path).read()):
            fields, key = {}, None
            for line in block.splitlines():
                if line.startswith("#") or not line.strip():
                    continue
                if line[0] in " \t" and key:
                    fields[key] += " " + line.strip()
                    continue
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
                yield fields.get("uris", "").split(), fields.get("suites", "").split()
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
        try:
            lines = open(path).read().splitlines()
        except OSError:
            continue
        for line in lines:
            words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb":
                yield [words[1]], [words[2]]

for uris, suites in sources():
    if any(not re.search(r"[-/](security|updates|backports)$", s) for s in suites):
        for uri in uris:
            if "security" not in uri:
                print(uri.rstrip("/"))
                raise SystemExit(0)
raise SystemExit(1)
EOF
}

# Runs a command inside chroot $1 in new mount and pid namespaces: /proc, /sys, /dev and a
# private /run and /tmp are mounted there only, so nothing is mounted on the host and all of
# it goes when the last process inside ends (also on failure or SIGKILL). pivot_root rather
# than chroot: the kernel refuses a user namespace (nft_scratch's `unshare -rn`) to a
# chrooted process. The environment is the chroot's own, none of the host's.
ENTER='
    root=$1; shift
    mount --bind "$root" "$root"
    mount -t proc proc "$root/proc"
    mount -t sysfs sysfs "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs -o mode=0755 tmpfs "$root/run"
    mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
    cd "$root"
    pivot_root . .
    umount -l .
    cd /
    /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root LANG=C.UTF-8 TERM=dumb PYTHONDONTWRITEBYTECODE=1 "$@"'
IN_CHROOT=(unshare --mount --pid --fork --kill-child --propagation private -- /bin/sh -ec "$ENTER" in_chroot)
in_chroot() { "${IN_CHROOT[@]}" "$@"; }

# Builds the chroot of release $1 into $CACHE/$1 unless a complete one (the marker, written
# last, names the same packages) is there. A partial build is thrown away.
build_chroot() {
    local rel=$1 dir=$CACHE/$1 log=$CACHE/logs/$1-debootstrap.log
    if [ "$(cat "$dir/$MARKER" 2>/dev/null)" = "$PACKAGES" ]; then
        return 0
    fi
    if [ -z "$MIRROR" ]; then
        echo "no Debian mirror in /etc/apt/sources.list{,.d/} (set NFTREC_MATRIX_MIRROR)"
        return 1
    fi
    # a quick look first: debootstrap's own retries take many minutes to give up
    if ! wget -q -T 20 -t 2 -O /dev/null "$MIRROR/dists/$rel/InRelease"; then
        echo "$MIRROR/dists/$rel/InRelease cannot be fetched (mirror unreachable, or no $rel there)"
        return 1
    fi
    # --one-file-system: never follow a mount left inside a chroot by a killed debootstrap
    rm -rf --one-file-system "$dir" "$dir.partial"
    if [ -e "$dir" ] || [ -e "$dir.partial" ]; then
        echo "cannot remove the old $dir (a mount inside it?)"
        return 1
    fi
    # own mount namespace: the mounts debootstrap makes in the target never outlive it
    if ! timeout --kill-after=30 1200 unshare --mount --propagation private -- \
            debootstrap --variant=minbase --include="$PACKAGES" "$rel" "$dir.partial" "$MIRROR" \
            >"$log" 2>&1; then
        echo "debootstrap $rel from $MIRROR failed: $(grep -E '^(E|W):' "$log" | tail -1) (log: $log)"
        return 1
    fi
    echo "$PACKAGES" >"$dir.partial/$MARKER"
    mv "$dir.partial" "$dir"
}

# Installs nftrec (its wheel, built on the host) with its test extra into a venv in chroot
# $1, by the chroot's own pip and Python: they resolve pyproject.toml's requirements and
# markers for that interpreter, from PyPI (wheels only: a chroot has no compiler). The pip of
# a release trusts only its own CA bundle (certifi); the host's bundle, with any CA of a
# proxy the host goes through, is copied in and named with --cert, and the host's proxy
# settings are passed on. The chroot's pip cache (/root/.cache) makes a second run quick.
install_nftrec() {
    local dir=$1 cert=() pass=() var
    if [ -f "$HOST_CA" ]; then
        cp "$HOST_CA" "$dir$RUN/host-ca.crt"
        cert=(--cert "$RUN/host-ca.crt")
    fi
    for var in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY PIP_INDEX_URL; do
        [ -n "${!var:-}" ] && pass+=("$var=${!var}")
    done
    cp "$NFTREC_WHEEL" "$dir$RUN/wheels/"
    in_chroot "$dir" "${pass[@]}" sh -ec '
        python3 -m venv "$1/venv"
        shift
        "$@"' sh "$RUN" "$RUN/venv/bin/pip" install -q --disable-pip-version-check \
        --only-binary=:all: "${cert[@]}" "$RUN/wheels/${NFTREC_WHEEL##*/}[test]"
}
