#!/bin/sh
# gpu-watchdog Slurm HealthCheckProgram (slurm.conf: HealthCheckProgram=/etc/slurm/gpu-watchdog/health-check.sh,
# which takes no arguments). slurmd runs it as root every HealthCheckInterval seconds; it drains this
# node (scontrol update nodename=$SLURMD_NODENAME state=drain reason="gpu-watchdog: ...") when the
# node's daemon reports a wedged/lost GPU or a telemetry_lost job, when its loop is stuck, or when it
# does not answer at all. A slow daemon is not a dead one: it asks /healthz first and retries with a
# doubling pause (--tries 3, --backoff 1 s) before it counts the daemon unreachable; a daemon whose
# /healthz answers is never drained for a slow /status. `gpu-watchdog slurm-health-check --help`
# explains each reason.
#
# Settings: environment, or the file $GPU_WATCHDOG_SLURM_DEFAULTS (default /etc/default/gpu-watchdog-slurm):
#   GPU_WATCHDOG_BIN   default /opt/gpu-triage/venv/bin/gpu-watchdog
#   GPU_WATCHDOG_URL   default http://127.0.0.1:9410
set -u
defaults="${GPU_WATCHDOG_SLURM_DEFAULTS:-/etc/default/gpu-watchdog-slurm}"
# shellcheck disable=SC1090
[ -r "$defaults" ] && . "$defaults"
exec "${GPU_WATCHDOG_BIN:-/opt/gpu-triage/venv/bin/gpu-watchdog}" slurm-health-check --drain \
  --url "${GPU_WATCHDOG_URL:-http://127.0.0.1:9410}"
