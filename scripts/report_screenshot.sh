#!/usr/bin/env bash
# Look at an HTML report the way a browser draws it: headless Chromium (the Debian package
# `chromium`; `apt-get install chromium`), offline, with a fresh profile.
#
#   scripts/report_screenshot.sh REPORT.html SHOT.png [WIDTH,HEIGHT]
#
# Writes SHOT.png (the screenshot), SHOT.png.dom.html (the DOM after the page loaded) and
# SHOT.png.log (the browser's log: console messages appear as lines with CONSOLE).
set -euo pipefail
html="$1" shot="$2" size="${3:-1200,3200}"
browser="$(command -v chromium || command -v chromium-browser || true)"
if [[ -z "$browser" ]]; then
  echo "error: chromium not found (Debian: apt-get install chromium)" >&2
  exit 2
fi
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
  --disable-background-networking --disable-component-update --disable-sync
  --user-data-dir="$profile" --hide-scrollbars --enable-logging=stderr --v=0
  --virtual-time-budget=5000)
url="file://$(realpath "$html")"
shot="$(realpath -m "$shot")"
"$browser" "${flags[@]}" --window-size="$size" --screenshot="$shot" "$url" 2> "$shot.log"
"$browser" "${flags[@]}" --dump-dom "$url" > "$shot.dom.html" 2>> "$shot.log"
test -s "$shot" && test -s "$shot.dom.html"
