#!/bin/sh
# Runs the command as the user that owns the images: DIFFQ_UID:DIFFQ_GID from .env (yours on the
# host, `id -u` and `id -g`), else the image's user diffq (uid 1000). Started as root (the
# default), it first hands /data to that user where it belongs to root (a host folder that dockerd
# created for a bind mount is root:root 755, and the workers could not write their images there;
# a folder that already belongs to someone, the host user, is left alone) and the /cache volume,
# which is the image's own. Started with `--user`, it runs the command as that user unchanged.
set -e
if [ "$(id -u)" = 0 ]; then
  uid=${DIFFQ_UID:-$(id -u diffq)}
  gid=${DIFFQ_GID:-$(id -g diffq)}
  if [ -d /data ] && [ "$(stat -c %u /data)" = 0 ]; then
    chown "$uid:$gid" /data
  fi
  if [ -d /cache ] && [ "$(stat -c %u:%g /cache)" != "$uid:$gid" ]; then
    chown -R "$uid:$gid" /cache
  fi
  # a uid without an entry in /etc/passwd has no user name, and getpass (torch's compile cache
  # folder is named after the user) fails without one in the environment
  export USER="${USER:-diffq}" LOGNAME="${LOGNAME:-diffq}"
  exec setpriv --reuid="$uid" --regid="$gid" --clear-groups "$@"
fi
exec "$@"
