# Sourced by e2e/demo.sh and e2e/run-tests.sh, after e2e/packages.sh: the project's virtual
# environment, made once and reused, with exactly the packages the calling command needs. A system
# Python stays untouched: on Debian 12, `pip install` into it is refused (PEP 668, externally
# managed).
#
#   project_venv SPEC...   create ${PSOPERATOR_VENV:-.venv} if missing, install the pip SPECs into
#                          it unless the last install had the same SPECs and pyproject files, and
#                          put it first on PATH.

project_venv() {
  local venv="${PSOPERATOR_VENV:-$PWD/.venv}" stamp want
  if [ ! -x "$venv/bin/python" ]; then
    # Debian ships venv's pip bootstrap apart from python3.
    python3 -c 'import ensurepip, venv' 2>/dev/null || need_packages python3-venv
    python3 -m venv "$venv"
  fi
  export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
  stamp="$venv/.psoperator-installed"
  want="$(printf '%s\n' "$@"; cat pyproject.toml images/trainer/pyproject.toml)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    python -m pip install --quiet --disable-pip-version-check "$@"
    printf '%s' "$want" > "$stamp"
  fi
}
