"""How many CPUs a server process can keep busy: its affinity, and its cgroup's CPU quota
(what ``ctxcore serve --workers auto`` starts one worker for)."""

from __future__ import annotations

import math
import os
from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_PROC_CGROUP = Path("/proc/self/cgroup")


def usable_cpus(*, cgroup_root: str | Path = _CGROUP_ROOT, proc_cgroup: str | Path = _PROC_CGROUP) -> int:
    """The CPUs this process can keep busy: those it may run on (its affinity, e.g.
    ``taskset`` or a cpuset), fewer when its cgroup's CPU quota (a container's CPU limit,
    cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``, the tightest of its ancestors')
    allows less, rounded down; at least 1. What ``workers = "auto"`` starts.

    >>> 1 <= usable_cpus() <= (os.cpu_count() or 1)
    True
    """
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    limit = _cgroup_cpu_limit(Path(cgroup_root), Path(proc_cgroup))
    if limit is not None:
        n = min(n, math.floor(limit))
    return max(1, n)


def _cgroup_cpu_limit(root: Path, proc_cgroup: Path) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (quota / period), the smallest on
    its path; None without one (no cgroup file system, no limit, unreadable files)."""
    try:
        lines = proc_cgroup.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    limits: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.strip().lstrip("/")
        if controllers == "":  # cgroup v2: "0::/path"
            for d in _ancestors(root, rel):
                limits += _quota(d / "cpu.max", None)
        elif "cpu" in controllers.split(","):  # cgroup v1: "4:cpu,cpuacct:/path"
            for mount in dict.fromkeys((controllers, "cpu", "cpu,cpuacct")):
                for d in _ancestors(root / mount, rel):
                    limits += _quota(d / "cpu.cfs_quota_us", d / "cpu.cfs_period_us")
    return min(limits) if limits else None


def _ancestors(base: Path, rel: str) -> list[Path]:
    """`base`/`rel` and each directory above it up to `base` (a container sees its own
    cgroup as the root, or under the host's path)."""
    out = [base]
    for part in (p for p in rel.split("/") if p and p not in (".", "..")):
        out.append(out[-1] / part)
    return out


def _quota(quota_file: Path, period_file: Path | None) -> list[float]:
    """[quota / period] from a cgroup's files, [] when they say no limit or cannot be read."""
    try:
        words = quota_file.read_text(encoding="ascii").split()
        if period_file is not None:
            words += period_file.read_text(encoding="ascii").split()
        quota, period = int(words[0]), int(words[1])
    except (OSError, UnicodeDecodeError, ValueError, IndexError):  # "max", absent, malformed
        return []
    return [quota / period] if quota > 0 and period > 0 else []
