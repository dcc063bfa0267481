#!/usr/bin/env bash
# Installs Debian's Slurm (slurm-wlm, munge) where it is missing, then runs
# `rota bench slurm ARGS...`: a local slurmctld + slurmd (started as child processes, no
# systemd; state in a temporary folder removed afterwards) beside a local Rota cluster,
# the same batch script through both, figures side by side. See bench/slurm/README.md.
# Skips (exit 0, with the reason) where Slurm is absent and cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/../.."

skip() { echo "bench/slurm/run.sh: skipped: $*"; exit 0; }

if ! command -v sbatch >/dev/null || ! [ -x /usr/sbin/slurmctld ] || ! [ -x /usr/sbin/munged ]; then
    command -v apt-get >/dev/null || skip "Slurm is not installed and there is no apt-get (Debian/Ubuntu) to install it"
    [ "$(id -u)" = 0 ] || skip "Slurm is not installed and installing it (apt-get) needs root"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends slurm-wlm munge >/tmp/rota-bench-slurm-apt.log 2>&1; then
        apt-get update >>/tmp/rota-bench-slurm-apt.log 2>&1 || true
        apt-get install -y --no-install-recommends slurm-wlm munge >>/tmp/rota-bench-slurm-apt.log 2>&1 \
            || skip "apt-get install slurm-wlm munge failed (see /tmp/rota-bench-slurm-apt.log)"
    fi
fi
[ "$(id -u)" = 0 ] || skip "slurmd must run as root (it starts jobs as their users)"

if command -v rota >/dev/null; then
    exec rota bench slurm "$@"
fi
exec python -m rota.cli.main bench slurm "$@"
