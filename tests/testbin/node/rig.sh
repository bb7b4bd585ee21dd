#!/usr/bin/env bash
# A real single-node Kubernetes cluster for one test run, in namespaces the test creates:
#   unshare --net --mount --pid --fork --mount-proc --propagation private --kill-child \
#     rig.sh STATE BIN PAUSE_ARCHIVE CGROUP_ROOT
# STATE: an empty directory for everything the rig writes; BIN: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kube-proxy and kubectl
# (tests/testbin/build.sh); PAUSE_ARCHIVE: the OCI archive of docker.io/local/pause:1
# (tests/testbin/node/build.sh), containerd's sandbox image; CGROUP_ROOT: a cgroup
# name of this run (the kubelet's cgroupRoot), created here and removed on the way out.
#
# This script is PID 1 of the PID namespace: when it exits, the kernel kills every
# process in it (containerd's shims and the containers too), the mount namespace takes
# the kubelet's and containerd's mounts, and the network namespace (only lo, node0 with
# the node IP 10.200.0.1, the CNI bridge and the Pods' veths; no link out)
# takes the bridge, the veths and every iptables rule. Nothing here can reach another
# machine: the default route points at node0, which drops everything.
#
# The host reaches the apiserver only through the file system: STATE/apiserver.sock
# (socat to 127.0.0.1:6443 here). STATE/ready appears when the apiserver answers and
# every component has started; STATE/<component>.log are their logs.
#
# node0 is a bridge with no ports (this kernel has no dummy devices): an interface that
# is up, holds the node IP and drops whatever is routed to it.
set -euo pipefail
state=$1 bin=$2 pause_archive=$3 cgroup_root=$4
export PATH=$bin:$PATH:/usr/sbin:/sbin
node_ip=10.200.0.1
node_name=rig-node
pod_cidr=10.244.0.0/24
service_cidr=10.96.0.0/24
pki=$state/pki
mkdir -p "$pki" "$state/etcd" "$state/kubelet" "$state/containerd" "$state/cni" \
  "$state/run" "$state/log" "$state/var-lib-cni"
log() { echo "rig: $(date +%T.%3N) $*"; }

# --- Namespaces: network and file system ------------------------------------------
ip link set lo up
ip link add node0 type bridge
ip addr add "$node_ip/32" dev node0
ip link set node0 up
ip route add default dev node0
echo 1 >/proc/sys/net/ipv4/ip_forward
echo 1 >/proc/sys/net/ipv4/conf/all/route_localnet

# Private copies of the fixed paths containerd, runc, the CNI plugins and the kubelet
# write to (bind mounts seen only in this mount namespace): /run (containerd's shim
# sockets, runc's state, the Pods' network namespaces), /var/log (Pod logs),
# /var/lib/cni (IPAM leases, libcni's cache); /etc/hosts and /etc/resolv.conf so no
# name lookup leaves loopback.
ln -sfn /dev/shm "$state/run/shm"
mkdir -p "$state/run/lock"
mount --bind "$state/run" /run
mount --bind "$state/log" /var/log
mkdir -p /var/lib/cni   # the mount point (an empty directory on the host)
mount --bind "$state/var-lib-cni" /var/lib/cni
printf '127.0.0.1 localhost\n%s %s\n' "$node_ip" "$node_name" >"$state/hosts"
printf 'nameserver 127.0.0.1\n' >"$state/resolv.conf"
mount --bind "$state/hosts" /etc/hosts
mount --bind "$state/resolv.conf" /etc/resolv.conf

# The kubelet's cgroup root, in every hierarchy (cgroup v1 here; the unified one too).
cgroup_dirs=()
for hierarchy in /sys/fs/cgroup/*/; do
  [[ -d "$hierarchy" && ! -L "${hierarchy%/}" ]] || continue
  mkdir -p "$hierarchy$cgroup_root"
  cgroup_dirs+=("$hierarchy$cgroup_root")
done
if [[ -d /sys/fs/cgroup/cpuset/$cgroup_root ]]; then
  cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/$cgroup_root/cpuset.cpus"
  cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/$cgroup_root/cpuset.mems"
fi
remove_cgroups() {
  local dir
  for dir in "${cgroup_dirs[@]}"; do
    [[ -d "$dir" ]] && find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

# --- Lifecycle ----------------------------------------------------------------------
children=()
names=()
# stop [STATUS]: stops everything and exits with STATUS (0).
stop() {
  local status=${1:-0}
  trap - TERM INT HUP EXIT
  log "stopping"
  # SIGTERM first and a short grace (everything here is thrown away, and the apiserver
  # would take its time draining), then SIGKILL.
  local pid alive
  for pid in "${children[@]}"; do kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 20); do
    alive=0
    for pid in "${children[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  # Every process of this PID namespace but this one: shims, containers, stragglers.
  kill -KILL -1 2>/dev/null || true
  local p others
  for _ in $(seq 100); do
    others=0
    for p in /proc/[0-9]*; do [[ ${p#/proc/} == 1 ]] || others=1; done
    ((others)) || break
    sleep 0.1
  done
  remove_cgroups
  log "stopped"
  exit "$status"
}
trap 'stop 0' TERM INT HUP
trap 'stop $?' EXIT
# Lifeline: stdin is a pipe the test process holds open. EOF means the test process is
# gone (even after kill -9), and then so is everything here.
exec 3<&0
{ cat <&3 >/dev/null; kill -TERM 1; } </dev/null &
exec </dev/null

# start NAME COMMAND...: runs a component in the background, its output in STATE/NAME.log.
start() {
  local name=$1
  shift
  log "starting $name"
  "$@" 3<&- >"$state/$name.log" 2>&1 &
  children+=($!)
  names+=("$name")
}

# wait_for WHAT SECONDS COMMAND...: polls COMMAND until it succeeds.
wait_for() {
  local what=$1 seconds=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      log "$what did not come up in ${seconds}s"
      stop 1
    fi
    for i in "${!children[@]}"; do
      if ! kill -0 "${children[$i]}" 2>/dev/null; then
        log "${names[$i]} exited while waiting for $what"
        stop 1
      fi
    done
    sleep 0.2
  done
}

# --- Certificates and identities --------------------------------------------------------
openssl_quiet() { openssl "$@" 2>>"$state/openssl.log"; }
openssl_quiet req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=banlieue-node-rig-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt"
# sign NAME SUBJECT EXTENSIONS: a key and a CA-signed certificate NAME.{key,crt}.
sign() {
  local name=$1 subject=$2 ext=$3
  openssl_quiet req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$pki/$name.key" -out "$pki/$name.csr"
  printf '%s\n' "$ext" >"$pki/$name.ext"
  openssl_quiet x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/$name.ext" -out "$pki/$name.crt"
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}
sign apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$node_ip,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
sign kubelet "/CN=$node_name" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$node_ip,DNS:$node_name"
# The aggregation layer's front proxy: its own CA and the apiserver's client cert.
openssl_quiet req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=banlieue-node-rig-front-proxy-ca" \
  -keyout "$pki/front-proxy-ca.key" -out "$pki/front-proxy-ca.crt"
openssl_quiet req -newkey rsa:2048 -nodes -subj "/CN=front-proxy-client" \
  -keyout "$pki/front-proxy-client.key" -out "$pki/front-proxy-client.csr"
printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >"$pki/front-proxy-client.ext"
openssl_quiet x509 -req -in "$pki/front-proxy-client.csr" -CA "$pki/front-proxy-ca.crt" \
  -CAkey "$pki/front-proxy-ca.key" -CAcreateserial -days 2 -extfile "$pki/front-proxy-client.ext" \
  -out "$pki/front-proxy-client.crt"
rm -f "$pki/front-proxy-client.csr" "$pki/front-proxy-client.ext"
openssl_quiet genrsa -out "$pki/sa.key" 2048
openssl_quiet rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

# Static tokens (--token-auth-file): real authentication, one identity per component.
token() { openssl rand -hex 16; }
admin_token=$(token)
printf '%s\n' "$admin_token" >"$state/admin-token"
{
  echo "$admin_token,admin,admin,system:masters"
  echo "$(token | tee "$state/token-controller-manager"),system:kube-controller-manager,kcm"
  echo "$(token | tee "$state/token-scheduler"),system:kube-scheduler,kube-scheduler"
  echo "$(token | tee "$state/token-kubelet"),system:node:$node_name,kubelet,system:nodes"
  echo "$(token | tee "$state/token-kube-proxy"),system:kube-proxy,kube-proxy"
} >"$pki/tokens.csv"
chmod 600 "$pki/tokens.csv" "$state"/token-* "$state/admin-token"
# kubeconfig NAME TOKEN: STATE/NAME.kubeconfig for the apiserver inside the namespace.
kubeconfig() {
  cat >"$state/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: rig
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: "$pki/ca.crt"}
users:
- name: $1
  user: {token: "$2"}
contexts:
- name: $1@rig
  context: {cluster: rig, user: $1}
current-context: $1@rig
EOF
}
kubeconfig admin "$admin_token"
for who in controller-manager scheduler kubelet kube-proxy; do kubeconfig "$who" "$(<"$state/token-$who")"; done

# --- Control plane --------------------------------------------------------------------
# The audit log (<state>/audit.log, JSON lines): every request of a ServiceAccount at the
# Metadata level, so that a test can list what the Pods' identities did and were refused.
cat >"$state/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
POLICY
start etcd etcd --name=rig --data-dir="$state/etcd" \
  --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
  --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
  --initial-cluster=rig=http://127.0.0.1:2380 --listen-metrics-urls=http://127.0.0.1:2381 \
  --unsafe-no-fsync=true --log-level=warn
start kube-apiserver kube-apiserver \
  --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=0.0.0.0 --secure-port=6443 --advertise-address="$node_ip" \
  --cert-dir="$pki" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" --token-auth-file="$pki/tokens.csv" \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --service-cluster-ip-range="$service_cidr" --allow-privileged=true \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
  --requestheader-client-ca-file="$pki/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file="$pki/front-proxy-client.crt" --proxy-client-key-file="$pki/front-proxy-client.key" \
  --audit-policy-file="$state/audit-policy.yaml" --audit-log-path="$state/audit.log" \
  --audit-log-format=json --audit-log-mode=blocking \
  --profiling=false
wait_for kube-apiserver 60 kubectl --kubeconfig "$state/admin.kubeconfig" get --raw /readyz
# The host's door to the apiserver (the test process proxies TCP on loopback to it).
start apiserver-socket socat "UNIX-LISTEN:$state/apiserver.sock,fork,unlink-early,mode=600" TCP:127.0.0.1:6443

start kube-controller-manager kube-controller-manager \
  --kubeconfig="$state/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$state/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$state/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --cert-dir="$state/controller-manager-certs" \
  --leader-elect=false --use-service-account-credentials=true \
  --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
  --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
  --service-cluster-ip-range="$service_cidr" --cluster-cidr="$pod_cidr" --allocate-node-cidrs=false \
  --profiling=false
start kube-scheduler kube-scheduler \
  --kubeconfig="$state/scheduler.kubeconfig" \
  --authentication-kubeconfig="$state/scheduler.kubeconfig" \
  --authorization-kubeconfig="$state/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false --profiling=false

# --- The node ------------------------------------------------------------------------------
cat >"$state/cni/10-bridge.conflist" <<EOF
{"cniVersion":"0.4.0","name":"rig","plugins":[
 {"type":"bridge","bridge":"rigbr0","isGateway":true,"ipMasq":false,"hairpinMode":true,
  "ipam":{"type":"host-local","dataDir":"$state/var-lib-cni/networks","ranges":[[{"subnet":"$pod_cidr"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
 {"type":"portmap","capabilities":{"portMappings":true}}]}
EOF
cat >"$state/containerd.toml" <<EOF
version = 2
root = "$state/containerd/root"
state = "$state/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$state/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$state/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/local/pause:1"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$state/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
EOF
start containerd containerd --config "$state/containerd.toml"
wait_for containerd 30 ctr --address "$state/containerd.sock" version
ctr --address "$state/containerd.sock" -n k8s.io images import "$pause_archive" >"$state/pause-import.log" 2>&1 ||
  { log "importing $pause_archive failed: $(cat "$state/pause-import.log")"; stop 1; }

cat >"$state/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$cgroup_root
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://$state/containerd.sock
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true, cacheTTL: 10s}
  x509: {clientCAFile: "$pki/ca.crt"}
authorization:
  mode: Webhook
  webhook: {cacheAuthorizedTTL: 10s, cacheUnauthorizedTTL: 5s}
address: $node_ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: "$pki/kubelet.crt"
tlsPrivateKeyFile: "$pki/kubelet.key"
rotateCertificates: false
serverTLSBootstrap: false
staticPodPath: ""
enforceNodeAllocatable: []
localStorageCapacityIsolation: false
evictionHard: {}
serializeImagePulls: false
resolvConf: ""
clusterDomain: cluster.local
nodeStatusReportFrequency: 10s
EOF
start kubelet kubelet --config="$state/kubelet.yaml" --kubeconfig="$state/kubelet.kubeconfig" \
  --root-dir="$state/kubelet" --node-ip="$node_ip" --hostname-override="$node_name" --v=2

cat >"$state/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$state/kube-proxy.kubeconfig"}
mode: iptables
hostnameOverride: $node_name
clusterCIDR: $pod_cidr
bindAddress: $node_ip
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [primary]
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
start kube-proxy kube-proxy --config="$state/kube-proxy.yaml"

touch "$state/ready"
log "ready"
set +e
wait -n
for i in "${!children[@]}"; do
  kill -0 "${children[$i]}" 2>/dev/null || log "${names[$i]} exited"
done
stop 1
