#!/usr/bin/env bash
# Install or uninstall jobwarden as a systemd service. Idempotent; says what it did.
#
#   systemd/install.sh [install|uninstall]
#
#   PREFIX   where the virtual environment goes (default /opt/jobwarden: PREFIX/venv)
#   DESTDIR  a staging root prepended to every path (packaging, tests); with DESTDIR set,
#            no user is created and systemd is not touched
#   PYTHON   the interpreter for the virtual environment (default python3)
set -euo pipefail

action=${1:-install}
PREFIX=${PREFIX:-/opt/jobwarden}
DESTDIR=${DESTDIR:-}
PYTHON=${PYTHON:-python3}
src=$(cd "$(dirname "$0")/.." && pwd)
venv="$DESTDIR$PREFIX/venv"
unit="$DESTDIR/etc/systemd/system/wardend.service"
sysusers="$DESTDIR/usr/lib/sysusers.d/jobwarden.conf"
tmpfiles="$DESTDIR/usr/lib/tmpfiles.d/jobwarden.conf"

say() { echo "jobwarden: $*"; }
systemd_running() { [ -z "$DESTDIR" ] && [ -d /run/systemd/system ]; }

# place SRC DEST MODE: install a file unless an identical one is already there.
place() {
    if [ -f "$2" ] && cmp -s "$1" "$2"; then
        say "unchanged $2"
    else
        install -D -m "$3" "$1" "$2"
        say "installed $2"
    fi
}

install_all() {
    if [ -x "$venv/bin/python" ]; then
        say "virtual environment $venv exists"
    else
        "$PYTHON" -m venv "$venv"
        say "created virtual environment $venv"
    fi
    # Build from a copy, so the checkout is left as it was (no build/ or egg-info in it).
    copy=$(mktemp -d)
    cp -r "$src/pyproject.toml" "$src/README.md" "$src/jobwarden" "$copy/"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -c "$src/constraints.txt" "$copy"
    rm -rf "$copy"
    say "installed jobwarden $("$venv/bin/python" -c 'import jobwarden; print(jobwarden.__version__)') and its pinned dependencies into $venv"
    rendered=$(mktemp)
    trap 'rm -f "$rendered"' RETURN
    sed "s|/opt/jobwarden/venv|$PREFIX/venv|g" "$src/systemd/wardend.service" > "$rendered"
    place "$rendered" "$unit" 0644
    place "$src/systemd/jobwarden.sysusers" "$sysusers" 0644
    place "$src/systemd/jobwarden.tmpfiles" "$tmpfiles" 0644
    if [ -z "$DESTDIR" ]; then
        systemd-sysusers "$sysusers" && say "service user jobwarden is present"
    else
        say "staged under $DESTDIR: no user created"
    fi
    if systemd_running; then
        systemd-tmpfiles --create "$tmpfiles"
        systemctl daemon-reload
        say "reloaded systemd; start with: systemctl enable --now wardend"
    else
        say "systemd is not running as init here: daemon-reload skipped"
    fi
}

uninstall_all() {
    if systemd_running && systemctl is-enabled --quiet wardend 2>/dev/null; then
        systemctl disable --now wardend
        say "stopped and disabled wardend (its workers were preempted and checkpointed)"
    fi
    for path in "$unit" "$sysusers" "$tmpfiles"; do
        if [ -e "$path" ]; then rm -f "$path"; say "removed $path"; else say "absent $path"; fi
    done
    if [ -d "$venv" ]; then rm -rf "$venv"; say "removed $venv"; else say "absent $venv"; fi
    if systemd_running; then systemctl daemon-reload; say "reloaded systemd"; fi
    say "kept /var/lib/jobwarden (jobs, checkpoints, incidents) and the jobwarden user"
}

case "$action" in
    install) install_all ;;
    uninstall) uninstall_all ;;
    *) echo "usage: $0 [install|uninstall]" >&2; exit 2 ;;
esac
