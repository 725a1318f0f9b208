#!/bin/sh
# gpu-watchdog Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/gpu-watchdog/task-prolog.sh), run as
# the job's user before each task (the batch script and every srun task). What it prints as
# `export NAME=value` lands in the task's environment: the trainer's progress writer
# (ft_trainer.progress.ProgressWriter.from_env) then writes to the directory prolog.sh made,
#
#     GPU_WATCHDOG_PROGRESS_DIR=$GPU_WATCHDOG_PROGRESS_ROOT   GPU_WATCHDOG_JOB=slurm-$SLURM_JOB_ID
#
# and the watchdog names the job by its Slurm id. Same settings as prolog.sh.
set -u
defaults="${GPU_WATCHDOG_SLURM_DEFAULTS:-/etc/default/gpu-watchdog-slurm}"
# shellcheck disable=SC1090
[ -r "$defaults" ] && . "$defaults"
root="${GPU_WATCHDOG_PROGRESS_ROOT:-/run/gpu-watchdog/progress}"
case "${SLURM_JOB_ID:-}" in ''|*[!0-9]*) exit 0 ;; esac
echo "export GPU_WATCHDOG_PROGRESS_DIR=$root"
echo "export GPU_WATCHDOG_JOB=slurm-$SLURM_JOB_ID"
