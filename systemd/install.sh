#!/usr/bin/env bash
# Install or uninstall jobwarden as a systemd service. Idempotent; says what it did.
#
#   systemd/install.sh [install|uninstall]
#
#   PREFIX   where the virtual environment goes (default /opt/jobwarden: PREFIX/venv)
#   DESTDIR  a staging root prepended to every path (packaging, tests); with DESTDIR set,
#            no user is created and systemd is not touched
#   PYTHON   the interpreter for the virtual environment (default python3). It must be one
#            the service user can run: not under /root, /home or /run/user (ProtectHome=
#            hides them) nor /tmp or /var/tmp (PrivateTmp=), in folders open to others. An unsuitable default
#            python3 (a pyenv or conda one in a home) is replaced by /usr/bin/python3,
#            saying so; an unsuitable PYTHON= is refused.
#   BINDIR   where the wardenctl link goes (default /usr/local/bin)
#
# Run it as root (sudo is not needed when you already are).
set -euo pipefail

action=${1:-install}
PREFIX=${PREFIX:-/opt/jobwarden}
DESTDIR=${DESTDIR:-}
python_chosen=${PYTHON:+yes}
PYTHON=${PYTHON:-python3}
BINDIR=${BINDIR:-/usr/local/bin}
src=$(cd "$(dirname "$0")/.." && pwd)
venv="$DESTDIR$PREFIX/venv"
unit="$DESTDIR/etc/systemd/system/wardend.service"
sysusers="$DESTDIR/usr/lib/sysusers.d/jobwarden.conf"
tmpfiles="$DESTDIR/usr/lib/tmpfiles.d/jobwarden.conf"
enabled="$DESTDIR/etc/systemd/system/multi-user.target.wants/wardend.service"
link="$DESTDIR$BINDIR/wardenctl"

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

# interpreter_problem PY: why the service user could not run a venv made from PY
# (nothing when it could).
interpreter_problem() {
    "$1" - <<'PY' 2>&1 || echo "it does not run"
import os, stat, sys
HIDDEN = {"/root": "ProtectHome=", "/home": "ProtectHome=", "/run/user": "ProtectHome=",
          "/tmp": "PrivateTmp=", "/var/tmp": "PrivateTmp="}
for path in sorted({os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)}):
    for top, setting in HIDDEN.items():
        if path == top or path.startswith(top + "/"):
            sys.exit(print(f"{path} is under {top}, which the unit's {setting} hides"))
    part = path
    while part != "/":
        mode = os.stat(part).st_mode
        if not mode & stat.S_IXOTH:
            sys.exit(print(f"{part} (mode {mode & 0o777:o}) is closed to other users, so the "
                           f"service user cannot reach {path}"))
        part = os.path.dirname(part)
if sys.version_info < (3, 11):
    print(f"it is Python {sys.version.split()[0]}; jobwarden needs 3.11 or newer")
PY
}

# choose_python: keep PYTHON if the service user can run it; else, if PYTHON was not
# given, the system's python3; else refuse, naming why.
choose_python() {
    local problem candidate
    problem=$(interpreter_problem "$PYTHON")
    [ -z "$problem" ] && return 0
    if [ -z "$python_chosen" ]; then
        for candidate in /usr/bin/python3 /usr/local/bin/python3; do
            if [ -x "$candidate" ] && [ -z "$(interpreter_problem "$candidate")" ] \
                && "$candidate" -c 'import ensurepip, venv' 2>/dev/null; then
                say "$(command -v "$PYTHON" || echo "$PYTHON"): $problem; using $candidate instead (PYTHON= chooses)"
                PYTHON=$candidate
                return 0
            fi
        done
    fi
    say "refusing the interpreter $PYTHON: $problem." >&2
    say "set PYTHON= to a Python 3.11+ the service user can run, e.g. PYTHON=/usr/bin/python3" >&2
    exit 2
}

install_all() {
    if [ -x "$venv/bin/python" ]; then
        say "virtual environment $venv exists"
    else
        choose_python
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
    if [ "$(readlink "$link" 2>/dev/null)" = "$PREFIX/venv/bin/wardenctl" ]; then
        say "unchanged $link"
    elif [ -e "$link" ] || [ -L "$link" ]; then
        say "kept $link: it is not ours (it does not point into $PREFIX/venv)"
    else
        mkdir -p "$(dirname "$link")"
        ln -s "$PREFIX/venv/bin/wardenctl" "$link"
        say "linked $link -> $PREFIX/venv/bin/wardenctl"
    fi
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
    # The enable link (systemctl enable), also when systemd is not running to remove it.
    if [ -L "$enabled" ]; then
        rm -f "$enabled"
        say "removed $enabled"
        rmdir "$(dirname "$enabled")" 2>/dev/null || true
    fi
    if [ "$(readlink "$link" 2>/dev/null)" = "$PREFIX/venv/bin/wardenctl" ]; then
        rm -f "$link"
        say "removed $link"
    fi
    if [ -d "$venv" ]; then rm -rf "$venv"; say "removed $venv"; else say "absent $venv"; fi
    if [ -d "$DESTDIR$PREFIX" ] && rmdir "$DESTDIR$PREFIX" 2>/dev/null; then
        say "removed the empty $DESTDIR$PREFIX"
    fi
    if systemd_running; then systemctl daemon-reload; say "reloaded systemd"; fi
    say "kept /var/lib/jobwarden (jobs, checkpoints, incidents) and the jobwarden user"
}

case "$action" in
    install) install_all ;;
    uninstall) uninstall_all ;;
    *) echo "usage: $0 [install|uninstall]" >&2; exit 2 ;;
esac
