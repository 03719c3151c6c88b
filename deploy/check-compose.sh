#!/bin/sh
# Does this host's Docker Compose run diffq's compose files? compose.cpu.yaml uses `!reset`, which
# Compose v1 (Debian 12's docker-compose 1.29) and early v2 releases do not know. Prints what it
# found and exits 0 when it is new enough, 1 (with what to install) when not.
#   sh deploy/check-compose.sh
MIN=2.24.0
version=$(docker compose version --short 2>/dev/null | sed 's/^v//')
if [ -z "$version" ]; then
  if command -v docker-compose >/dev/null 2>&1; then
    old=$(docker-compose version --short 2>/dev/null)
    echo "found docker-compose ${old:-?} (Compose v1) but no 'docker compose': diffq needs Docker Compose v$MIN or newer" \
      "(the docker-compose-plugin package, or Docker's own docs: https://docs.docker.com/compose/install/)"
  else
    echo "found no 'docker compose': install Docker Engine with the Compose plugin, v$MIN or newer"
  fi
  exit 1
fi
lowest=$(printf '%s\n%s\n' "$MIN" "$version" | sort -V | head -n 1)
if [ "$lowest" != "$MIN" ]; then
  echo "found Docker Compose $version: diffq's compose.cpu.yaml needs v$MIN or newer (its !reset tag); upgrade the plugin"
  exit 1
fi
echo "found Docker Compose $version: ok (v$MIN or newer)"
