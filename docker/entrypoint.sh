#!/bin/sh
# Runs the command as user diffq (uid 1000). Started as root (the default), it first hands
# /data and /cache to that user where they belong to root: a host folder that dockerd created
# for a bind mount is root:root 755, and the workers could not write their images there. A
# folder that already belongs to someone else (the host user) is left alone. Started with
# `--user`, it runs the command as that user unchanged.
set -e
if [ "$(id -u)" = 0 ]; then
  for dir in /data /cache; do
    if [ -d "$dir" ] && [ "$(stat -c %u "$dir")" = 0 ]; then
      chown diffq:diffq "$dir"
    fi
  done
  exec setpriv --reuid=diffq --regid=diffq --init-groups "$@"
fi
exec "$@"
