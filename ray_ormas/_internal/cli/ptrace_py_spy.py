"""`ray-ormas ptrace-py-spy DIR`: a copy of py-spy in DIR that may read the stacks of any process
of its pod, for the fleet's `diagnose` action on KubeRay (k8s/components/diagnose).

Runs once per worker pod, in an init container, as root with only the `SETFCAP` capability:
it copies the py-spy this node would run (head/rank_stacks.py `py_spy`) into DIR (an emptyDir
the worker container mounts), and gives the copy the file capability `cap_sys_ptrace=ep`, the
`setcap cap_sys_ptrace+ep` of libcap written directly (the `security.capability` extended
attribute, version 2). The worker container then runs as Ray's non-root user with
`SYS_PTRACE` in its bounding set and privilege escalation allowed (no `no_new_privs`), and
`RAY_ORMAS_PY_SPY=DIR/py-spy`: only that binary gains the capability when it runs, not the
worker's own processes. Without it, a non-root container's py-spy cannot read a Ray worker's
process (Yama's `ptrace_scope` 1 and a dropped `SYS_PTRACE`).

Every failure is one line that says what to do, exit 2: py-spy missing, no `CAP_SETFCAP`, a
file system without extended attributes.

Hooks relied on: the kernel's `security.capability` xattr format (VFS_CAP_REVISION_2,
linux/capability.h), `os.setxattr`.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
from pathlib import Path

from ray_ormas._internal.head.rank_stacks import py_spy

logger = logging.getLogger("ray_ormas.cli")
CAP_SYS_PTRACE = 19  # linux/capability.h
VFS_CAP_REVISION_2 = 0x02000000
VFS_CAP_FLAGS_EFFECTIVE = 0x000001
CAPABILITY_XATTR = "security.capability"


def ptrace_capability() -> bytes:
    """`cap_sys_ptrace=ep` as the kernel stores it: revision 2, effective, permitted bit 19."""
    return struct.pack("<IIIII", VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE, 1 << CAP_SYS_PTRACE, 0, 0, 0)


def ptrace_py_spy(folder: str) -> int:
    """Write DIR/py-spy with `cap_sys_ptrace=ep` (see the module docstring); the exit code."""
    source = py_spy()
    if source is None:
        logger.error("ray-ormas ptrace-py-spy: py-spy is not installed in this image (pip install py-spy)")
        return 2
    target = Path(folder) / "py-spy"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        os.chmod(target, 0o755)  # before the capability: changing the owner or mode later would drop it
    except OSError as e:
        logger.error("ray-ormas ptrace-py-spy: cannot write %s (%s); mount a writable emptyDir there", target, e)
        return 2
    try:
        os.setxattr(target, CAPABILITY_XATTR, ptrace_capability())
        kept = os.getxattr(target, CAPABILITY_XATTR)
    except OSError as e:
        logger.error(
            "ray-ormas ptrace-py-spy: cannot give %s the SYS_PTRACE file capability (%s): run it as root with "
            "the SETFCAP capability (securityContext: runAsUser: 0, capabilities: add: [SETFCAP]) on a file "
            "system with extended attributes (an emptyDir)",
            target,
            e,
        )
        return 2
    magic, permitted = struct.unpack("<II", kept[:8])  # revision 2, or 3 in a user namespace (its root id added)
    if not magic & VFS_CAP_FLAGS_EFFECTIVE or not permitted & (1 << CAP_SYS_PTRACE):
        logger.error("ray-ormas ptrace-py-spy: %s kept another capability than SYS_PTRACE: %s", target, kept.hex())
        return 2
    logger.info("ray-ormas ptrace-py-spy: %s (from %s) may read the stacks of this pod's processes", target, source)
    return 0
