#!/usr/bin/env bash
# Install what sparkring needs on a fresh Debian 12 machine: OS packages (ZooKeeper,
# PostgreSQL 15, a JRE, docker-compose for config validation, iproute2/iptables for
# partition tests, Chromium and its driver for the console's browser tests) and a
# virtualenv in .venv with the project and its test extras, and the OS user drivers run as
# (sparkring-driver: SPARKRING_DRIVER_USER, docs/drivers.md).
# Idempotent: each step is skipped when its result is already there.
# `bootstrap.sh os` does the OS part alone (packages, the driver user): scripts/test.sh
# starts ZooKeeper and PostgreSQL after it, while the venv is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
part="${1:-all}"
case "$part" in
  all|os) ;;
  *) echo "usage: scripts/bootstrap.sh [os]" >&2; exit 2 ;;
esac

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
need_apt=()
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
[ -f /usr/share/java/log4j-1.2.jar ] || need_apt+=(liblog4j1.2-java)
[ -f /usr/share/java/slf4j-log4j12.jar ] || need_apt+=(libslf4j-java)
[ -x /usr/lib/postgresql/15/bin/initdb ] || need_apt+=(postgresql)
command -v psql >/dev/null || need_apt+=(postgresql-client)
command -v java >/dev/null || need_apt+=(openjdk-17-jre-headless)
command -v docker-compose >/dev/null || need_apt+=(docker-compose)
command -v ip >/dev/null || need_apt+=(iproute2)
command -v iptables >/dev/null || need_apt+=(iptables)
command -v runuser >/dev/null || need_apt+=(util-linux)
command -v useradd >/dev/null || need_apt+=(passwd)
# Browser tests of the web console (tests/integration/test_console_browser.py) drive Debian's Chromium.
command -v chromium >/dev/null || need_apt+=(chromium)
command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: apt-get install ${need_apt[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${need_apt[@]}" >/dev/null
fi

# The user drivers run as: a system user with a group of its own, no login shell, and a
# home for Spark's and Ivy's caches (scripts/stack.py env sets SPARKRING_DRIVER_USER).
if ! id -u sparkring-driver >/dev/null 2>&1; then
  echo "bootstrap: creating the user sparkring-driver" >&2
  $SUDO useradd --system --user-group --create-home --home-dir /var/lib/sparkring-driver \
    --shell /usr/sbin/nologin --comment "sparkring drivers" sparkring-driver
fi

[ "$part" = "os" ] && exit 0

stamp=.venv/.installed-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "bootstrap: creating .venv and installing sparkring[test]" >&2
  [ -x .venv/bin/python ] || python3 -m venv .venv
  # constraints.txt: the exact versions every machine and image installs.
  .venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e ".[test]" 2>&1 \
    | grep -v "^WARNING: Location" || true
  .venv/bin/sparkring --help >/dev/null
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# Drivers run as sparkring-driver with the venv's Python and this checkout's job files:
# every folder on the way must let it pass (search, not read). A Python built under
# /root (pyenv) sits behind a 0700 /root: open the way with o+x, and say so. The server
# refuses to start when the driver user cannot reach its Python (docs/deployment.md).
python_real=$(readlink -f .venv/bin/python)
for target in "$python_real" "$PWD/.venv/bin/python"; do
  dir=$(dirname "$target")
  while [ "$dir" != "/" ]; do
    if [ $(( 0$(stat -c %a "$dir") & 1 )) -eq 0 ]; then
      echo "bootstrap: letting sparkring-driver pass through $dir (chmod o+x)" >&2
      $SUDO chmod o+x "$dir"
    fi
    dir=$(dirname "$dir")
  done
done
