#!/bin/sh
# gpu-watchdog Slurm Epilog (slurm.conf: Epilog=/etc/slurm/gpu-watchdog/epilog.sh), run by slurmd as
# root on each node when the job ends (completed, failed or cancelled): removes the job's progress
# directory $GPU_WATCHDOG_PROGRESS_ROOT/slurm-$SLURM_JOB_ID made by prolog.sh, so the watchdog stops
# showing the job and the next job with a recycled id starts clean. Same settings as prolog.sh; never
# fails (an Epilog that exits non-zero drains the node).
set -u
defaults="${GPU_WATCHDOG_SLURM_DEFAULTS:-/etc/default/gpu-watchdog-slurm}"
# shellcheck disable=SC1090
[ -r "$defaults" ] && . "$defaults"
root="${GPU_WATCHDOG_PROGRESS_ROOT:-/run/gpu-watchdog/progress}"
job="${SLURM_JOB_ID:-}"
case "$job" in
  ''|*[!0-9]*) echo "gpu-watchdog epilog: SLURM_JOB_ID '$job' is not a job id; nothing done" >&2; exit 0 ;;
esac
rm -rf --one-file-system -- "$root/slurm-$job" || echo "gpu-watchdog epilog: cannot remove $root/slurm-$job" >&2
exit 0
