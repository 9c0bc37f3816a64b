#!/usr/bin/env bash
# Sourced by env.sh and py310_env.sh: `find_python 3.13 3.12 3.11` prints the
# path of the first of these Python versions found on this machine (a
# `pythonX.Y` on PATH that runs, else the newest pyenv build of X.Y under
# $PYENV_ROOT or ~/.pyenv), and fails when none is.

find_python() {
  local v exe root cand
  root="${PYENV_ROOT:-$HOME/.pyenv}"
  for v in "$@"; do
    # pyenv builds first: a `pythonX.Y` shim on PATH only runs when that
    # version is the selected one.
    cand=""
    if [ -d "$root/versions" ]; then
      cand="$(ls -d "$root/versions/$v".* 2>/dev/null | grep -E "/$v\.[0-9]+$" | sort -V | tail -1 || true)"
    fi
    if [ -n "$cand" ] && [ -x "$cand/bin/python$v" ] && "$cand/bin/python$v" -c "" 2>/dev/null; then
      echo "$cand/bin/python$v"
      return 0
    fi
    exe="$(command -v "python$v" 2>/dev/null || true)"
    if [ -n "$exe" ] && "$exe" -c "" 2>/dev/null; then
      echo "$exe"
      return 0
    fi
  done
  return 1
}
