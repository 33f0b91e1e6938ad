"""The seccomp filter every process of a local cluster's sandbox runs under, compiled to a
classic BPF program by libseccomp (through ``pyseccomp``, API-compatible with libseccomp's own
bindings).

The sandbox already takes every capability away and sets ``no_new_privs``; the filter closes
the kernel surface an unprivileged process still has and that crosses tenants or reaches the
host: nested user namespaces (where a process is root again, with every kernel path that opens),
the kernel keyrings (per uid, so they outlive the cluster), tracing or reaching into another
process (Ray's own run as the job's uid and hold files outside its disk), ``bpf``,
``perf_event_open``, ``userfaultfd`` (a tool for kernel exploits), mounts, modules, the clocks,
AIO and io_uring (host-wide pools), and the rest of a short deny list. Everything else is
allowed: Ray runs unchanged (but for py-spy's stack traces in its dashboard, which need ptrace).

A denied call fails with EPERM (ENOSYS for ``clone3``, whose flags a filter cannot read, so the
C library falls back to ``clone``, whose flags it can). A foreign architecture (32-bit calls on
a 64-bit host) kills the process: libseccomp's default for a filter of the native one only.
"""

from __future__ import annotations

import errno
import functools
import tempfile

# Calls that fail with EPERM whatever their arguments.
DENIED = (
    # keyrings: per uid, not per namespace, so a key would outlive the cluster
    "add_key",
    "keyctl",
    "request_key",
    # other processes of the cluster: Ray's own (``ray start`` among them) run as the job's
    # uid and hold files outside its disk (their output on the host), which tracing one, or
    # taking its descriptors, would open to the job
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    # the kernel's own attack surface
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "io_setup",  # the AIO pool is host-wide (fs.aio-max-nr)
    "io_submit",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "lookup_dcookie",
    "open_by_handle_at",  # opens any file of a mount by handle, past the mount's view
    "name_to_handle_at",
    "quotactl",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "vhangup",
    "fanotify_init",
    # namespaces and mounts: the sandbox's view is final (setns stays: it is how a node
    # enters, and without capabilities a tenant's setns joins nothing)
    "unshare",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # the host's clocks
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
)

# clone() may make threads and processes, never new namespaces.
CLONE_NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x00000080,  # CLONE_NEWTIME
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)


def available() -> str | None:
    """Why filters cannot be built here (None when they can)."""
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:
        return f"libseccomp is not usable ({exc}); install libseccomp2"
    return None


@functools.cache
def program() -> bytes:
    """The filter as a BPF program (``struct sock_filter`` array) for PR_SET_SECCOMP."""
    import pyseccomp as seccomp

    bpf = seccomp.SyscallFilter(seccomp.ALLOW)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED:
        bpf.add_rule(deny, name)
    for flag in CLONE_NAMESPACE_FLAGS:
        bpf.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    bpf.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as out:  # libseccomp writes to a descriptor
        bpf.export_bpf(out)
        out.seek(0)
        return out.read()
