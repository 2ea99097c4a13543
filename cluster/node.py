"""`make cluster` / `make cluster-down`: a single-node Kubernetes in namespaces this script creates.

Layout. A network namespace `ttsk8s-node` holds the node: a veth pair inside it carries the node IP,
the CNI bridge gives pods their addresses, kube-proxy's iptables rules live there and nowhere else. A
holder process in that namespace owns a private mount namespace in which every component runs (so
containerd's overlay mounts, the pods' network-namespace files and kubelet's tmpfs volumes never show
on the host). The host reaches the cluster only through cluster.loopback on 127.0.0.1.

Every pid, the namespaces, the cgroup root and the directories created on the host are recorded in the
state folder; `down` stops what the record names, then sweeps by name (the netns prefix, the cgroup
root, processes in the holder's mount namespace or naming the state folder), so a crash or an
interrupted `up` leaves nothing either. Run: python -m cluster.node up | down | status."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from cluster import build, images, pins, pki

PREFIX = "ttsk8s"
NETNS = f"{PREFIX}-node"
NODE_NAME = NETNS
NODE_IP = "10.213.0.2"
POD_CIDR = "10.214.0.0/24"
SERVICE_CIDR = "10.215.0.0/24"
API_SERVICE_IP = "10.215.0.1"
DNS_IP = "10.215.0.10"
CGROUP_ROOT = f"/{PREFIX}"
CGROUP_FS = Path("/sys/fs/cgroup")
API_PORT = int(os.environ.get("CLUSTER_API_PORT", "16443"))
STATE = Path(os.environ.get("CLUSTER_STATE", pins.user_cache() / "state"))
RECORD = STATE / "record.json"
MANIFESTS = Path(__file__).resolve().parent / "manifests"
# Host directories the private mount namespace mounts over (they must exist on the host first).
MOUNT_POINTS = ("/run/netns", "/run/containerd", "/var/lib/cni", "/var/lib/kubelet")


class Record:
    """What `up` created, written after each step so `down` finds it after a crash."""

    def __init__(self) -> None:
        self.data: dict = (
            json.loads(RECORD.read_text()) if RECORD.exists() else {"pids": {}, "created_dirs": []}
        )

    def save(self) -> None:
        STATE.mkdir(parents=True, exist_ok=True)
        tmp = RECORD.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.rename(RECORD)

    def pid(self, name: str, pid: int) -> None:
        self.data["pids"][name] = pid
        self.save()

    def cluster_pids(self) -> list[int]:
        """The pids of the cluster itself: what `make cluster-deploy` added on top (cluster.deploy names
        them in `deployed`) is stopped by `down` too, but its absence does not mean the cluster is down."""
        deployed = set(self.data.get("deployed", []))
        return [pid for name, pid in self.data["pids"].items() if name not in deployed]


def log(message: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(*cmd: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=capture, text=True)


# --- paths ---------------------------------------------------------------------------------------


def bins() -> dict[str, Path]:
    found = {}
    for directory in build.bin_dirs().values():
        if directory.is_dir():
            found |= {p.name: p for p in directory.iterdir() if not p.name.startswith(".")}
    return found


def kubectl_path() -> Path:
    return build.bin_dirs()["kubernetes"] / "kubectl"


def admin_kubeconfig() -> Path:
    return STATE / "admin.kubeconfig"


def kubectl(*args: str, check: bool = True, input_text: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(kubectl_path()), f"--kubeconfig={admin_kubeconfig()}", *args],
        check=check,
        capture_output=True,
        text=True,
        input=input_text,
    )


# --- namespaces ----------------------------------------------------------------------------------


def _netns_exists(name: str) -> bool:
    return Path(f"/run/netns/{name}").exists()


def make_network(record: Record) -> None:
    # The first `ip netns add` on a machine creates /run/netns and bind-mounts it on itself: ours to undo.
    record.data["made_run_netns"] = not Path("/run/netns").exists()
    record.save()
    run("ip", "netns", "add", NETNS)
    record.data["netns"] = NETNS
    record.save()
    node = ("ip", "-n", NETNS)
    run(*node, "link", "set", "lo", "up")
    # No dummy driver in this kernel: a veth pair, both ends in the node, carries the node IP.
    run(*node, "link", "add", f"{PREFIX}0", "type", "veth", "peer", "name", f"{PREFIX}1")
    run(*node, "addr", "add", f"{NODE_IP}/24", "dev", f"{PREFIX}0")
    run(*node, "link", "set", f"{PREFIX}0", "up")
    run(*node, "link", "set", f"{PREFIX}1", "up")
    # Service IPs are DNATed by kube-proxy in OUTPUT; they need a route to get there.
    run(*node, "route", "add", "default", "dev", f"{PREFIX}0")
    run(
        "ip", "netns", "exec", NETNS, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
        "net.bridge.bridge-nf-call-iptables=1", "net.ipv4.conf.all.route_localnet=1",
    )  # fmt: skip


def start_holder(record: Record) -> int:
    for point in MOUNT_POINTS:
        if not Path(point).exists():
            Path(point).mkdir(parents=True)
            record.data["created_dirs"].append(point)
    record.save()
    (STATE / "cni-lib").mkdir(parents=True, exist_ok=True)
    # Not `ip netns exec`: it remounts /sys without the cgroup hierarchies runc needs. Here the holder
    # mounts a sysfs of the node's netns and the host's cgroup hierarchies again on top of it.
    steps = [
        "mount --make-rshared /",
        "mount -t sysfs ttsk8s-sysfs /sys",
        "mount -t tmpfs -o mode=755 ttsk8s-cgroup /sys/fs/cgroup",
        *_cgroup_mounts(),
        *_kernel_tunable_mounts(),
        "mount -t tmpfs -o mode=755 ttsk8s-netns /run/netns",
        "mount -t tmpfs -o mode=711 ttsk8s-containerd /run/containerd",
        # The kubelet's device-plugin socket is at a fixed /var/lib/kubelet path, whatever --root-dir says.
        "mount -t tmpfs -o mode=750 ttsk8s-kubelet /var/lib/kubelet",
        f"mount --bind {STATE}/cni-lib /var/lib/cni",
        # Controllers running as node processes resolve Service names as pods do (through CoreDNS).
        f"mount --bind {_node_resolv_conf()} /etc/resolv.conf",
        f"echo ready > {STATE}/holder.ready",
        "exec sleep infinity",
    ]
    script = " && ".join(steps)
    (STATE / "holder.ready").unlink(missing_ok=True)
    proc = subprocess.Popen(
        [
            "nsenter",
            f"--net=/run/netns/{NETNS}",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
        ],
        stdout=(STATE / "logs" / "holder.log").open("a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    record.pid("holder", proc.pid)
    for _ in range(100):
        if (STATE / "holder.ready").exists():
            break
        if proc.poll() is not None:
            raise SystemExit(
                f"namespace holder exited: {(STATE / 'logs' / 'holder.log').read_text()[-2000:]}"
            )
        time.sleep(0.1)
    record.data["mntns"] = os.readlink(f"/proc/{proc.pid}/ns/mnt")
    record.data["netns_inode"] = os.readlink(f"/proc/{proc.pid}/ns/net")
    record.save()
    return proc.pid


# What kubelet insists on finding in /proc/sys (else it writes them: host-wide settings of a shared
# machine, e.g. vm.overcommit_memory and kernel.panic_on_oops). In the node's mount namespace each is a
# file holding the value kubelet wants, bind-mounted over the real one, so the host is never changed.
KUBELET_TUNABLES = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


def _kernel_tunable_mounts() -> list[str]:
    directory = STATE / "sysctl"
    directory.mkdir(parents=True, exist_ok=True)
    steps = []
    for key, value in KUBELET_TUNABLES.items():
        file = directory / key.replace("/", ".")
        file.write_text(value + "\n")
        steps.append(f"mount --bind -o ro {file} /proc/sys/{key}")
    return steps


def _node_resolv_conf() -> Path:
    file = STATE / "node-resolv.conf"
    file.write_text(f"nameserver {DNS_IP}\nsearch svc.cluster.local cluster.local\noptions ndots:5\n")
    return file


def _cgroup_mounts() -> list[str]:
    """The host's cgroup v1 hierarchies (and the unified one), to mount again in the node's /sys."""
    steps = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        point, fstype, options = fields[4], fields[dash + 1], fields[dash + 3]
        if fstype not in ("cgroup", "cgroup2") or not point.startswith("/sys/fs/cgroup/"):
            continue
        options = ",".join(o for o in options.split(",") if o not in ("rw", "ro")) or "defaults"
        steps += [f"mkdir -p {point}", f"mount -t {fstype} -o {options} ttsk8s-{fstype} {point}"]
    return steps


def in_node(holder: int) -> list[str]:
    return ["nsenter", f"--target={holder}", "--mount", "--net", "--"]


def start(record: Record, name: str, cmd: list[str]) -> int:
    holder = record.data["pids"]["holder"]
    out = (STATE / "logs" / f"{name}.log").open("a")
    proc = subprocess.Popen(
        in_node(holder) + cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    record.pid(name, proc.pid)
    return proc.pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][0] != "Z"


def wait_for(what: str, check, timeout: float, record: Record | None = None, watch: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if record and watch and not alive(record.data["pids"][watch]):
            tail = (STATE / "logs" / f"{watch}.log").read_text()[-3000:]
            raise SystemExit(f"{watch} exited while waiting for {what}:\n{tail}")
        time.sleep(1)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what} (logs: {STATE / 'logs'})")


def node_http_ok(holder: int, url: str, insecure_tls: bool = False) -> bool:
    cmd = [*in_node(holder), "curl", "-sf", "-o", "/dev/null", "--max-time", "3"]
    return subprocess.run([*cmd, *(["-k"] if insecure_tls else []), url], capture_output=True).returncode == 0


# --- configuration -------------------------------------------------------------------------------


def make_pki() -> dict[str, Path]:
    d = STATE / "pki"
    d.mkdir(parents=True, exist_ok=True)
    pki.ca(d, "ca")
    pki.ca(d, "front-proxy-ca")
    pki.service_account_key(d)
    names = (
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    )
    pki.leaf(
        d,
        "apiserver",
        "kube-apiserver",
        dns=(*names, "localhost"),
        ips=("127.0.0.1", NODE_IP, API_SERVICE_IP),
    )
    pki.leaf(
        d, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", organizations=("system:masters",)
    )
    pki.leaf(d, "front-proxy-client", "front-proxy-client", ca_name="front-proxy-ca")
    pki.leaf(d, "admin", "ttsk8s-admin", organizations=("system:masters",))
    pki.leaf(d, "controller-manager", "system:kube-controller-manager")
    pki.leaf(d, "scheduler", "system:kube-scheduler")
    pki.leaf(d, "kube-proxy", "system:kube-proxy")
    pki.leaf(d, "kubelet-client", f"system:node:{NODE_NAME}", organizations=("system:nodes",))
    pki.leaf(d, "kubelet", NODE_NAME, dns=(NODE_NAME,), ips=(NODE_IP,))
    ca = d / "ca.crt"
    inside = f"https://{NODE_IP}:6443"
    for name in ("controller-manager", "scheduler", "kube-proxy", "kubelet-client"):
        pki.kubeconfig(STATE / f"{name}.kubeconfig", inside, ca, d / f"{name}.crt", d / f"{name}.key", name)
    pki.kubeconfig(STATE / "node-admin.kubeconfig", inside, ca, d / "admin.crt", d / "admin.key", "admin")
    pki.kubeconfig(
        admin_kubeconfig(), f"https://127.0.0.1:{API_PORT}", ca, d / "admin.crt", d / "admin.key", "admin"
    )
    return {"dir": d, "ca": ca}


def write_configs() -> None:
    c = STATE / "containerd"
    for sub in ("root", "state"):
        (c / sub).mkdir(parents=True, exist_ok=True)
    (STATE / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
    (c / "config.toml").write_text(
        f"""version = 2
root = "{c}/root"
state = "{c}/state"
[grpc]
  address = "{c}/containerd.sock"
[ttrpc]
  address = "{c}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{images.PAUSE}"
  # No CAP_SYS_RESOURCE: never ask for an oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
        Root = "{STATE}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{STATE}/cni/net.d"
"""
    )
    (STATE / "cni" / "net.d" / "10-ttsk8s.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": PREFIX,
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": f"{PREFIX}-br",
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_CIDR}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": f"{STATE}/cni/ipam",
                        },
                    }
                ],
            },
            indent=1,
        )
    )
    (STATE / "resolv.conf").write_text("# nothing outside the cluster resolves: no upstream DNS\n")
    pkidir = STATE / "pki"
    (STATE / "kubelet.yaml").write_text(
        f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {pkidir}/ca.crt}}
authorization: {{mode: Webhook}}
tlsCertFile: {pkidir}/kubelet.crt
tlsPrivateKeyFile: {pkidir}/kubelet.key
containerRuntimeEndpoint: unix://{STATE}/containerd/containerd.sock
# PID 1 is not systemd and the machine runs cgroup v1 (hybrid).
cgroupDriver: cgroupfs
cgroupRoot: {CGROUP_ROOT}
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: false
clusterDNS: [{DNS_IP}]
clusterDomain: cluster.local
resolvConf: {STATE}/resolv.conf
podLogsDir: {STATE}/pod-logs
serializeImagePulls: false
# The disk is shared with other work: evict only when it is really full.
evictionHard: {{memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
rotateCertificates: false
"""
    )
    (STATE / "kube-proxy.yaml").write_text(
        f"""apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {STATE}/kube-proxy.kubeconfig}}
hostnameOverride: {NODE_NAME}
mode: iptables
clusterCIDR: {POD_CIDR}
# Pod -> Service -> pod on the same bridge: masquerade so the reply comes back through the node.
iptables: {{masqueradeAll: true}}
# Leave the kernel's conntrack table size alone (a netns cannot change it).
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
"""
    )


def commands() -> dict[str, list[str]]:
    found, d = bins(), STATE / "pki"
    b = {name: found.get(name, Path(name)) for name in ("etcd", *commands_needed())}
    return {
        "etcd": [
            str(b["etcd"]), "--name=ttsk8s", f"--data-dir={STATE}/etcd",
            "--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=ttsk8s=http://127.0.0.1:2380", "--listen-metrics-urls=http://127.0.0.1:2381",
            # A throwaway test cluster on a shared disk: durability is not worth the fsync latency.
            "--unsafe-no-fsync", "--quota-backend-bytes=2147483648",
        ],
        "kube-apiserver": [
            str(b["kube-apiserver"]), "--etcd-servers=http://127.0.0.1:2379", "--secure-port=6443",
            "--bind-address=0.0.0.0", f"--advertise-address={NODE_IP}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            f"--client-ca-file={d}/ca.crt", f"--tls-cert-file={d}/apiserver.crt",
            f"--tls-private-key-file={d}/apiserver.key",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={d}/sa.pub", f"--service-account-signing-key-file={d}/sa.key",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={d}/apiserver-kubelet-client.crt",
            f"--kubelet-client-key={d}/apiserver-kubelet-client.key",
            # The node's name resolves nowhere (no DNS outside the cluster): call the kubelet at its IP.
            "--kubelet-preferred-address-types=InternalIP",
            f"--requestheader-client-ca-file={d}/front-proxy-ca.crt",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--requestheader-group-headers=X-Remote-Group", "--requestheader-username-headers=X-Remote-User",
            f"--proxy-client-cert-file={d}/front-proxy-client.crt",
            f"--proxy-client-key-file={d}/front-proxy-client.key",
            # Aggregated APIs (KEDA's metrics server) are called at their endpoint, not the Service IP.
            "--enable-aggregator-routing=true", "--profiling=false",
        ],
        "kube-controller-manager": [
            str(b["kube-controller-manager"]), f"--kubeconfig={STATE}/controller-manager.kubeconfig",
            "--bind-address=127.0.0.1", "--leader-elect=false", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={d}/sa.key", f"--root-ca-file={d}/ca.crt",
            f"--cluster-signing-cert-file={d}/ca.crt", f"--cluster-signing-key-file={d}/ca.key",
            "--allocate-node-cidrs=false", "--profiling=false",
        ],
        "kube-scheduler": [
            str(b["kube-scheduler"]), f"--kubeconfig={STATE}/scheduler.kubeconfig",
            "--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false",
        ],
        "containerd": ["/usr/bin/containerd", f"--config={STATE}/containerd/config.toml"],
        "kubelet": [
            str(b["kubelet"]), f"--config={STATE}/kubelet.yaml", f"--kubeconfig={STATE}/kubelet-client.kubeconfig",
            f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}", f"--root-dir={STATE}/kubelet",
        ],
        "kube-proxy": [str(b["kube-proxy"]), f"--config={STATE}/kube-proxy.yaml"],
    }  # fmt: skip


def make_cgroups(record: Record) -> None:
    made = []
    for controller in sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink()):
        if controller.name == "unified":
            continue
        path = controller / CGROUP_ROOT.lstrip("/")
        path.mkdir(exist_ok=True)
        made.append(str(path))
        if controller.name == "cpuset":
            # A new cpuset cgroup starts with no CPUs and no memory nodes: copy the parent's.
            for name in ("cpuset.cpus", "cpuset.mems"):
                (path / name).write_text((controller / name).read_text())
    record.data["cgroups"] = made
    record.save()


# --- up ------------------------------------------------------------------------------------------


def api_ready() -> bool:
    if not admin_kubeconfig().exists() or not kubectl_path().exists():
        return False
    return kubectl("get", "--raw=/readyz", "--request-timeout=3s", check=False).returncode == 0


def is_up() -> bool:
    pids = Record().cluster_pids()
    return bool(pids) and all(alive(p) for p in pids) and api_ready()


def ctr(*args: str) -> subprocess.CompletedProcess:
    """containerd's CLI inside the node: its fifos and mounts must be in the node's mount namespace."""
    holder = Record().data["pids"]["holder"]
    return run(
        *in_node(holder), "ctr", f"--address={STATE}/containerd/containerd.sock", "-n", "k8s.io", *args
    )


def up() -> int:
    if is_up():
        log("cluster already up")
        print_env()
        return 0
    if RECORD.exists() or _netns_exists(NETNS):
        log("a previous cluster left state behind: sweeping it first")
        down(quiet=True)
    started = time.monotonic()
    # CLUSTER_PLATFORM=available: start the platform components already built and say which are
    # missing, instead of building them first (for a machine still in its cold build).
    partial = os.environ.get("CLUSTER_PLATFORM") == "available"
    missing = [n for n in ("etcd", "coredns", *commands_needed()) if n not in bins()]
    if missing:
        log(f"building {', '.join(missing)} (cold: about an hour on 2 cores)")
        build.main(["kubernetes", "coredns"])
    if not partial:
        build.main([])
    for directory in ("logs", "pod-logs", "kubelet", "runc", "cni/ipam"):
        (STATE / directory).mkdir(parents=True, exist_ok=True)
    shutil.rmtree(STATE / "etcd", ignore_errors=True)
    record = Record()
    record.data["started"] = time.time()
    record.save()
    make_pki()
    write_configs()
    make_network(record)
    holder = start_holder(record)
    make_cgroups(record)
    cmds = commands()

    start(record, "etcd", cmds["etcd"])
    wait_for("etcd", lambda: node_http_ok(holder, "http://127.0.0.1:2379/health"), 60, record, "etcd")
    start(record, "kube-apiserver", cmds["kube-apiserver"])
    proxy = subprocess.Popen(
        [sys.executable, "-m", "cluster.loopback", f"/run/netns/{NETNS}", f"{API_PORT}:127.0.0.1:6443"],
        cwd=Path(__file__).resolve().parents[1],
        stdout=(STATE / "logs" / "loopback.log").open("a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    record.pid("loopback", proxy.pid)
    wait_for("the API server", api_ready, 180, record, "kube-apiserver")
    log(f"API server ready on 127.0.0.1:{API_PORT}")
    start(record, "kube-controller-manager", cmds["kube-controller-manager"])
    start(record, "kube-scheduler", cmds["kube-scheduler"])
    start(record, "containerd", cmds["containerd"])
    sock = STATE / "containerd" / "containerd.sock"
    wait_for("containerd", lambda: sock.exists() and ctr_ok(), 60, record, "containerd")
    for archive in images.archives(STATE / "images"):
        ctr("images", "import", "--no-unpack=false", str(archive))
    start(record, "kubelet", cmds["kubelet"])
    wait_for("the node to register", node_registered, 120, record, "kubelet")
    start(record, "kube-proxy", cmds["kube-proxy"])
    wait_for("the node to be Ready", node_ready, 180, record, "kubelet")
    log("node Ready")
    apply_manifest("coredns.yaml", {"COREDNS_IMAGE": images.coredns_image()})
    wait_rollout("kube-system", "deployment/coredns", 180)
    from cluster import platform  # it builds on this module

    for what in platform.install(record, require_all=not partial):
        log(f"not started: {what}")
    log(f"cluster up in {time.monotonic() - started:.0f}s")
    print_env()
    return 0


def commands_needed() -> tuple[str, ...]:
    return ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl")


def ctr_ok() -> bool:
    return (
        subprocess.run(
            ["ctr", f"--address={STATE}/containerd/containerd.sock", "version"], capture_output=True
        ).returncode
        == 0
    )


def node_registered() -> bool:
    return kubectl("get", "node", NODE_NAME, check=False).returncode == 0


def node_ready() -> bool:
    out = kubectl(
        "get",
        "node",
        NODE_NAME,
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
        check=False,
    )
    return out.stdout.strip() == "True"


def apply_manifest(name: str, substitutions: dict[str, str] | None = None) -> None:
    text = (MANIFESTS / name).read_text()
    for key, value in {"DNS_IP": DNS_IP, **(substitutions or {})}.items():
        text = text.replace(f"${{{key}}}", value)
    out = kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=text, check=False)
    if out.returncode != 0:
        raise SystemExit(f"kubectl apply {name}: {out.stderr.strip()}")


def wait_rollout(namespace: str, target: str, timeout: int) -> None:
    out = kubectl("-n", namespace, "rollout", "status", target, f"--timeout={timeout}s", check=False)
    if out.returncode != 0:
        pods = kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False).stdout
        events = kubectl("-n", namespace, "get", "events", "--sort-by=.lastTimestamp", check=False).stdout[
            -3000:
        ]
        raise SystemExit(f"{target} not ready: {out.stderr.strip()}\n{pods}\n{events}")


def print_env() -> None:
    print(f"KUBECTL={kubectl_path()}")
    print(f"KUBECONFIG={admin_kubeconfig()}")


# --- down ----------------------------------------------------------------------------------------


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cgroup_dirs(root: Path) -> list[Path]:
    """Every cgroup under root; os.walk, not rglob: the kubelet may remove some while we look."""
    return [Path(top) for top, _, _ in os.walk(root, onerror=lambda _: None)]


def _cgroup_pids() -> set[int]:
    found: set[int] = set()
    for root in CGROUP_FS.glob(f"*/{CGROUP_ROOT.lstrip('/')}"):
        for procs in (d / "cgroup.procs" for d in _cgroup_dirs(root)):
            with contextlib.suppress(OSError):
                found |= {int(x) for x in procs.read_text().split()}
    return found


def ours(record: dict) -> set[int]:
    """Every process of the cluster: recorded, in the holder's namespaces, in its cgroups, or naming STATE."""
    me = os.getpid()
    found = {p for p in record.get("pids", {}).values() if alive(p)}
    # Namespace inodes are reused once a namespace dies: trust the recorded ones only while the named
    # node netns still exists (down deletes it last), so no other user's process is ever matched.
    netns_file = Path(f"/run/netns/{NETNS}")
    netns = f"net:[{netns_file.stat().st_ino}]" if netns_file.exists() else None
    mntns = record.get("mntns") if netns and netns == record.get("netns_inode") else None
    for pid in _pids():
        if pid == me:
            continue
        if (
            (mntns and _readlink(f"/proc/{pid}/ns/mnt") == mntns)
            or (netns and _readlink(f"/proc/{pid}/ns/net") == netns)
            or str(STATE) in _cmdline(pid)
            or f"/run/netns/{PREFIX}" in _cmdline(pid)
        ):
            found.add(pid)
    found |= _cgroup_pids()
    found.discard(me)
    return {p for p in found if alive(p)}


def _kill(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def down(quiet: bool = False) -> int:
    record = Record().data
    order = [
        "loopback",
        "kube-proxy",
        "kubelet",
        "kube-scheduler",
        "kube-controller-manager",
        "kube-apiserver",
    ]
    for name in order:
        pid = record.get("pids", {}).get(name)
        if pid and alive(pid):
            _kill({pid}, signal.SIGTERM)
    time.sleep(1)
    # Pods (cgroup members), shims, containerd, etcd, the holder: TERM, then KILL what is left.
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        _kill(ours(record), sig)
        deadline = time.monotonic() + wait
        while ours(record) and time.monotonic() < deadline:
            time.sleep(0.2)
    # Frozen or stuck: KILL again until nothing of ours lives (zombies are reaped by their parents).
    for _ in range(20):
        left = ours(record)
        if not left:
            break
        _kill(left, signal.SIGKILL)
        time.sleep(0.5)
    for name in sorted(Path("/run/netns").glob(f"{PREFIX}*")) if Path("/run/netns").exists() else []:
        run("ip", "netns", "del", name.name, check=False)
    for mount in reversed(_our_mounts()):
        run("umount", "-l", mount, check=False)
    for root in CGROUP_FS.glob(f"*/{CGROUP_ROOT.lstrip('/')}"):
        for directory in sorted(_cgroup_dirs(root), key=lambda p: -len(p.parts)):
            _rmdir(directory)
        _rmdir(root)
    for directory in record.get("created_dirs", []):
        _rmdir(Path(directory))
    run_netns = Path("/run/netns")
    if record.get("made_run_netns") and run_netns.is_dir() and not any(run_netns.iterdir()):
        run("umount", str(run_netns), check=False)
        _rmdir(run_netns)
    RECORD.unlink(missing_ok=True)
    shutil.rmtree(STATE / "etcd", ignore_errors=True)
    problems = leftovers()
    if problems:
        print("cluster-down left behind:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    if not quiet:
        log("cluster down: no process, mount, netns, interface, cgroup or iptables rule left")
    return 0


def _rmdir(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def _our_mounts() -> list[str]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith((str(STATE), f"/run/netns/{PREFIX}")):
            found.append(point)
    return found


def leftovers() -> list[str]:
    """What `down` must leave no trace of, checked on the host."""
    problems = [f"process {p}: {_cmdline(p)[:120]}" for p in sorted(ours(Record().data))]
    problems += [f"mount {m}" for m in _our_mounts()]
    if Path("/run/netns").exists():
        problems += [f"netns {n.name}" for n in Path("/run/netns").glob(f"{PREFIX}*")]
    links = run("ip", "-o", "link", "show", check=False).stdout
    problems += [f"interface {line.split(':')[1].strip()}" for line in links.splitlines() if PREFIX in line]
    problems += [f"cgroup {p}" for p in CGROUP_FS.glob(f"*/{CGROUP_ROOT.lstrip('/')}")]
    problems += [
        f"directory {d} (not empty)"
        for d in MOUNT_POINTS
        if Path(d).is_dir() and any(Path(d).iterdir()) and d != "/run/netns"
    ]
    if shutil.which("iptables-save"):
        rules = run("iptables-save", check=False).stdout
        problems += [f"iptables {line}" for line in rules.splitlines() if "KUBE-" in line or PREFIX in line]
    return problems


def status() -> int:
    record = Record().data
    for name, pid in record.get("pids", {}).items():
        print(f"{name:26} {pid:>8} {'running' if alive(pid) else 'gone'}")
    print(f"API ready: {api_ready()}")
    return 0 if is_up() else 1


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "up"
    if command == "up":
        return up()
    if command == "down":
        return down()
    if command == "status":
        return status()
    if command == "leftovers":
        problems = leftovers()
        print("\n".join(problems) or "nothing left")
        return 1 if problems else 0
    raise SystemExit("usage: python -m cluster.node up | down | status | leftovers")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
