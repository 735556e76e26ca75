# Sourced by the install scripts of packages that bring system daemons the tests never use
# (Slurm and MUNGE, OpenSSH): install them with apt-get without leaving those daemons running.
#
#   install_without_daemons WHAT "SERVICE..." PACKAGE...
#
# WHAT names the tests that need the packages (for the messages); SERVICE... (one word list)
# are the services to stop and disable should a maintainer script have started them anyway.
# Exits 0 (tests skipped) when not root, 1 when apt-get is missing or fails.

install_without_daemons() {
    local what="$1" services="$2"
    shift 2
    if [ "$(id -u)" -ne 0 ]; then
        echo "$* not installed and this is not root: the $what tests will be skipped" >&2
        exit 0
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "apt-get is unavailable: install $* with this system's package manager" >&2
        exit 1
    fi
    # Keep the maintainer scripts from starting the services where policy-rc.d is honoured.
    local policy=/usr/sbin/policy-rc.d created=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod +x "$policy"
        created=1
    fi
    local ok=1
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" || ok=0
    if [ "$created" -eq 1 ]; then
        rm -f "$policy"
    fi
    if [ "$ok" -eq 0 ]; then
        echo "apt-get could not install $* (its output is above); the $what tests will be skipped" \
             "until they are installed" >&2
        exit 1
    fi
    # Where they were started anyway (a policy-rc.d of the machine's own allowed it), stop and
    # disable them: nobody asked for these system daemons.
    local service
    for service in $services; do
        if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
            systemctl disable --now "$service" >/dev/null 2>&1 || true
        elif command -v service >/dev/null 2>&1; then
            service "${service%%.*}" stop >/dev/null 2>&1 || true
        fi
        if command -v update-rc.d >/dev/null 2>&1; then
            update-rc.d "${service%%.*}" disable >/dev/null 2>&1 || true
        fi
    done
}
