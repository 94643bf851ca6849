#!/usr/bin/env bash
# Sourced by the build, test, fuzz and sanitizer scripts: how many cores this machine really gives
# us. nproc counts the CPUs we may be scheduled on, not a container's CPU quota (cgroup v2 cpu.max,
# v1 cfs_quota_us): on a 2-CPU quota over 64 visible CPUs, -j 64 makes a build and the timing-bound
# tests crawl. oases_cores: min(nproc, the quota rounded up). oases_build_jobs: that, and at most one
# compile per 2.5 GiB of available memory (a unity unit of the planner or unit tests takes ~1.5 GiB
# under gcc -O3, more under clang with ASan).
oases_cores() {
  local n q p
  n=$(nproc 2>/dev/null || echo 1)
  if [[ -r /sys/fs/cgroup/cpu.max ]]; then
    read -r q p </sys/fs/cgroup/cpu.max || true
  elif [[ -r /sys/fs/cgroup/cpu/cpu.cfs_quota_us && -r /sys/fs/cgroup/cpu/cpu.cfs_period_us ]]; then
    q=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) p=$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)
  fi
  if [[ ${q:-max} =~ ^[0-9]+$ && ${p:-0} =~ ^[0-9]+$ && $p -gt 0 && $q -gt 0 ]]; then
    local c=$(((q + p - 1) / p))
    ((c < n)) && n=$c
  fi
  ((n < 1)) && n=1
  echo "$n"
}
oases_build_jobs() {
  local n kib by_mem
  n=$(oases_cores)
  kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null)
  if [[ $kib =~ ^[0-9]+$ ]]; then
    by_mem=$((kib / 2621440))
    ((by_mem < 1)) && by_mem=1
    ((by_mem < n)) && n=$by_mem
  fi
  echo "$n"
}
