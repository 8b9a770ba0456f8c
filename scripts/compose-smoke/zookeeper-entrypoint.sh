#!/bin/bash
# One ZooKeeper node from the official image's variables, in the foreground.
set -euo pipefail
cat >/conf/zoo.cfg <<CFG
tickTime=${ZOO_TICK_TIME:-2000}
initLimit=10
syncLimit=5
dataDir=/data
dataLogDir=/datalog
clientPort=2181
admin.enableServer=${ZOO_ADMINSERVER_ENABLED:-false}
4lw.commands.whitelist=${ZOO_4LW_COMMANDS_WHITELIST:-srvr,ruok}
CFG
exec java -Xmx256m -Dzookeeper.root.logger=INFO,CONSOLE \
  -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar \
  org.apache.zookeeper.server.quorum.QuorumPeerMain /conf/zoo.cfg
