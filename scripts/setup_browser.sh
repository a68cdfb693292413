#!/usr/bin/env bash
# Install Debian's Chromium for the browser tests (Playwright drives it through executable_path;
# Playwright's own browser download is never used). Needs root or sudo; a no-op when present.
set -euo pipefail
CHROMIUM="${G4V_CHROMIUM:-/usr/bin/chromium}"
if [[ -x "$CHROMIUM" ]]; then
  exit 0
fi
SUDO=""
if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
echo "Installing Debian's chromium for the browser tests..."
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
"$CHROMIUM" --version
