#!/usr/bin/env bash
# Debian packages the integration tests need: prometheus (promtool and the server),
# prometheus-alertmanager (amtool and the server, installed as /usr/bin/prometheus-alertmanager), systemd,
# and a one-node Slurm cluster (tests/integration/test_slurm.py): slurmctld, slurmd, slurm-client (sbatch,
# squeue, scancel, sacct, scontrol), slurmdbd and mariadb-server (sacct needs accounting storage), munge;
# kubectl (`kubectl kustomize` renders deploy/kubernetes: tests/test_kubernetes_manifests.py; the machine
# image already ships one, Debian's kubernetes-client otherwise) and unshare (util-linux: the PID
# namespace of every test that runs an armed daemon, tests/isolation.py).
#
# Idempotent: packages already installed are skipped; `apt-get update` runs at most once per call and
# only when something is missing. Runs as root, or through sudo when it is available.
#
#   .ci/install-system-deps.sh            # install what is missing
#   .ci/install-system-deps.sh --check    # list what is missing, exit 1 if anything is
set -euo pipefail

# Debian package -> a binary it provides (checked with `command -v`, so a binary installed by other
# means also counts as present).
PACKAGES=(
  "prometheus:promtool"
  "prometheus-alertmanager:amtool"
  "systemd:systemd-analyze"
  "slurmctld:slurmctld"
  "slurmd:slurmd"
  "slurm-client:sbatch"
  "slurmdbd:slurmdbd"
  "munge:munged"
  "mariadb-server:mariadbd"
  "kubernetes-client:kubectl"
  "util-linux:unshare"
)

missing=()
for entry in "${PACKAGES[@]}"; do
  package="${entry%%:*}"
  binary="${entry#*:}"
  if command -v "$binary" >/dev/null 2>&1 || dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed"; then
    echo "install-system-deps: $package already installed"
  else
    missing+=("$package")
  fi
done

if [[ "${1:-}" == "--check" ]]; then
  if ((${#missing[@]})); then
    echo "install-system-deps: missing: ${missing[*]}"
    exit 1
  fi
  exit 0
fi

if ((${#missing[@]} == 0)); then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: apt-get not found; install by hand: ${missing[*]}" >&2
  exit 2
fi

as_root=()
if [[ "$(id -u)" != "0" ]]; then
  if command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
  else
    echo "install-system-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 2
  fi
fi

export DEBIAN_FRONTEND=noninteractive
echo "install-system-deps: installing ${missing[*]}"
"${as_root[@]}" apt-get update
"${as_root[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
