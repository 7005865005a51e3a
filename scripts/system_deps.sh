#!/usr/bin/env bash
# Debian packages horizonrl uses beyond pip: bubblewrap (the python tool's sandbox backend).
# Installs with apt-get as root (or passwordless sudo); otherwise says what to install and exits 0,
# since the sandbox then falls back to its rlimit backend (docs/envs/math_python.md).
set -u
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
[ ${#missing[@]} -eq 0 ] && exit 0
say() { echo "system-deps: $*" >&2; }
if ! command -v apt-get >/dev/null 2>&1; then
    say "apt-get not found; install ${missing[*]} with your package manager (the sandbox uses its rlimit fallback until then)"
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
    say "apt-get could not install ${missing[*]}; the sandbox uses its rlimit fallback"
fi
exit 0
