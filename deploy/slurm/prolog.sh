#!/bin/sh
# gpu-watchdog Slurm Prolog (slurm.conf: Prolog=/etc/slurm/gpu-watchdog/prolog.sh), run by slurmd as
# root on each node before the job starts. It makes the job's own progress directory
#
#     $GPU_WATCHDOG_PROGRESS_ROOT/slurm-$SLURM_JOB_ID      owner: the job's user, group: $GPU_WATCHDOG_PROGRESS_GROUP,
#                                                          mode 2750 (setgid: the files keep the group)
#
# so each job's ranks write their progress files where no other job can (task-prolog.sh points them
# there) and the watchdog - a member of the group - reads them. A directory left by an earlier job of
# the same id (a crashed epilog, or squatted by someone else) is removed first.
#
# Settings: environment, or the file $GPU_WATCHDOG_SLURM_DEFAULTS (default /etc/default/gpu-watchdog-slurm):
#   GPU_WATCHDOG_PROGRESS_ROOT   default /run/gpu-watchdog/progress (the daemon's progress.dir)
#   GPU_WATCHDOG_PROGRESS_GROUP  default gpu-train (the daemon's group); the job's primary group if absent
#
# It never fails the job: a Prolog that exits non-zero drains the node and requeues the job, which a
# missing progress directory is not worth. Problems go to stderr (slurmd's log) and it exits 0.
set -u
defaults="${GPU_WATCHDOG_SLURM_DEFAULTS:-/etc/default/gpu-watchdog-slurm}"
# shellcheck disable=SC1090
[ -r "$defaults" ] && . "$defaults"
root="${GPU_WATCHDOG_PROGRESS_ROOT:-/run/gpu-watchdog/progress}"
group="${GPU_WATCHDOG_PROGRESS_GROUP:-gpu-train}"
job="${SLURM_JOB_ID:-}"
uid="${SLURM_JOB_UID:-}"

say() { echo "gpu-watchdog prolog: job ${job:-?}: $*" >&2; }

case "$job" in ''|*[!0-9]*) say "SLURM_JOB_ID '$job' is not a job id; nothing done"; exit 0 ;; esac
case "$uid" in ''|*[!0-9]*) say "SLURM_JOB_UID '$uid' is not a uid; nothing done"; exit 0 ;; esac

if [ ! -d "$root" ]; then
  mkdir -p -m 0755 "$root" || { say "cannot create $root"; exit 0; }
fi
dir="$root/slurm-$job"
rm -rf --one-file-system -- "$dir" || { say "cannot remove the stale $dir"; exit 0; }
mkdir -m 0700 -- "$dir" || { say "cannot create $dir"; exit 0; }
if getent group "$group" >/dev/null 2>&1; then
  owner="$uid:$group"
else
  owner="$uid:${SLURM_JOB_GID:-$uid}"
fi
chown -- "$owner" "$dir" || { say "cannot chown $dir to $owner"; rm -rf -- "$dir"; exit 0; }
chmod 2750 -- "$dir" || say "cannot chmod $dir"
exit 0
