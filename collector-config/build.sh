#!/usr/bin/env bash
# Build the collector distribution of builder-config.yaml with the machine's Go
# (modules from the Go module proxy) into a cache folder outside the repository.
# Prints the binary's path. Reuses a binary built from the same manifest.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
manifest="$here/builder-config.yaml"
builder_version=v0.165.0
key="$( (cat "$manifest"; echo "$builder_version") | sha256sum | cut -c1-12)"
cache="${OTEL_RL_COLLECTOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-rl/otelcol-$key}"
binary="$cache/otelcol-rl/otelcol-rl"
# One build at a time per cache folder: a second `make test` on the machine waits for the first's binary.
mkdir -p "$(dirname "$cache")"
exec 9>"$cache.lock"
flock 9
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: Go is needed to build the collector" >&2; exit 1; }
mkdir -p "$cache"
export GOBIN="$cache/bin"
if [ ! -x "$GOBIN/builder" ]; then
  go install "go.opentelemetry.io/collector/cmd/builder@$builder_version" >&2
fi
cp "$manifest" "$cache/builder-config.yaml"
(cd "$cache" && "$GOBIN/builder" --config=builder-config.yaml >&2)
echo "$binary"
