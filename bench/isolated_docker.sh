#!/usr/bin/env bash
# A throwaway Docker daemon beside the host's, with its own image store, build cache, exec root, socket and
# bridge: a cold machine for measuring (bench/readme_figures.sh COLD=isolated) that leaves the host's
# images, containers and caches as they were. Root only.
#
#   bash bench/isolated_docker.sh start DIR   # prints the DOCKER_HOST to use
#   bash bench/isolated_docker.sh stop DIR    # stops it, removes its bridge, rule and store
#
# Its bridge and subnet are its own (Docker's docs on running several daemons: a separate --bridge,
# --iptables=false); builds reach the package mirrors through rules of ours (a masquerade, and forwarding
# past the host daemon's FORWARD policy of DROP), and compose networks get addresses from a pool apart
# from the host daemon's, whose services reach each other through a rule of ours (without it the first
# cold run's monitoring test failed: Prometheus never reached the engine).
set -euo pipefail
action=${1:?start or stop}
dir=${2:?a scratch directory}
bridge=mscold0
subnet=172.29.0.0/16
pool=10.210.0.0/16  # compose networks' addresses: services talk to each other (Prometheus to the engine)

case "$action" in
start)
  if ip link show "$bridge" >/dev/null 2>&1; then
    echo "isolated_docker: bridge $bridge exists: is another isolated daemon running? stop it first" >&2
    exit 1
  fi
  mkdir -p "$dir/data" "$dir/exec"
  ip link add "$bridge" type bridge
  ip addr add 172.29.0.1/16 dev "$bridge"
  ip link set "$bridge" up
  iptables -t nat -A POSTROUTING -s "$subnet" ! -o "$bridge" -j MASQUERADE
  iptables -I FORWARD -i "$bridge" ! -o "$bridge" -j ACCEPT
  iptables -I FORWARD -o "$bridge" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
  iptables -I FORWARD -s "$pool" -d "$pool" -j ACCEPT
  setsid dockerd --data-root "$dir/data" --exec-root "$dir/exec" --pidfile "$dir/dockerd.pid" \
    -H "unix://$dir/docker.sock" --bridge "$bridge" --iptables=false --ip-masq=false \
    --default-address-pool "base=$pool,size=24" >"$dir/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 60); do
    if DOCKER_HOST="unix://$dir/docker.sock" docker info >/dev/null 2>&1; then
      echo "unix://$dir/docker.sock"
      exit 0
    fi
    sleep 1
  done
  echo "isolated_docker: the daemon did not answer in 60 s; see $dir/dockerd.log" >&2
  exit 1
  ;;
stop)
  export DOCKER_HOST="unix://$dir/docker.sock"
  docker ps -aq 2>/dev/null | xargs -r docker rm -f >/dev/null 2>&1 || true
  if [ -f "$dir/dockerd.pid" ]; then
    kill "$(cat "$dir/dockerd.pid")" 2>/dev/null || true
    for _ in $(seq 30); do [ -e "$dir/dockerd.pid" ] || break; sleep 1; done
  fi
  iptables -t nat -D POSTROUTING -s "$subnet" ! -o "$bridge" -j MASQUERADE 2>/dev/null || true
  iptables -D FORWARD -i "$bridge" ! -o "$bridge" -j ACCEPT 2>/dev/null || true
  iptables -D FORWARD -o "$bridge" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT 2>/dev/null || true
  iptables -D FORWARD -s "$pool" -d "$pool" -j ACCEPT 2>/dev/null || true
  ip link del "$bridge" 2>/dev/null || true
  umount -R "$dir/data" 2>/dev/null || true
  rm -rf "$dir"
  ;;
*)
  echo "isolated_docker: start or stop, not $action" >&2
  exit 64
  ;;
esac
