#!/bin/bash
# `zkServer.sh status` as the compose healthcheck runs it: the node answers "imok" to
# ZooKeeper's ruok command on 127.0.0.1:2181.
set -euo pipefail
[[ ${1:-} == status ]] || { echo "zookeeper stand-in: only 'status' is supported" >&2; exit 2; }
exec 3<>/dev/tcp/127.0.0.1/2181
printf ruok >&3
read -r -t 3 -n 4 answer <&3 || true
[[ ${answer:-} == imok ]] || { echo "zookeeper: no imok (got '${answer:-}')" >&2; exit 1; }
echo "zookeeper: imok"
