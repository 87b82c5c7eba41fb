# Sourced by e2e/demo.sh and e2e/run-tests.sh, after e2e/packages.sh: the project's virtual
# environment, made once and reused, with exactly the packages the calling command needs. A system
# Python stays untouched: on Debian 12, `pip install` into it is refused (PEP 668, externally
# managed).
#
#   project_venv SPEC...   create ${PSOPERATOR_VENV:-.venv} if missing, install the pip SPECs into
#                          it unless the last install had the same SPECs and pyproject files, and
#                          put it first on PATH.
#
# The installs go through uv (from PyPI, into the environment itself): it downloads in parallel and
# links what its cache (~/.cache/uv) has, so a fresh clone's environment takes seconds, not the
# minute pip takes to unpack TensorFlow again.

UV_VERSION=0.13.8

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
    [ -x "$venv/bin/uv" ] || python -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
    # --system-certs: the machine's CA bundle, as pip uses it (a proxy's CA may be in it).
    uv pip install --quiet --system-certs --python "$venv/bin/python" "$@"
    printf '%s' "$want" > "$stamp"
  fi
}
