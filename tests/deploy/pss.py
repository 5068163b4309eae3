"""The Kubernetes Pod Security Standards, "baseline" and "restricted" profiles, as explicit checks.

Written from the standard (kubernetes.io/docs/concepts/security/pod-security-standards, policy
version "latest"), one function per control, so that a failure names the control and the field.
`restricted_violations(pod_spec)` returns what the restricted profile (which includes baseline)
would refuse; an empty list means the pod would be admitted in a namespace labelled
`pod-security.kubernetes.io/enforce: restricted`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Pod = dict[str, Any]

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_ADDABLE_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
SECCOMP_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})


def containers(pod: Pod) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every container, init and ephemeral ones included, with a name for messages."""
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod.get(field) or []:
            yield f"{field}[{container.get('name', '?')}]", container


def _security(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("securityContext") or {}


# ---- baseline -----------------------------------------------------------------------------------


def host_process(pod: Pod) -> Iterator[str]:
    if (_security(pod).get("windowsOptions") or {}).get("hostProcess"):
        yield "HostProcess: spec.securityContext.windowsOptions.hostProcess is true"
    for where, c in containers(pod):
        if (_security(c).get("windowsOptions") or {}).get("hostProcess"):
            yield f"HostProcess: {where}.securityContext.windowsOptions.hostProcess is true"


def host_namespaces(pod: Pod) -> Iterator[str]:
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            yield f"Host Namespaces: spec.{field} is true"


def privileged(pod: Pod) -> Iterator[str]:
    for where, c in containers(pod):
        if _security(c).get("privileged"):
            yield f"Privileged Containers: {where}.securityContext.privileged is true"


def baseline_capabilities(pod: Pod) -> Iterator[str]:
    for where, c in containers(pod):
        added = set((_security(c).get("capabilities") or {}).get("add") or [])
        if extra := added - BASELINE_CAPABILITIES:
            yield f"Capabilities: {where} adds {sorted(extra)}"


def host_path_volumes(pod: Pod) -> Iterator[str]:
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            yield f"HostPath Volumes: volume {volume.get('name')} is a hostPath"


def host_ports(pod: Pod) -> Iterator[str]:
    for where, c in containers(pod):
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                yield f"Host Ports: {where} binds hostPort {port['hostPort']}"


def apparmor(pod: Pod) -> Iterator[str]:
    profiles = [("spec", _security(pod).get("appArmorProfile"))]
    profiles += [(where, _security(c).get("appArmorProfile")) for where, c in containers(pod)]
    for where, profile in profiles:
        if profile and profile.get("type") not in APPARMOR_ALLOWED:
            yield f"AppArmor: {where} appArmorProfile.type is {profile.get('type')}"


def selinux(pod: Pod) -> Iterator[str]:
    options = [("spec", _security(pod).get("seLinuxOptions"))]
    options += [(where, _security(c).get("seLinuxOptions")) for where, c in containers(pod)]
    for where, option in options:
        if not option:
            continue
        if option.get("type", "") not in SELINUX_TYPES:
            yield f"SELinux: {where} seLinuxOptions.type is {option.get('type')}"
        for field in ("user", "role"):
            if option.get(field):
                yield f"SELinux: {where} sets seLinuxOptions.{field}"


def proc_mount(pod: Pod) -> Iterator[str]:
    for where, c in containers(pod):
        if _security(c).get("procMount", "Default") != "Default":
            yield f"/proc Mount Type: {where} procMount is {_security(c)['procMount']}"


def seccomp_not_unconfined(pod: Pod) -> Iterator[str]:
    profiles = [("spec", _security(pod).get("seccompProfile"))]
    profiles += [(where, _security(c).get("seccompProfile")) for where, c in containers(pod)]
    for where, profile in profiles:
        if profile and profile.get("type") == "Unconfined":
            yield f"Seccomp: {where} seccompProfile.type is Unconfined"


def sysctls(pod: Pod) -> Iterator[str]:
    for sysctl in _security(pod).get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield f"Sysctls: {sysctl.get('name')} is not a safe sysctl"


# ---- restricted ---------------------------------------------------------------------------------


def volume_types(pod: Pod) -> Iterator[str]:
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if bad := kinds - RESTRICTED_VOLUME_TYPES:
            yield f"Volume Types: volume {volume.get('name')} is {sorted(bad)}"


def privilege_escalation(pod: Pod) -> Iterator[str]:
    for where, c in containers(pod):
        if _security(c).get("allowPrivilegeEscalation") is not False:
            yield f"Privilege Escalation: {where} does not set allowPrivilegeEscalation: false"


def running_as_non_root(pod: Pod) -> Iterator[str]:
    pod_level = _security(pod).get("runAsNonRoot")
    if pod_level is False:
        yield "Running as Non-root: spec.securityContext.runAsNonRoot is false"
    for where, c in containers(pod):
        own = _security(c).get("runAsNonRoot")
        if own is False:
            yield f"Running as Non-root: {where}.securityContext.runAsNonRoot is false"
        elif own is None and pod_level is not True:
            yield f"Running as Non-root: {where} sets no runAsNonRoot and neither does the pod"


def running_as_non_root_user(pod: Pod) -> Iterator[str]:
    if _security(pod).get("runAsUser") == 0:
        yield "Running as Non-root user: spec.securityContext.runAsUser is 0"
    for where, c in containers(pod):
        if _security(c).get("runAsUser") == 0:
            yield f"Running as Non-root user: {where}.securityContext.runAsUser is 0"


def seccomp(pod: Pod) -> Iterator[str]:
    pod_type = (_security(pod).get("seccompProfile") or {}).get("type")
    if pod_type is not None and pod_type not in SECCOMP_ALLOWED:
        yield f"Seccomp: spec.securityContext.seccompProfile.type is {pod_type}"
    for where, c in containers(pod):
        own = (_security(c).get("seccompProfile") or {}).get("type")
        if own is not None and own not in SECCOMP_ALLOWED:
            yield f"Seccomp: {where}.securityContext.seccompProfile.type is {own}"
        elif own is None and pod_type not in SECCOMP_ALLOWED:
            yield f"Seccomp: {where} sets no seccompProfile and neither does the pod"


def restricted_capabilities(pod: Pod) -> Iterator[str]:
    for where, c in containers(pod):
        capabilities = _security(c).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            yield f"Capabilities: {where} does not drop ALL"
        added = set(capabilities.get("add") or [])
        if extra := added - RESTRICTED_ADDABLE_CAPABILITIES:
            yield f"Capabilities: {where} adds {sorted(extra)} (only NET_BIND_SERVICE may be)"


BASELINE: tuple[Callable[[Pod], Iterator[str]], ...] = (
    host_process,
    host_namespaces,
    privileged,
    baseline_capabilities,
    host_path_volumes,
    host_ports,
    apparmor,
    selinux,
    proc_mount,
    seccomp_not_unconfined,
    sysctls,
)
RESTRICTED: tuple[Callable[[Pod], Iterator[str]], ...] = (
    *BASELINE,
    volume_types,
    privilege_escalation,
    running_as_non_root,
    running_as_non_root_user,
    seccomp,
    restricted_capabilities,
)


def restricted_violations(pod_spec: Pod) -> list[str]:
    return [message for check in RESTRICTED for message in check(pod_spec)]


def pod_spec_of(obj: dict[str, Any]) -> Pod:
    """The pod spec of a Pod or of a workload's pod template."""
    if obj["kind"] == "Pod":
        return dict(obj["spec"])
    if obj["kind"] == "CronJob":
        return dict(obj["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    return dict(obj["spec"]["template"]["spec"])


POD_KINDS = frozenset(
    {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}
)
