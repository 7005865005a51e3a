#!/usr/bin/env bash
# Debian packages horizonrl uses beyond pip: bubblewrap (the python tool's sandbox backend) and
# chromium (the viewer's browser test drives Debian's Chromium; nothing downloads a browser build).
# Installs with apt-get as root (or passwordless sudo); otherwise says what to install and exits 0:
# the sandbox then falls back to its rlimit backend (docs/envs/math_python.md) and the browser test
# is skipped with the reason.
set -u
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
say() { echo "system-deps: $*" >&2; }
if ! command -v apt-get >/dev/null 2>&1; then
    say "apt-get not found; install ${missing[*]} with your package manager (until then the sandbox uses its rlimit fallback and the browser test is skipped)"
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    run=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    run=(sudo -n)
else
    say "not root and no passwordless sudo; run: sudo apt-get install -y ${missing[*]}"
    exit 0
fi
say "installing ${missing[*]}"
if ! { "${run[@]}" apt-get update -qq && "${run[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >/dev/null; then
    say "apt-get could not install ${missing[*]}; the sandbox uses its rlimit fallback, the browser test skips"
fi
exit 0
