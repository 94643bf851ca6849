# Helpers for the end-to-end tests (sourced). OASES_BIN and OASES_SOURCE_DIR come from CTest.
set -uo pipefail
: "${OASES_BIN:?}" "${OASES_SOURCE_DIR:?}"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FAILURES=0

fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }

# expect_error NAME PATTERN CMD...: CMD must exit 2 with one line on stderr `error: ...` matching PATTERN
expect_error() {
  local name=$1 pattern=$2
  shift 2
  local err
  err=$("$@" 2>&1 >/dev/null)
  local rc=$?
  if [[ $rc -ne 2 ]]; then fail "$name: exit code $rc, expected 2 (stderr: $err)"; return; fi
  if [[ $(printf '%s\n' "$err" | grep -c .) -ne 1 ]]; then fail "$name: expected one line on stderr, got: $err"; return; fi
  if [[ $err != error:* ]]; then fail "$name: stderr does not start with 'error:': $err"; return; fi
  if ! grep -qE -- "$pattern" <<<"$err"; then fail "$name: message does not match /$pattern/: $err"; return; fi
  echo "ok: $name -> $err"
}

finish() {
  if [[ $FAILURES -ne 0 ]]; then echo "$FAILURES failure(s)"; exit 1; fi
  echo "all passed"
  exit 0
}
