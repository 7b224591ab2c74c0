"""The per-call memory cgroup's file protocol (envs/sandbox_cgroup.py) for cgroup v2, on a folder laid out
as the kernel lays out a cgroup v2 tree (Documentation/admin-guide/cgroup-v2.rst). The v1 hierarchy and
the kernel's charging are exercised for real by tests/envs/test_sandbox_attacks.py on the machines that
have it; a host with cgroup v2 and a delegated memory subtree runs those same tests through this code."""

from __future__ import annotations

import shutil

from envs.sandbox_cgroup import V2, JailCgroup, _v2_parent


def _cgroup(path, subtree=""):
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text("cpu memory pids\n")
    (path / "cgroup.subtree_control").write_text(subtree)
    return path


def test_v2_per_call_cgroups_go_where_children_get_the_memory_controller(tmp_path):
    mount = _cgroup(tmp_path, "memory pids\n")
    service = _cgroup(mount / "harness.service")  # holds our process: it cannot enable controllers
    assert _v2_parent(mount, service) == (mount, "")  # so the calls are its siblings
    delegated = _cgroup(service / "sandbox", "memory\n")  # a delegated subtree this process is not in
    assert _v2_parent(mount, delegated) == (delegated, "")
    (mount / "cgroup.subtree_control").write_text("pids\n")
    root, why = _v2_parent(mount, service)
    assert root is None and "delegated subtree" in why and str(service) in why


def test_v2_limit_no_swap_whole_jail_killed_events_read_and_reclaimed(tmp_path):
    root = _cgroup(tmp_path, "memory\n")
    cgroup = JailCgroup(root, 300)
    try:
        assert cgroup.files is V2 and cgroup.procs == cgroup.path / "cgroup.procs"
        assert (cgroup.path / "memory.max").read_text() == str(300 << 20)
        assert (cgroup.path / "memory.oom.group").read_text() == "1"
        assert not cgroup.oom_killed() and cgroup.failures() == 0  # no events file yet: nothing happened
        (cgroup.path / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 1\n")
        assert cgroup.oom_killed() and cgroup.failures() == 7
        cgroup.reclaim()  # what the call still holds is freed, not handed to the parent
        assert (cgroup.path / "memory.reclaim").read_text() == "300M"
    finally:
        shutil.rmtree(cgroup.path)
