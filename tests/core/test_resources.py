"""entropyrl.core.resources: the CPUs a run may use (affinity, cgroup v1/v2 quotas), the jobs and load
beside it, and the thread count that follows from them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from entropyrl.core import resources as res


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cpu_max_and_cfs_quota_parse():
    assert res.parse_cpu_max("max 100000\n") is None
    assert res.parse_cpu_max("150000 100000\n") == 1.5
    assert res.parse_cpu_max("50000") == 0.5  # period defaults to 100 ms
    assert res.parse_cpu_max("") is None and res.parse_cpu_max("abc 100") is None
    assert res.parse_cfs_quota("-1\n", "100000\n") is None
    assert res.parse_cfs_quota("200000\n", "100000\n") == 2.0
    assert res.parse_cfs_quota("x", "100000") is None


def test_cgroup_v2_takes_the_tightest_quota_up_the_tree(tmp_path):
    _write(tmp_path / "cpu.max", "max 100000\n")
    _write(tmp_path / "user.slice" / "cpu.max", "300000 100000\n")
    _write(tmp_path / "user.slice" / "job" / "cpu.max", "max 100000\n")
    assert res.cgroup_cpu_limit("0::/user.slice/job\n", tmp_path) == 3.0
    _write(tmp_path / "user.slice" / "job" / "cpu.max", "150000 100000\n")
    assert res.cgroup_cpu_limit("0::/user.slice/job\n", tmp_path) == 1.5
    assert res.cgroup_cpu_limit("0::/\n", tmp_path) is None  # the root: no limit


def test_cgroup_v2_namespaced_container_reads_its_root(tmp_path):
    # A container sees its own cgroup mounted at the root and "/" as its path.
    _write(tmp_path / "cpu.max", "200000 100000\n")
    assert res.cgroup_cpu_limit("0::/\n", tmp_path) == 2.0


def test_cgroup_v1_cfs_quota(tmp_path):
    cg = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"
    _write(tmp_path / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    assert res.cgroup_cpu_limit(cg, tmp_path) is None
    _write(tmp_path / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "250000\n")
    _write(tmp_path / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    assert res.cgroup_cpu_limit(cg, tmp_path) == 2.5
    # the controller mounted as plain "cpu" (some distributions), path not present: its root
    _write(tmp_path / "v1b" / "cpu" / "cpu.cfs_quota_us", "100000\n")
    _write(tmp_path / "v1b" / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert res.cgroup_cpu_limit("3:cpu:/elsewhere\n", tmp_path / "v1b") == 1.0


def test_no_cgroup_files_means_no_limit(tmp_path):
    assert res.cgroup_cpu_limit("0::/a\n", tmp_path) is None
    assert res.cgroup_cpu_limit("", tmp_path) is None


def test_default_threads_divides_cpus_by_jobs_and_leaves_busy_cpus_alone():
    assert res.default_threads(cpus=8, jobs=1, busy=0) == 8
    assert res.default_threads(cpus=8, jobs=2, busy=0) == 4
    assert res.default_threads(cpus=8, jobs=1, busy=5) == 3
    assert res.default_threads(cpus=2, jobs=1, busy=1) == 1
    assert res.default_threads(cpus=2, jobs=4, busy=0) == 1  # never below one
    assert res.default_threads(cpus=2, jobs=1, busy=9) == 1


def test_jobs_sharing_reads_the_launchers_count(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv(res.JOBS_ENV, raising=False)
    assert res.jobs_sharing() == 1
    monkeypatch.setenv(res.JOBS_ENV, "3")
    assert res.jobs_sharing() == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun ranks on this node
    assert res.jobs_sharing() == 6
    monkeypatch.setenv(res.JOBS_ENV, "zero")
    assert res.jobs_sharing() == 2


def test_busy_cpus_from_loadavg_minus_our_own_threads(tmp_path):
    _write(tmp_path / "loadavg", "0.50 0.40 0.20 4/180 12345\n")
    tasks = tmp_path / "task"
    _write(tasks / "1" / "stat", "1 (python (main)) R 0 1 1\n")  # the reader itself
    _write(tasks / "2" / "stat", "2 (pt worker) S 0 1 1\n")  # an idle pool thread
    assert res.busy_cpus(samples=3, interval=0, loadavg=str(tmp_path / "loadavg"), task_dir=str(tasks)) == 3
    assert res.busy_cpus(samples=1, loadavg=str(tmp_path / "missing"), task_dir=str(tasks)) == 0


@pytest.mark.skipif(not Path("/proc/loadavg").exists(), reason="needs /proc")
def test_a_real_cpu_bound_process_counts_as_busy():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)
        assert res.busy_cpus() >= 1
        if res._whole_machine():
            cpus = res.available_cpus()
            assert res.default_threads(jobs=1) <= max(1, cpus - 1)
    finally:
        spinner.kill()
        spinner.wait()


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs an affinity mask of two CPUs or more"
)
def test_affinity_mask_limits_a_real_process():
    cpu = min(os.sched_getaffinity(0))
    code = (
        "import os, torch; from entropyrl.core.resources import available_cpus, apply_threads; "
        "n = apply_threads(0); print(available_cpus(), n, torch.get_num_threads(), os.environ['OMP_NUM_THREADS'])"
    )
    env = {k: v for k, v in os.environ.items() if k not in res.THREAD_ENV_VARS}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "1", "1", "1"]  # one CPU: one thread, children told so


def test_users_omp_num_threads_is_the_default_and_stays_fixed():
    code = (
        "import os, torch; from entropyrl.core.resources import ThreadBudget, JOBS_ENV; "
        "b = ThreadBudget(0, every_s=0); os.environ[JOBS_ENV] = '1000'; "
        "print(b.threads, b.refresh(), torch.get_num_threads(), os.environ['MKL_NUM_THREADS'])"
    )
    env = {k: v for k, v in os.environ.items() if k not in (*res.THREAD_ENV_VARS, res._EXPORT_MARK)}
    env["OMP_NUM_THREADS"] = "2"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2", "2", "2", "2"]


def test_explicit_count_wins_and_user_env_is_kept():
    code = (
        "import os, torch; from entropyrl.core.resources import apply_threads; "
        "n = apply_threads(3); print(n, torch.get_num_threads(), os.environ['OMP_NUM_THREADS'])"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["3", "3", "2"]


def test_thread_budget_follows_the_jobs_beside_it(monkeypatch):
    for var in (*res.THREAD_ENV_VARS, res._EXPORT_MARK):  # restored after the test
        monkeypatch.delenv(var, raising=False)
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(res.JOBS_ENV, "1")
        budget = res.ThreadBudget(0, every_s=0)
        assert 1 <= budget.threads == torch.get_num_threads() <= res.available_cpus()
        assert os.environ["OMP_NUM_THREADS"] == str(budget.threads)
        assert res.user_threads() is None  # our own export is not a user choice
        monkeypatch.setenv(res.JOBS_ENV, "1000")  # a launcher now runs many jobs
        assert budget.refresh() == 1 == torch.get_num_threads()
        fixed = res.ThreadBudget(2, every_s=0)
        monkeypatch.setenv(res.JOBS_ENV, "1")
        assert fixed.refresh() == 2 == torch.get_num_threads()  # the user's choice never moves
        slow = res.ThreadBudget(0, every_s=3600)
        monkeypatch.setenv(res.JOBS_ENV, "1000")
        assert slow.refresh() == slow.threads  # not re-read before every_s
    finally:
        torch.set_num_threads(before)


def test_available_memory_is_memavailable_lowered_by_a_cgroup_limit(tmp_path):
    from entropyrl.core.resources import available_memory_bytes

    meminfo = "MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n"
    assert available_memory_bytes(meminfo, proc_cgroup="", root=tmp_path) == 20000000 * 1024
    job = tmp_path / "job"
    job.mkdir()
    (job / "memory.max").write_text(f"{8 << 30}\n")
    (job / "memory.current").write_text(f"{3 << 30}\n")
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("123\n")
    assert available_memory_bytes(meminfo, proc_cgroup="0::/job\n", root=tmp_path) == 5 << 30
    assert available_memory_bytes("", proc_cgroup="", root=tmp_path) is None
    assert available_memory_bytes() is None or available_memory_bytes() > 0  # this machine's


@pytest.mark.parametrize("bad", ["abc", -2, 1.5, "-1", True])
def test_a_thread_setting_that_is_no_count_is_one_error_naming_the_option(bad):
    from entropyrl.core.errors import UserError
    from entropyrl.core.resources import check_threads

    with pytest.raises(UserError, match=r"^eval\.threads=.* is not a thread count: give a positive integer"):
        check_threads(bad, "eval.threads")
    for good in (0, "0", "auto", None, 1, 3, "2"):
        check_threads(good, "eval.threads")
