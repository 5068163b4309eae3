"""How much of the machine the benchmark had: CPU used by other processes while it measured.

On a small shared machine a test suite running next to the benchmark halves its numbers and
nothing in them says so. So every measurement (a raw batch size, a load probe) is metered: the
machine's busy time (/proc/stat) minus the CPU time of this process, of its reaped children
(getrusage) and of the servers it is running (/proc/PID/stat, all threads) is what everything
else used, in cores. A `QuietPolicy` waits (bounded) for the others to go quiet before a
measurement and repeats one they disturbed, a bounded number of times, out of a bounded waiting
budget for the whole run; what was measured anyway is marked. Linux only; elsewhere the meter
reports nothing and nothing waits.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy_s() -> tuple[float, float] | None:
    """(busy seconds, steal seconds) summed over all CPUs since boot."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    ticks = [int(v) for v in first[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = ticks[:7]
    steal = ticks[7] if len(ticks) > 7 else 0
    return (user + nice + system + irq + softirq) / _HZ, steal / _HZ


def _process_s(pid: int) -> float:
    """CPU seconds of a running process, all its threads; 0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _HZ  # utime, stime


def _ours_s(pids: Sequence[int]) -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    running = sum(_process_s(pid) for pid in pids)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime + running


@dataclass(frozen=True, slots=True)
class CpuUse:
    wall_s: float
    ours_cores: float
    """This process and the servers it started, in cores (CPU seconds per second)."""
    others_cores: float
    """Every other process on the machine, in cores."""
    steal_cores: float
    """Time the hypervisor gave our virtual CPUs to someone else, in cores."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 2),
            "ours_cores": round(self.ours_cores, 2),
            "others_cores": round(self.others_cores, 2),
            "steal_cores": round(self.steal_cores, 2),
        }


class CpuMeter:
    """Started on construction; `stop()` says what the interval cost, and who paid.

    `pids` are running servers to count as ours. A server that exits (and is reaped) during
    the interval would be counted twice, so meter intervals within a server's life.
    """

    def __init__(self, pids: Sequence[int] = ()) -> None:
        self._pids = tuple(pids)
        self._wall = time.monotonic()
        self._machine = _machine_busy_s()
        self._ours = _ours_s(self._pids)

    def stop(self) -> CpuUse | None:
        machine = _machine_busy_s()
        if machine is None or self._machine is None:
            return None
        wall = max(time.monotonic() - self._wall, 1e-9)
        ours = _ours_s(self._pids) - self._ours
        busy = machine[0] - self._machine[0]
        return CpuUse(
            wall_s=wall,
            ours_cores=ours / wall,
            others_cores=max(0.0, busy - ours) / wall,
            steal_cores=(machine[1] - self._machine[1]) / wall,
        )


@dataclass(slots=True)
class QuietPolicy:
    """When a measurement counts as undisturbed, and how long the run may wait for that."""

    max_others_cores: float = 0.25
    """A measurement during which other processes used more than this is repeated."""
    retries: int = 2
    """Repeats of a disturbed measurement; after them it is kept, marked disturbed."""
    wait_budget_s: float = 300.0
    """Waiting for quiet, summed over the whole run; once spent, nothing waits any more."""
    sample_s: float = 0.5
    waited_s: float = 0.0
    disturbed: int = 0
    """Measurements kept although disturbed."""
    repeated: int = 0

    def is_quiet(self, use: CpuUse | None) -> bool:
        return use is None or use.others_cores <= self.max_others_cores

    def wait(self, pids: Sequence[int] = (), *, say: str = "") -> CpuUse | None:
        """Block until other processes are quiet or the budget is spent (a blocking sleep)."""
        announced = False
        while self.waited_s < self.wait_budget_s:
            meter = CpuMeter(pids)
            time.sleep(self.sample_s)
            use = meter.stop()
            if self._done_waiting(use, say, announced):
                return use
            announced = True
        return None

    async def wait_async(self, pids: Sequence[int] = (), *, say: str = "") -> CpuUse | None:
        """The same, on the event loop."""
        announced = False
        while self.waited_s < self.wait_budget_s:
            meter = CpuMeter(pids)
            await asyncio.sleep(self.sample_s)
            use = meter.stop()
            if self._done_waiting(use, say, announced):
                return use
            announced = True
        return None

    def _done_waiting(self, use: CpuUse | None, say: str, announced: bool) -> bool:
        if self.is_quiet(use):
            return True
        self.waited_s += self.sample_s
        if self.waited_s >= self.wait_budget_s:
            return True
        if not announced and use is not None:
            print(
                f"    other processes use {use.others_cores:.1f} cores: waiting for quiet"
                f"{' before ' + say if say else ''} ({self.wait_budget_s - self.waited_s:.0f} s"
                " of waiting left)",
                flush=True,
            )
        return False

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_others_cores": self.max_others_cores,
            "retries": self.retries,
            "wait_budget_s": self.wait_budget_s,
            "waited_s": round(self.waited_s, 1),
            "repeated_measurements": self.repeated,
            "disturbed_measurements_kept": self.disturbed,
        }


def load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None
