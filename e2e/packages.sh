# Sourced by the scripts that need Debian packages (e2e/run-tests.sh, e2e/venv.sh, the cluster and
# image scripts): each installs what it uses, so that either of the README's commands works first on
# a machine with only its prerequisites.
#
#   need_packages PKG...   apt-get install those of PKG that are not installed
#   need_command CMD [PKG] install PKG (CMD's name by default) unless CMD is on PATH, however it came

need_packages() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return
  printf '[packages %s] apt-get install %s\n' "$(date +%T)" "${missing[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

need_command() { command -v "$1" >/dev/null || need_packages "${2:-$1}"; }
