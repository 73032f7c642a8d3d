#!/usr/bin/env bash
# Installs Debian's Chromium and its matching chromedriver for the browser tests
# (tests/e2e/test_browser.py), unless both are there already. Root on Debian/Ubuntu; idempotent.
# Prints one line.
set -euo pipefail

CHROMIUM=/usr/bin/chromium
DRIVER=/usr/bin/chromedriver

if [[ -x $CHROMIUM && -x $DRIVER ]]; then
    echo "chromium: present ($("$CHROMIUM" --version 2>/dev/null || echo "version unknown"))"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# `apt-get update` only when the package lists do not know chromium yet (a fresh image).
# apt's output is shown only when a step fails.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! apt-cache show chromium-driver >/dev/null 2>&1; then
    apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
fi
apt-get install -y -qq --no-install-recommends chromium chromium-driver >"$log" 2>&1 \
    || { cat "$log" >&2; exit 1; }
echo "chromium: installed ($("$CHROMIUM" --version 2>/dev/null || echo "version unknown"))"
